//! What the batch surfaces keep is paid for and bounded (issue 51, item 1), standalone and
//! `serve` on Postgres: an account without credits stores no file and no batch (402, as a turn
//! is refused); a batch's queued requests share the account's quota with its uploads, a
//! request refused at the create holds nothing, and an ended item's params are dropped.

use std::time::Duration;

use e2e::*;
use reqwest::Method;
use serde_json::{json, Value};

/// `POST /v1/files` of `content` as multipart.
async fn upload(gw: &Gateway, key: &str, content: &str) -> Resp {
    let boundary = "batch-storage-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let rb = gw
        .request(Method::POST, "/v1/files", Some(key))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body);
    gw.send(rb).await
}

/// A Message Batch of `n` requests, each with `text` as its prompt; without `max_tokens` (so
/// refused at the create) when `refused`.
fn batch(n: usize, text: &str, refused: bool) -> Value {
    let requests: Vec<Value> = (0..n)
        .map(|i| {
            let mut params = json!({"model": "svc/haiku", "max_tokens": 8,
                "messages": [{"role": "user", "content": text}]});
            if refused {
                params.as_object_mut().map(|p| p.remove("max_tokens"));
            }
            json!({"custom_id": format!("r{i}"), "params": params})
        })
        .collect();
    json!({ "requests": requests })
}

/// Waits (at most 60 s) for the batch to end.
async fn ended(gw: &Gateway, key: &str, id: &str) -> Value {
    for _ in 0..600 {
        let batch = gw
            .get(&format!("/v1/messages/batches/{id}"), key)
            .await
            .expect_ok();
        if batch["processing_status"] == "ended" {
            return batch;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("batch {id} did not end");
}

/// A key of an account without credits: its upload and both APIs' batch creates get 402
/// (`insufficient_quota`, the envelope), and it has nothing listed after.
async fn an_account_without_credits_stores_nothing(gw: &Gateway) -> ApiKey {
    let key = gw.new_key(0, &KeySpec::tier("free")).await;
    gw.wait_for_roomy_window(&key.secret, 10).await;
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "svc/haiku", "max_tokens": 8,
                 "messages": [{"role": "user", "content": "hi"}]}})
    .to_string();
    upload(gw, &key.secret, &line)
        .await
        .expect_error(402, "insufficient_quota");
    gw.post_json("/v1/messages/batches", &key.secret, &batch(3, "hi", true))
        .await
        .expect_error(402, "insufficient_quota");
    let create = json!({"input_file_id": "file-none", "endpoint": "/v1/chat/completions",
        "completion_window": "24h"});
    gw.post_json("/v1/batches", &key.secret, &create)
        .await
        .expect_error(402, "insufficient_quota");
    let batches = gw
        .get("/v1/messages/batches", &key.secret)
        .await
        .expect_ok();
    assert_eq!(batches["data"], json!([]));
    let files = gw.get("/v1/files", &key.secret).await.expect_ok();
    assert_eq!(files["data"], json!([]));
    key
}

#[tokio::test]
async fn standalone_an_account_without_credits_stores_nothing() {
    let gw = Gateway::start().await;
    an_account_without_credits_stores_nothing(&gw).await;
}

#[tokio::test]
async fn in_postgres_an_account_without_credits_stores_nothing() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    an_account_without_credits_stores_nothing(&cluster.pods[0]).await;
    let rows = pg
        .query_i64(
            "SELECT (SELECT count(*) FROM files) + (SELECT count(*) FROM message_batches)
                  + (SELECT count(*) FROM message_batch_items)",
        )
        .await;
    assert_eq!(rows, 0, "nothing stored");
}

fn quota(b: GatewayBuilder) -> GatewayBuilder {
    b.arg("--files-account-max-bytes").arg("4000")
}

