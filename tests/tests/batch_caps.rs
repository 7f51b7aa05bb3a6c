//! A key's caps on Message Batches, on the real gateway binary: a batch whose requests would
//! take the key's requests queued or running past `--batch-max-queued-items` is refused with
//! the 429 envelope and stores nothing, one that reaches it exactly is taken; an enterprise
//! ApiKey's `batches` caps replace both flags for its key.

use std::path::Path;

use e2e::gateway::{unique_name, workspace_root, ENTERPRISE_KEY};
use e2e::*;
use serde_json::{json, Value};

/// No item runs during the test: the worker looked for items once, at the start, before any
/// batch was created, and looks again a minute later.
fn idle_worker(b: GatewayBuilder) -> GatewayBuilder {
    b.arg("--batch-poll-ms").arg("60000")
}

fn batch(n: usize) -> Value {
    let requests: Vec<Value> = (0..n)
        .map(|i| {
            json!({"custom_id": format!("req-{i}"), "params": {"model": "svc/haiku",
                "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}})
        })
        .collect();
    json!({ "requests": requests })
}

async fn create(gw: &Gateway, key: &str, n: usize) -> Resp {
    gw.post_json("/v1/messages/batches", key, &batch(n)).await
}

fn expect_refused(resp: &Resp, says: &str) {
    resp.expect_status(429);
    let body = resp.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(says), "{message}");
    assert!(resp.header_u64("retry-after") > 0);
}

async fn listed(gw: &Gateway, key: &str) -> usize {
    let list = gw.get("/v1/messages/batches", key).await.expect_ok();
    list["data"].as_array().expect("a list").len()
}

#[tokio::test]
async fn a_batch_past_the_keys_cap_of_queued_items_is_refused_with_429() {
    let gw = idle_worker(Gateway::builder())
        .arg("--batch-max-queued-items")
        .arg("10")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    create(&gw, &key.secret, 6).await.expect_ok();
    expect_refused(
        &create(&gw, &key.secret, 5).await,
        "limit of 10 requests queued or running",
    );
    assert_eq!(
        listed(&gw, &key.secret).await,
        1,
        "a refused batch stores nothing"
    );
    create(&gw, &key.secret, 4).await.expect_ok();
    expect_refused(&create(&gw, &key.secret, 1).await, "limit of 10 requests");
    let other = gw.new_key(1_000_000, &KeySpec::api()).await;
    gw.post_json("/v1/messages/batches", &other.secret, &batch(10))
        .await
        .expect_ok();
}

/// The standalone manifests, the enterprise ApiKey granted `batches` caps.
fn manifests_with_batch_caps(dir: &Path) {
    std::fs::create_dir_all(dir).expect("create the manifest folder");
    let standalone = workspace_root().join("deploy").join("standalone");
    for file in ["tiers.yaml", "models.yaml"] {
        std::fs::copy(standalone.join(file), dir.join(file)).expect("copy a manifest");
    }
    let keys = std::fs::read_to_string(standalone.join("apikeys.yaml")).expect("apikeys.yaml");
    let granted = keys.replacen(
        "  tier: enterprise\n",
        "  tier: enterprise\n  batches:\n    maxInProgress: 4\n    maxQueuedItems: 20\n",
        1,
    );
    assert_ne!(
        granted, keys,
        "the enterprise ApiKey is in the standalone manifests"
    );
    std::fs::write(dir.join("apikeys.yaml"), granted).expect("write apikeys.yaml");
}

#[tokio::test]
async fn an_enterprise_apikey_raises_both_caps_of_its_key() {
    let dir = std::env::temp_dir().join(unique_name("e2e-batch-caps"));
    manifests_with_batch_caps(&dir);
    let gw = idle_worker(Gateway::builder().manifests(&dir))
        .arg("--batch-max-queued-items")
        .arg("5")
        .arg("--batch-max-in-progress")
        .arg("1")
        .start()
        .await;
    // A batch is stored only for an account with credits: the seeded key's has none yet.
    let account = gw.account(ENTERPRISE_KEY).await;
    let id = account["id"].as_str().expect("an account id");
    gw.top_up(id, 1_000, &unique_name("batch-caps-top-up"))
        .await
        .expect_ok();
    // Past both flags, up to the grant's caps: 20 requests queued, 4 batches processing.
    create(&gw, ENTERPRISE_KEY, 8).await.expect_ok();
    create(&gw, ENTERPRISE_KEY, 2).await.expect_ok();
    create(&gw, ENTERPRISE_KEY, 3).await.expect_ok();
    expect_refused(
        &create(&gw, ENTERPRISE_KEY, 8).await,
        "limit of 20 requests",
    );
    create(&gw, ENTERPRISE_KEY, 7).await.expect_ok();
    expect_refused(
        &create(&gw, ENTERPRISE_KEY, 1).await,
        "4 message batches processing",
    );
    assert_eq!(listed(&gw, ENTERPRISE_KEY).await, 4);
    // A key without the grant keeps the flags' caps.
    let plain = gw.new_key(1_000_000, &KeySpec::api()).await;
    expect_refused(&create(&gw, &plain.secret, 8).await, "limit of 5 requests");
    create(&gw, &plain.secret, 5).await.expect_ok();
    expect_refused(
        &create(&gw, &plain.secret, 1).await,
        "1 message batches processing",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
