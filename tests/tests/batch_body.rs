//! A Message Batch create's body on the real gateway binary: parsed as it arrives, each request
//! checked and written as it is read, so a create needs no more of the memory budget than its
//! largest request (and the ids it has seen), whatever its length: the most requests a batch
//! holds (100,000) are taken, and a batch may be larger than `/v1`'s 16 MiB cap and than the
//! budget itself, up to its own cap (Anthropic's 256 MiB). All or nothing: a create refused on
//! its 5,000th request, past the storage quota or cut by its client stores nothing, in
//! standalone and on Postgres.
//!
//! With the old rule (the whole body read under the budget, then indexed) every create here
//! several times the budget was 413 before it was read: each test of such a create fails there.

use std::time::Duration;

use futures::channel::mpsc;
use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde_json::{json, Value};

use e2e::*;

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

/// A budget of 8 MiB: one body holds at most 4 MiB of it.
fn small_budget(b: GatewayBuilder) -> GatewayBuilder {
    b.arg("--body-memory-budget-mib").arg("8")
}

const MIB: usize = 1024 * 1024;
/// About 4 KiB of text: ten thousand requests of it are 40 MiB.
fn text() -> String {
    "lorem ipsum ".repeat(340)
}

/// The JSON of request `i` of a batch asking `text`; a custom_id nobody accepts when `bad`.
fn request(i: usize, text: &str, bad: bool) -> Vec<u8> {
    let custom_id = if bad {
        "not a valid id!".to_owned()
    } else {
        format!("req-{i}")
    };
    json!({"custom_id": custom_id, "params": {"model": "svc/haiku", "max_tokens": 32,
        "messages": [{"role": "user", "content": text}]}})
    .to_string()
    .into_bytes()
}

/// The pieces of a batch body of `n` requests of about 4 KiB each (the one at `bad` invalid),
/// a piece per request: `{"requests": [` first, `]}` last.
fn pieces(n: usize, bad: Option<usize>) -> Vec<Vec<u8>> {
    let text = text();
    let mut pieces = vec![br#"{"requests": ["#.to_vec()];
    for i in 0..n {
        let mut piece = if i == 0 { Vec::new() } else { b",".to_vec() };
        piece.extend(request(i, &text, bad == Some(i)));
        pieces.push(piece);
    }
    pieces.push(b"]}".to_vec());
    pieces
}

async fn post_body(gw: &Gateway, key: &str, body: Vec<u8>) -> Resp {
    gw.send(
        gw.request(Method::POST, "/v1/messages/batches", Some(key))
            .header(CONTENT_TYPE, "application/json")
            .body(body),
    )
    .await
}

/// The account's Message Batches, expected none.
async fn expect_no_batch(gw: &Gateway, key: &str) {
    let listed = gw.get("/v1/messages/batches", key).await.expect_ok();
    assert_eq!(listed["data"], json!([]), "no batch was stored: {listed}");
}

/// Waits until `sql` counts `n` (a refused draft's rows are deleted just after the answer).
async fn until_count(pg: &PostgresServer, sql: &str, n: i64) {
    for _ in 0..200 {
        if pg.query_i64(sql).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(pg.query_i64(sql).await, n, "{sql}");
}

const DRAFT_ROWS: &str = "SELECT count(*) FROM message_batch_drafts";
const STORED_ROWS: &str = "SELECT (SELECT count(*) FROM message_batches)
    + (SELECT count(*) FROM message_batch_items)";

/// 11,000 requests of 4 KiB (44 MiB, five times the budget) are taken, each stored.
async fn a_create_five_times_the_memory_budget_is_taken_whole(gw: &Gateway) {
    let key = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let body = pieces(11_000, None).concat();
    assert!(body.len() > 5 * 8 * MIB, "{} bytes", body.len());
    let created = post_body(gw, &key.secret, body).await;
    created.expect_ok();
    expect_queued(&created, 11_000);
}

#[tokio::test]
async fn standalone_a_create_five_times_the_memory_budget_is_taken_whole() {
    let gw = small_budget(idle(Gateway::builder())).start().await;
    a_create_five_times_the_memory_budget_is_taken_whole(&gw).await;
}

/// On Postgres every request is a row, in order, and no draft row is left.
#[tokio::test]
async fn in_postgres_a_create_five_times_the_memory_budget_is_taken_whole() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| small_budget(idle(b.database(&pg.url())))).await;
    a_create_five_times_the_memory_budget_is_taken_whole(&cluster.pods[0]).await;
    let in_order = pg
        .query_i64("SELECT count(*) FROM message_batch_items WHERE custom_id = 'req-' || idx")
        .await;
    assert_eq!(in_order, 11_000, "every request stored, in order");
    assert_eq!(pg.query_i64(DRAFT_ROWS).await, 0, "the draft was moved");
}