/// A 4,000-byte quota: a 3,000-byte upload leaves no room for a queued request of about 1,500
/// bytes (400, the envelope naming the quota), but a batch of requests refused at its create
/// takes none, so a queued one of about 700 bytes fits after it. Once the upload is deleted, a
/// batch of about 3,000 bytes fits, and once it has ended another of the same size does: its
/// ended items hold nothing.
async fn queued_requests_and_uploads_share_the_account_quota(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let big = "b".repeat(1_400);
    let small = "s".repeat(600);
    let file = format!("{{\"x\": \"{}\"}}", "f".repeat(2_991));
    assert_eq!(file.len(), 3_000);
    let file = upload(gw, &key.secret, &file).await.expect_ok();
    let message = gw
        .post_json("/v1/messages/batches", &key.secret, &batch(1, &big, false))
        .await
        .expect_error(400, "invalid_request_error");
    assert!(message.contains("4000 bytes"), "{message}");
    let refused = gw
        .post_json("/v1/messages/batches", &key.secret, &batch(2, &big, true))
        .await
        .expect_ok();
    assert_eq!(refused["request_counts"]["errored"], 2, "{refused}");
    let fits = gw
        .post_json(
            "/v1/messages/batches",
            &key.secret,
            &batch(1, &small, false),
        )
        .await
        .expect_ok();
    ended(gw, &key.secret, fits["id"].as_str().expect("id")).await;
    let file_id = file["id"].as_str().expect("file id");
    gw.send(gw.request(
        Method::DELETE,
        &format!("/v1/files/{file_id}"),
        Some(&key.secret),
    ))
    .await
    .expect_ok();
    let first = gw
        .post_json("/v1/messages/batches", &key.secret, &batch(2, &big, false))
        .await
        .expect_ok();
    let first = ended(gw, &key.secret, first["id"].as_str().expect("id")).await;
    assert_eq!(first["request_counts"]["succeeded"], 2, "{first}");
    gw.post_json("/v1/messages/batches", &key.secret, &batch(2, &big, false))
        .await
        .expect_ok();
}

#[tokio::test]
async fn standalone_queued_requests_and_uploads_share_the_account_quota() {
    let gw = quota(Gateway::builder()).start().await;
    queued_requests_and_uploads_share_the_account_quota(&gw).await;
}

/// On Postgres the rows show it too: no ended item keeps its params.
#[tokio::test]
async fn in_postgres_queued_requests_and_uploads_share_the_account_quota() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| quota(b.database(&pg.url()))).await;
    queued_requests_and_uploads_share_the_account_quota(&cluster.pods[0]).await;
    let kept = pg
        .query_i64(
            "SELECT count(*) FROM message_batch_items
             WHERE state NOT IN ('queued', 'running') AND params <> ''",
        )
        .await;
    assert_eq!(kept, 0, "no ended item keeps its params");
    let ended = pg
        .query_i64("SELECT count(*) FROM message_batch_items WHERE state = 'errored'")
        .await;
    assert_eq!(ended, 2, "the refused items are kept, as results");
}

/// A batch of `/v1/batches` of `file_id`'s requests to `/v1/chat/completions`.
fn openai_batch(file_id: &str) -> Value {
    json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
}

