//! A batch item whose upstream answers overloaded (529, 429) before any output goes back to
//! the queue instead of ending `errored`, on the real gateway binary against the mock
//! upstream: it runs again later, succeeds, and is billed once.

use std::time::{Duration, Instant};

use e2e::*;
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn an_item_whose_upstream_is_overloaded_runs_again_and_is_billed_once() {
    let mock = MockUpstream::start().await;
    mock.push([Reply::status(529), Reply::status(429)]);
    let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
    let gw = Gateway::builder()
        .manifests(&manifests.path)
        .arg("--batch-poll-ms")
        .arg("50")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let before = gw.balance(&key.secret).await;
    let body = json!({"requests": [{"custom_id": "only", "params": {"model": "svc/haiku",
        "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}}]});
    let created = gw
        .post_json("/v1/messages/batches", &key.secret, &body)
        .await
        .expect_ok();
    let id = created["id"].as_str().expect("id");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let batch = gw
            .get(&format!("/v1/messages/batches/{id}"), &key.secret)
            .await
            .expect_ok();
        if batch["processing_status"] == "ended" {
            assert_eq!(batch["request_counts"]["succeeded"], 1, "{batch}");
            break;
        }
        assert!(Instant::now() < deadline, "the batch did not end: {batch}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        mock.request_count(),
        3,
        "two overloaded answers, then the served one"
    );
    let results = gw
        .request(
            Method::GET,
            &format!("/v1/messages/batches/{id}/results"),
            Some(&key.secret),
        )
        .send()
        .await
        .expect("results")
        .text()
        .await
        .expect("a body");
    let line: Value = serde_json::from_str(results.trim()).expect("one JSON line");
    assert_eq!(line["result"]["type"], "succeeded", "{line}");
    let message = line["result"]["message"]["id"]
        .as_str()
        .expect("message id");
    let row = gw.message_record(message).await;
    assert_eq!(row["batch_id"], id, "{row}");
    let billed = row["billed"].as_i64().expect("billed");
    assert!(billed > 0, "{row}");
    gw.wait_settled(&key.account_id).await;
    assert_eq!(
        before - gw.balance(&key.secret).await,
        billed,
        "billed once, for the served turn"
    );
}