/// With 16 MiB of budget (8 MiB for one body): 100,000 tiny requests (3 MB) are taken, as
/// they were not when the whole body and an item for each were held at once (38 MB); one
/// request of 5 MiB alone is more than a body may hold (413) and nothing is stored.
#[tokio::test]
async fn the_memory_budget_bounds_one_request_of_a_batch_not_their_number() {
    let gw = idle(Gateway::builder())
        .arg("--body-memory-budget-mib")
        .arg("16")
        .start()
        .await;
    let key = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let tiny: Vec<Value> = (0..100_000)
        .map(|i| json!({"custom_id": format!("r{i}"), "params": {}}))
        .collect();
    let created = gw
        .post_json(
            "/v1/messages/batches",
            &key.secret,
            &json!({ "requests": tiny }),
        )
        .await
        .expect_ok();
    assert_eq!(created["request_counts"]["errored"], 100_000, "{created}");
    let other = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let huge = batch(2, &"x".repeat(5 * MIB));
    let refused = gw
        .post_json("/v1/messages/batches", &other.secret, &huge)
        .await;
    refused.expect_status(413);
    assert_eq!(refused.json()["error"]["type"], "request_too_large");
    expect_no_batch(&gw, &other.secret).await;
}

/// 40 MiB whose request 5,000 has an invalid custom_id: 400 naming it, after 20 MiB of
/// requests were checked and written; and 40 MiB past a 24 MiB storage quota: its 400 as
/// soon as the quota is passed. Neither stores anything, nor takes any of the quota: a
/// 20 MiB batch fits after them.
async fn a_create_refused_midway_stores_nothing(gw: &Gateway) {
    let key = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let message = post_body(gw, &key.secret, pieces(10_000, Some(5_000)).concat())
        .await
        .expect_error(400, "invalid_request_error");
    assert!(message.starts_with("requests[5000].custom_id"), "{message}");
    expect_no_batch(gw, &key.secret).await;
    let message = post_body(gw, &key.secret, pieces(10_000, None).concat())
        .await
        .expect_error(400, "invalid_request_error");
    assert!(
        message.contains(&format!("{} bytes", 24 * MIB)),
        "{message}"
    );
    expect_no_batch(gw, &key.secret).await;
    let created = post_body(gw, &key.secret, pieces(5_000, None).concat()).await;
    created.expect_ok();
    expect_queued(&created, 5_000);
}

fn quota(b: GatewayBuilder) -> GatewayBuilder {
    b.arg("--files-account-max-bytes")
        .arg(&(24 * MIB).to_string())
}

#[tokio::test]
async fn standalone_a_create_refused_midway_stores_nothing() {
    let gw = quota(small_budget(idle(Gateway::builder()))).start().await;
    a_create_refused_midway_stores_nothing(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_create_refused_midway_stores_nothing() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| quota(small_budget(idle(b.database(&pg.url()))))).await;
    a_create_refused_midway_stores_nothing(&cluster.pods[0]).await;
    until_count(&pg, DRAFT_ROWS, 0).await;
    let items = pg
        .query_i64("SELECT count(*) FROM message_batch_items")
        .await;
    assert_eq!(items, 5_000, "only the batch that fitted is stored");
}

/// Where a body sent as it is made takes its pieces.
type Pieces = mpsc::Sender<Result<Vec<u8>, std::io::Error>>;
/// A request's answer once it is sent.
type Answer = tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>>;

