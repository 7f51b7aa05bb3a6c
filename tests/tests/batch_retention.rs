//! A batch's results are kept `--batch-results-days` after its creation, then deleted, on the
//! real gateway binary, standalone and `serve` on Postgres, through both batch APIs: past the
//! retention a Message Batch and an OpenAI batch answer 404 with the envelope, their results
//! and output files too, the lists show neither, while their ledger rows and the balance stay;
//! a batch younger than the retention is kept.

use std::time::{Duration, Instant};

use e2e::*;
use reqwest::Method;
use serde_json::{json, Value};

/// The retention of the test: long enough for a batch to run and be read well inside it.
const RETENTION: Duration = Duration::from_secs(16);

fn retention(b: GatewayBuilder) -> GatewayBuilder {
    let days = RETENTION.as_secs_f64() / 86_400.0;
    b.arg("--batch-results-days")
        .arg(&days.to_string())
        .arg("--batch-poll-ms")
        .arg("50")
}

fn message_batch() -> Value {
    let request = |id: &str| {
        json!({"custom_id": id, "params": {"model": "svc/haiku", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}]}})
    };
    json!({"requests": [request("a"), request("b")]})
}

/// Polls `path` until `done` holds of the batch object, for at most 60 s.
async fn wait_for(gw: &Gateway, key: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let batch = gw.get(path, key).await.expect_ok();
        if done(&batch) {
            return batch;
        }
        assert!(
            Instant::now() < deadline,
            "{path} did not get there: {batch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Message Batch run to its end; the ids of its items' ledger rows.
async fn ended_message_batch(gw: &Gateway, key: &str) -> (String, Vec<String>) {
    let created = gw
        .post_json("/v1/messages/batches", key, &message_batch())
        .await
        .expect_ok();
    let id = created["id"].as_str().expect("id").to_owned();
    let path = format!("/v1/messages/batches/{id}");
    wait_for(gw, key, &path, |b| b["processing_status"] == "ended").await;
    let results = read_results(gw, key, &format!("{path}/results")).await;
    let messages = results
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("a JSON line");
            assert_eq!(line["result"]["type"], "succeeded", "{line}");
            line["result"]["message"]["id"]
                .as_str()
                .expect("a message id")
                .to_owned()
        })
        .collect();
    (id, messages)
}

/// A results file or an output file, 200. Read past the harness's check for provider names:
/// the simulated upstream's replies name it, and results hold them whole.
async fn read_results(gw: &Gateway, key: &str, path: &str) -> String {
    let response = gw
        .request(Method::GET, path, Some(key))
        .send()
        .await
        .expect("a response");
    assert_eq!(response.status(), 200, "{path}");
    response.text().await.expect("a body")
}

/// `POST /v1/files` of a JSONL input, as multipart.
async fn upload(gw: &Gateway, key: &str) -> String {
    let line = |id: &str| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "svc/haiku", "max_tokens": 16,
                     "messages": [{"role": "user", "content": "hi"}]}})
        .to_string()
    };
    let content = format!("{}\n{}\n", line("a"), line("b"));
    let boundary = "retention-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"input.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let rb = gw
        .request(Method::POST, "/v1/files", Some(key))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body);
    let file = gw.send(rb).await.expect_ok();
    file["id"].as_str().expect("file id").to_owned()
}

/// An OpenAI batch run to its end; its output file's id and the ids of its ledger rows.
async fn ended_openai_batch(gw: &Gateway, key: &str) -> (String, String, Vec<String>) {
    let input = upload(gw, key).await;
    let create = json!({"input_file_id": input, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"});
    let created = gw.post_json("/v1/batches", key, &create).await.expect_ok();
    let id = created["id"].as_str().expect("id").to_owned();
    let batch = wait_for(gw, key, &format!("/v1/batches/{id}"), |b| {
        b["status"] == "completed"
    })
    .await;
    let output = batch["output_file_id"]
        .as_str()
        .expect("output file")
        .to_owned();
    let content = read_results(gw, key, &format!("/v1/files/{output}/content")).await;
    let requests = content
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("a JSON line");
            line["response"]["request_id"]
                .as_str()
                .expect("a request id")
                .to_owned()
        })
        .collect();
    (id, output, requests)
}

fn expect_not_found(resp: &Resp) {
    resp.expect_status(404);
    let body = resp.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
}

fn listed(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|b| b["id"].as_str().expect("id").to_owned())
        .collect()
}

