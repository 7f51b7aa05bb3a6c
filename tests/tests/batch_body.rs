//! A Message Batch create's body on the real gateway binary: indexed and parsed a request at a
//! time, so the most requests a batch holds (100,000) are taken at the default memory budget,
//! and a batch may be larger than `/v1`'s 16 MiB cap, up to its own (Anthropic's 256 MiB); the
//! memory budget still bounds what one create holds, its bytes and each of its requests.

use e2e::*;
use serde_json::{json, Value};

/// A batch of `n` one-message requests, each asking `text`.
fn batch(n: usize, text: &str) -> Value {
    let requests: Vec<Value> = (0..n)
        .map(|i| {
            json!({"custom_id": format!("req-{i}"), "params": {"model": "svc/haiku",
                "max_tokens": 32, "messages": [{"role": "user", "content": text}]}})
        })
        .collect();
    json!({ "requests": requests })
}

/// Keeps the items queued: the test reads what the create stored, not the runs.
fn idle(b: GatewayBuilder) -> GatewayBuilder {
    b.chunk_delay_ms(1_000).arg("--batch-concurrency").arg("1")
}

fn expect_queued(created: &Resp, n: u64) {
    let body = created.json();
    assert_eq!(body["type"], "message_batch", "{body}");
    let counts = &body["request_counts"];
    let total: u64 = ["processing", "succeeded", "errored", "canceled", "expired"]
        .iter()
        .map(|k| counts[k].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(total, n, "every request is an item: {counts}");
    assert_eq!(counts["errored"], 0, "{counts}");
}

/// 100,000 one-message requests are 14.8 MB; parsed whole (a map per JSON object) they needed
/// about 600 MiB of the budget and were 413 at its default 256 MiB.
#[tokio::test]
async fn the_most_requests_a_batch_holds_are_taken_at_the_default_memory_budget() {
    let gw = idle(Gateway::builder()).start().await;
    let key = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let body = batch(100_000, "What is the capital of France?");
    let created = gw
        .post_json("/v1/messages/batches", &key.secret, &body)
        .await;
    created.expect_ok();
    expect_queued(&created, 100_000);
}

/// 200 requests of 90,000 characters each: 18 MB, past the 16 MiB of every other `/v1` body.
#[tokio::test]
async fn a_batch_may_be_larger_than_the_v1_body_cap() {
    let gw = idle(Gateway::builder()).start().await;
    let key = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let body = batch(200, &"lorem ipsum ".repeat(7_500));
    assert!(body.to_string().len() > 16 * 1024 * 1024);
    let created = gw
        .post_json("/v1/messages/batches", &key.secret, &body)
        .await;
    created.expect_ok();
    expect_queued(&created, 200);
}

/// With a 32 MiB budget (one body holds at most half of it): 3 MB of tiny requests fit by
/// their bytes (four times them) but not with an item for each of their 100,000 requests, so
/// the create is 413 and stores nothing; a batch of 1,000 requests is taken.
#[tokio::test]
async fn the_memory_budget_counts_each_request_of_a_batch() {
    let gw = idle(Gateway::builder())
        .arg("--body-memory-budget-mib")
        .arg("32")
        .start()
        .await;
    let key = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let tiny: Vec<Value> = (0..100_000)
        .map(|i| json!({"custom_id": format!("r{i}"), "params": {}}))
        .collect();
    let body = json!({ "requests": tiny });
    let bytes = body.to_string().len();
    assert!(
        bytes * 4 < 32 * 1024 * 1024 / 2,
        "{bytes} bytes fit by their size"
    );
    let refused = gw
        .post_json("/v1/messages/batches", &key.secret, &body)
        .await;
    refused.expect_status(413);
    assert_eq!(
        refused.json()["error"]["type"],
        "request_too_large",
        "{}",
        refused.json()
    );
    let listed = gw
        .get("/v1/messages/batches", &key.secret)
        .await
        .expect_ok();
    assert_eq!(listed["data"], json!([]), "no batch was created: {listed}");
    let created = gw
        .post_json("/v1/messages/batches", &key.secret, &batch(1_000, "hi"))
        .await;
    created.expect_ok();
    expect_queued(&created, 1_000);
}