/// A create whose body is sent as it is made: the sender, and the answer once it is all in.
fn streamed_create(gw: &Gateway, key: &str) -> (Pieces, Answer) {
    let (sender, receiver) = mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    let request = gw
        .request(Method::POST, "/v1/messages/batches", Some(key))
        .header(CONTENT_TYPE, "application/json")
        .body(reqwest::Body::wrap_stream(receiver));
    (sender, tokio::spawn(request.send()))
}

async fn send_all(sender: &mut Pieces, pieces: &[Vec<u8>]) {
    for piece in pieces {
        futures::SinkExt::send(sender, Ok(piece.clone()))
            .await
            .expect("the request is still being sent");
    }
}

/// A client that sends half of a 40 MiB create and hangs up: nothing is stored (on Postgres,
/// the requests written to the draft while it came are deleted), and its account's next
/// create is its only batch.
async fn a_create_cut_by_its_client_stores_nothing(gw: &Gateway, pg: Option<&PostgresServer>) {
    let key = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let pieces = pieces(10_000, None);
    let (mut sender, answer) = streamed_create(gw, &key.secret);
    send_all(&mut sender, &pieces[..5_000]).await;
    if let Some(pg) = pg {
        // Written as they came: the draft holds rows before the client hangs up.
        for _ in 0..400 {
            if pg.query_i64(DRAFT_ROWS).await > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            pg.query_i64(DRAFT_ROWS).await > 0,
            "requests written as they came"
        );
    }
    futures::SinkExt::send(
        &mut sender,
        Err(std::io::Error::other("the client hangs up")),
    )
    .await
    .expect("the request is still being sent");
    drop(sender);
    let cut = answer.await.expect("the request task");
    assert!(
        cut.is_err(),
        "the request was cut: {:?}",
        cut.map(|r| r.status())
    );
    if let Some(pg) = pg {
        until_count(pg, DRAFT_ROWS, 0).await;
        assert_eq!(pg.query_i64(STORED_ROWS).await, 0, "nothing stored");
    }
    expect_no_batch(gw, &key.secret).await;
    let created = post_body(gw, &key.secret, pieces_of(3)).await.expect_ok();
    let listed = gw
        .get("/v1/messages/batches", &key.secret)
        .await
        .expect_ok();
    let ids: Vec<&Value> = listed["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|b| &b["id"])
        .collect();
    assert_eq!(ids, [&created["id"]], "{listed}");
}

fn pieces_of(n: usize) -> Vec<u8> {
    pieces(n, None).concat()
}

#[tokio::test]
async fn standalone_a_create_cut_by_its_client_stores_nothing() {
    let gw = small_budget(idle(Gateway::builder())).start().await;
    a_create_cut_by_its_client_stores_nothing(&gw, None).await;
}

#[tokio::test]
async fn in_postgres_a_create_cut_by_its_client_stores_nothing() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| small_budget(idle(b.database(&pg.url())))).await;
    a_create_cut_by_its_client_stores_nothing(&cluster.pods[0], Some(&pg)).await;
}

/// With a 16 MiB budget, while 20 MiB of a 40 MiB create are in: another account's turn of
/// 1 MiB is served (200), and the create then ends whole.
#[tokio::test]
async fn another_accounts_1_mib_turn_is_served_while_a_large_create_streams_in() {
    let gw = Gateway::builder()
        .arg("--body-memory-budget-mib")
        .arg("16")
        .arg("--batch-concurrency")
        .arg("1")
        .start()
        .await;
    let creator = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let other = gw.new_key(1_000_000_000, &KeySpec::api()).await;
    let pieces = pieces(10_000, None);
    let (mut sender, answer) = streamed_create(&gw, &creator.secret);
    send_all(&mut sender, &pieces[..5_000]).await;
    let text = format!("hello{}", " ".repeat(123)).repeat(8 * 1024);
    let turn = json!({"model": "svc/haiku", "max_tokens": 16,
        "messages": [{"role": "user", "content": text}]});
    assert!(turn.to_string().len() >= MIB);
    gw.post_messages(&other.secret, &turn).await.expect_ok();
    send_all(&mut sender, &pieces[5_000..]).await;
    drop(sender);
    let created = Resp::read(answer.await.expect("the request task").expect("sent")).await;
    created.expect_ok();
    expect_queued(&created, 10_000);
}