async fn listed_batches(gw: &Gateway, key: &str) -> (Vec<String>, Vec<String>) {
    let messages = gw.get("/v1/messages/batches", key).await.expect_ok();
    let openai = gw.get("/v1/batches", key).await.expect_ok();
    (listed(&messages), listed(&openai))
}

async fn past_the_retention_a_batch_is_gone_and_its_ledger_rows_stay(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let started = Instant::now();
    let (old_message, message_rows) = ended_message_batch(gw, &key.secret).await;
    let (old_openai, old_output, openai_rows) = ended_openai_batch(gw, &key.secret).await;
    // Half the retention later, a younger batch of each API: still kept when the old ones go.
    tokio::time::sleep((RETENTION / 2).saturating_sub(started.elapsed())).await;
    let (young_message, _) = ended_message_batch(gw, &key.secret).await;
    let (young_openai, young_output, _) = ended_openai_batch(gw, &key.secret).await;
    gw.wait_settled(&key.account_id).await;
    let balance = gw.balance(&key.secret).await;
    let rows: Vec<Value> = {
        let mut rows = Vec::new();
        for id in message_rows.iter().chain(&openai_rows) {
            rows.push(gw.message_record(id).await);
        }
        rows
    };
    assert_eq!(rows.len(), 4);

    // Polled by retrieving the old batches (lists count against the key's RPM; a retrieve
    // does not), then by their lists.
    let deadline = Instant::now() + Duration::from_secs(60);
    let old = [
        format!("/v1/messages/batches/{old_message}"),
        format!("/v1/batches/{old_openai}"),
    ];
    loop {
        let mut gone = 0;
        for path in &old {
            gone += usize::from(gw.get(path, &key.secret).await.status == 404);
        }
        if gone == old.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the batches past their retention are still there\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Gone to a retrieve, they leave the lists with the next sweep: a list a second.
    loop {
        let (messages, openai) = listed_batches(gw, &key.secret).await;
        if !messages.contains(&old_message) && !openai.contains(&old_openai) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the batches past their retention are still listed: {messages:?} {openai:?}\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // A sweep (every quarter of the retention) later, the younger batches (three quarters of
    // the retention old) are still there.
    let swept_again = started + RETENTION + RETENTION / 4;
    tokio::time::sleep(swept_again.saturating_duration_since(Instant::now())).await;
    let (messages, openai) = listed_batches(gw, &key.secret).await;
    assert_eq!(
        messages,
        std::slice::from_ref(&young_message),
        "the younger batch stays"
    );
    assert_eq!(
        openai,
        std::slice::from_ref(&young_openai),
        "the younger batch stays"
    );

    for path in [
        format!("/v1/messages/batches/{old_message}"),
        format!("/v1/messages/batches/{old_message}/results"),
        format!("/v1/batches/{old_openai}"),
        format!("/v1/files/{old_output}"),
        format!("/v1/files/{old_output}/content"),
    ] {
        expect_not_found(&gw.get(&path, &key.secret).await);
    }
    let files = gw.get("/v1/files", &key.secret).await.expect_ok();
    let files = listed(&files);
    assert!(!files.contains(&old_output), "{files:?}");
    assert!(files.contains(&young_output), "{files:?}");
    let young_results = format!("/v1/messages/batches/{young_message}/results");
    assert_eq!(
        read_results(gw, &key.secret, &young_results)
            .await
            .lines()
            .count(),
        2
    );
    let young_content = format!("/v1/files/{young_output}/content");
    assert_eq!(
        read_results(gw, &key.secret, &young_content)
            .await
            .lines()
            .count(),
        2
    );

    for (before, id) in rows.iter().zip(message_rows.iter().chain(&openai_rows)) {
        let after = gw.message_record(id).await;
        assert_eq!(&after, before, "a ledger row outlives its batch");
    }
    assert_eq!(gw.balance(&key.secret).await, balance);
}

#[tokio::test]
async fn standalone_past_the_retention_a_batch_is_gone_and_its_ledger_rows_stay() {
    let gw = retention(Gateway::builder()).start().await;
    past_the_retention_a_batch_is_gone_and_its_ledger_rows_stay(&gw).await;
}

#[tokio::test]
async fn in_postgres_past_the_retention_a_batch_is_gone_and_its_ledger_rows_stay() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| retention(b.database(&pg.url()))).await;
    past_the_retention_a_batch_is_gone_and_its_ledger_rows_stay(&cluster.pods[0]).await;
}