/// The input file of these tests: 20 requests of about 500 bytes each.
fn input_lines() -> String {
    (0..20)
        .map(|i| {
            json!({"custom_id": format!("req-{i}"), "method": "POST",
                "url": "/v1/chat/completions", "body": {"model": "svc/haiku", "max_tokens": 8,
                "messages": [{"role": "user", "content": format!("Question {i} {}", "pad ".repeat(100))}]}})
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits (at most 120 s) for an OpenAI batch to end; its object.
async fn openai_ended(gw: &Gateway, key: &str, id: &str) -> Value {
    for _ in 0..1_200 {
        let batch = gw.get(&format!("/v1/batches/{id}"), key).await.expect_ok();
        if ["completed", "failed", "expired", "cancelled"]
            .contains(&batch["status"].as_str().unwrap_or(""))
        {
            return batch;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("batch {id} did not end");
}

/// Ten batches from one input file refer to its lines instead of each holding a copy (issue
/// 51: ten from one 12 MiB file took 146 MiB), so the account's quota counts the file once:
/// with a quota of one and a half files, all ten are created (a copy of its requests was past
/// the quota at the first). The file cannot be deleted while they run (400 naming it); each
/// batch ends with every request answered in its output file; then the file is deleted.
/// Returns the file's size.
async fn ten_batches_from_one_file_share_its_lines(gw: &Gateway) -> i64 {
    // Enterprise: eleven creates and uploads within the key's requests per minute.
    let key = gw
        .new_key(1_000_000_000, &KeySpec::tier("enterprise"))
        .await;
    let content = input_lines();
    let file = upload(gw, &key.secret, &content).await.expect_ok();
    let file_id = file["id"].as_str().expect("file id");
    let mut ids = Vec::new();
    for n in 0..10 {
        let created = gw
            .post_json("/v1/batches", &key.secret, &openai_batch(file_id))
            .await;
        assert_eq!(created.status, 200, "batch {n}: {}", created.text);
        ids.push(created.json()["id"].as_str().expect("batch id").to_owned());
    }
    let path = format!("/v1/files/{file_id}");
    let refused = gw
        .send(gw.request(Method::DELETE, &path, Some(&key.secret)))
        .await
        .expect_error(400, "invalid_request_error");
    assert!(refused.contains("still in progress"), "{refused}");
    for id in &ids {
        let batch = openai_ended(gw, &key.secret, id).await;
        assert_eq!(batch["status"], "completed", "{batch}");
        assert_eq!(batch["request_counts"]["completed"], 20, "{batch}");
        let output = batch["output_file_id"].as_str().expect("output file");
        // Read unchecked: the built-in simulated upstream names itself in its replies.
        let download = gw
            .request(
                Method::GET,
                &format!("/v1/files/{output}/content"),
                Some(&key.secret),
            )
            .send()
            .await
            .expect("the download");
        let text = Resp::read_unchecked(download).await;
        assert_eq!(text.status, 200, "{}", text.text);
        let mut found: Vec<String> = text
            .text
            .lines()
            .map(|line| {
                let line: Value = serde_json::from_str(line).expect("a JSON line");
                assert_eq!(line["response"]["status_code"], 200, "{line}");
                assert_eq!(
                    line["response"]["body"]["object"], "chat.completion",
                    "{line}"
                );
                line["custom_id"].as_str().expect("custom_id").to_owned()
            })
            .collect();
        found.sort_unstable();
        let mut expected: Vec<String> = (0..20).map(|i| format!("req-{i}")).collect();
        expected.sort_unstable();
        assert_eq!(found, expected, "every request answered once in {id}");
    }
    gw.send(gw.request(Method::DELETE, &path, Some(&key.secret)))
        .await
        .expect_ok();
    content.len() as i64
}

/// A quota of one and a half input files (with its name).
fn one_and_a_half_files(b: GatewayBuilder) -> GatewayBuilder {
    let bytes = input_lines().len() * 3 / 2;
    b.arg("--files-account-max-bytes")
        .arg(&bytes.to_string())
        .arg("--batch-poll-ms")
        .arg("20")
}

#[tokio::test]
async fn standalone_ten_batches_from_one_file_share_its_lines() {
    let gw = one_and_a_half_files(Gateway::builder()).start().await;
    ten_batches_from_one_file_share_its_lines(&gw).await;
}

/// On Postgres the rows show it: while the ten batches are queued, their 200 items hold no
/// bytes of requests; the file's are the only ones.
#[tokio::test]
async fn in_postgres_ten_batches_from_one_file_share_its_lines() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        // Items kept queued (one runs at a time, slowly): the rows read are the create's.
        one_and_a_half_files(b.database(&pg.url()))
            .chunk_delay_ms(1_000)
            .arg("--batch-concurrency")
            .arg("1")
    })
    .await;
    let gw = &cluster.pods[0];
    // Enterprise: eleven creates and uploads within the key's requests per minute.
    let key = gw
        .new_key(1_000_000_000, &KeySpec::tier("enterprise"))
        .await;
    let content = input_lines();
    let file = upload(gw, &key.secret, &content).await.expect_ok();
    let file_id = file["id"].as_str().expect("file id");
    for _ in 0..10 {
        gw.post_json("/v1/batches", &key.secret, &openai_batch(file_id))
            .await
            .expect_ok();
    }
    let items = pg
        .query_i64("SELECT count(*) FROM message_batch_items")
        .await;
    assert_eq!(items, 200);
    let copied = pg
        .query_i64("SELECT coalesce(sum(octet_length(params)), 0)::bigint FROM message_batch_items")
        .await;
    assert_eq!(copied, 0, "no batch holds a copy of the file's requests");
    let files = pg
        .query_i64("SELECT coalesce(sum(bytes), 0)::bigint FROM files")
        .await;
    assert_eq!(files, content.len() as i64);
}

/// The ten batches run on Postgres too, and their output files are right.
#[tokio::test]
async fn in_postgres_ten_batches_from_one_file_run_from_its_lines() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| one_and_a_half_files(b.database(&pg.url()))).await;
    ten_batches_from_one_file_share_its_lines(&cluster.pods[0]).await;
}

/// A file delete racing batch creates that read the file is one decision with them (issue 51):
/// each round, creates of batches from a fresh upload and a delete of it are sent at once. The
/// delete is 200 only if no create was stored (each then 404: the file was deleted before it
/// was stored), else 400 (a batch in progress reads it) and the file stays; every answer is an
/// envelope. Every stored batch ends `completed`, its request read from the file: none reads a
/// deleted file (with the two steps it had, a create stored between the delete's check and
/// its delete ended its item on a missing file).
async fn a_file_delete_racing_batch_creates_leaves_no_batch_reading_a_deleted_file(gw: &Gateway) {
    const ROUNDS: usize = 12;
    const CREATES: usize = 4;
    let line = json!({"custom_id": "only", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "svc/haiku", "max_tokens": 8,
                 "messages": [{"role": "user", "content": "hi"}]}})
    .to_string();
    let (mut deleted, mut kept, mut stored) = (0, 0, Vec::new());
    for round in 0..ROUNDS {
        // A key a round: its creates stay within its requests per minute and batch caps.
        let key = gw
            .new_key(1_000_000_000, &KeySpec::tier("enterprise"))
            .await;
        let file = upload(gw, &key.secret, &line).await.expect_ok();
        let file_id = file["id"].as_str().expect("file id").to_owned();
        let creates = (0..CREATES).map(|_| {
            let (secret, create) = (key.secret.clone(), openai_batch(&file_id));
            async move { gw.post_json("/v1/batches", &secret, &create).await }
        });
        let path = format!("/v1/files/{file_id}");
        let delete = async {
            // Later each round, so that some deletes land while the creates are being stored.
            tokio::time::sleep(Duration::from_millis(round as u64 * 3)).await;
            gw.send(gw.request(Method::DELETE, &path, Some(&key.secret)))
                .await
        };
        let (created, delete) = tokio::join!(futures::future::join_all(creates), delete);
        let mut ok = 0;
        for create in &created {
            if create.status == 200 {
                ok += 1;
                let id = create.json()["id"].as_str().expect("batch id").to_owned();
                stored.push((key.secret.clone(), id));
            } else {
                create.expect_error(404, "not_found_error");
            }
        }
        if delete.status == 200 {
            deleted += 1;
            assert_eq!(
                ok, 0,
                "round {round}: the file was deleted yet a batch reading it was stored"
            );
        } else {
            let refused = delete.expect_error(400, "invalid_request_error");
            assert!(refused.contains("still in progress"), "{refused}");
            assert!(
                ok > 0,
                "round {round}: a delete refused with no batch stored"
            );
            kept += 1;
        }
    }
    assert_eq!(deleted + kept, ROUNDS);
    assert!(
        !stored.is_empty(),
        "no create was stored: the race was not run"
    );
    for (key, id) in &stored {
        let batch = openai_ended(gw, key, id).await;
        assert_eq!(batch["status"], "completed", "{batch}");
        assert_eq!(batch["request_counts"]["completed"], 1, "{batch}");
        assert_eq!(batch["request_counts"]["failed"], 0, "{batch}");
    }
}

#[tokio::test]
async fn standalone_a_file_delete_racing_batch_creates_leaves_no_batch_reading_a_deleted_file() {
    let gw = Gateway::builder()
        .arg("--batch-poll-ms")
        .arg("20")
        .start()
        .await;
    a_file_delete_racing_batch_creates_leaves_no_batch_reading_a_deleted_file(&gw).await;
}

/// On Postgres the decision is the store's: the rows show no item left without its file.
#[tokio::test]
async fn in_postgres_a_file_delete_racing_batch_creates_leaves_no_batch_reading_a_deleted_file() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url()).arg("--batch-poll-ms").arg("20")
    })
    .await;
    a_file_delete_racing_batch_creates_leaves_no_batch_reading_a_deleted_file(&cluster.pods[0])
        .await;
    let unread = pg
        .query_i64(
            "SELECT count(*) FROM message_batch_items i
             WHERE i.line_file_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM files f WHERE f.id = i.line_file_id)
               AND i.state <> 'succeeded'",
        )
        .await;
    assert_eq!(unread, 0, "no item ended unread for its file was gone");
}
