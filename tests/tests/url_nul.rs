//! A NUL byte (`%00`) in a `/v1` id or query value, or U+0000 in a request the Responses API
//! would store, is the request's fault: a 400 in the envelope before any store is asked or any
//! turn run, standalone and `serve` on Postgres (which refuses the byte in text and jsonb, an
//! error that read as an outage: 503 "retry with backoff", after the turn was billed). An
//! upstream's output holding one is stored with U+FFFD in its place. The same for a batch's
//! metadata and the dashboard's form fields.

use e2e::cluster::ManifestDir;
use e2e::upstream::{MockUpstream, Reply, UpstreamDef};
use e2e::visitor::{new_email, Visitor};
use e2e::*;
use serde_json::{json, Value};

async fn a_nul_byte_in_an_id_or_a_query_is_a_400(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    for path in [
        "/v1/responses/resp_%00x",
        "/v1/responses/resp_x%00/input_items",
        "/v1/files/file-%00",
        "/v1/messages/batches/msgbatch_%00",
        "/v1/batches/batch_%00",
        "/v1/files?after=file-%00",
        "/v1/messages/batches?after_id=msgbatch_%00",
    ] {
        let message = gw
            .get(path, &key.secret)
            .await
            .expect_error(400, "invalid_request_error");
        assert!(message.contains("NUL"), "{path}: {message}");
    }
}

#[tokio::test]
async fn standalone_a_nul_byte_in_an_id_or_a_query_is_a_400() {
    let gw = Gateway::start().await;
    a_nul_byte_in_an_id_or_a_query_is_a_400(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_nul_byte_in_an_id_or_a_query_is_a_400() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_nul_byte_in_an_id_or_a_query_is_a_400(&cluster.pods[0]).await;
}

/// Responses bodies holding U+0000 where it would be stored or looked up: refused (400, the
/// envelope) before the turn, so nothing is billed; the same prompt with `store: false` is a
/// prompt like any other, served.
async fn a_nul_in_a_stored_responses_request_is_a_400_before_the_turn(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let nul = "a\u{0}b";
    for body in [
        json!({"model": "svc/haiku", "input": nul}),
        json!({"model": "svc/haiku", "input": nul, "store": true}),
        json!({"model": "svc/haiku", "input": "hi", "instructions": nul}),
        json!({"model": "svc/haiku", "input": "hi", "metadata": {"k": nul}}),
        json!({"model": "svc/haiku", "input": "hi", "metadata": {nul: "v"}}),
        json!({"model": "svc/haiku", "input": "hi", "store": false, "previous_response_id": nul}),
    ] {
        let message = gw
            .post_json("/v1/responses", &key.secret, &body)
            .await
            .expect_error(400, "invalid_request_error");
        assert!(message.contains("NUL"), "{body}: {message}");
    }
    assert_eq!(
        gw.balance(&key.secret).await,
        before,
        "a refused request was billed"
    );
    let served = gw
        .post_json(
            "/v1/responses",
            &key.secret,
            &json!({"model": "svc/haiku", "input": nul, "store": false}),
        )
        .await
        .expect_ok();
    assert_eq!(served["status"], "completed", "{served}");
    assert!(
        gw.balance(&key.secret).await < before,
        "the served turn was billed"
    );
}

#[tokio::test]
async fn standalone_a_nul_in_a_stored_responses_request_is_a_400_before_the_turn() {
    let gw = Gateway::start().await;
    a_nul_in_a_stored_responses_request_is_a_400_before_the_turn(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_nul_in_a_stored_responses_request_is_a_400_before_the_turn_and_bills_nothing(
) {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_nul_in_a_stored_responses_request_is_a_400_before_the_turn(&cluster.pods[0]).await;
    assert_eq!(
        pg.query("SELECT count(*) FROM messages").await.trim(),
        "1",
        "only the turn with `store: false` ran"
    );
}

/// An upstream's output holding U+0000 is answered as the upstream gave it and stored with
/// U+FFFD in its place (Postgres keeps no NUL in jsonb), never a 503 after the turn was billed.
#[tokio::test]
async fn in_postgres_an_output_holding_a_nul_is_stored_with_a_replacement_character() {
    let pg = PostgresServer::start().await;
    let mock = MockUpstream::start().await;
    let manifests = ManifestDir::cluster_routed(&[UpstreamDef::anthropic(&mock)]);
    let database = |b: GatewayBuilder| b.database(&pg.url());
    let cluster = Cluster::start_on(manifests, &[&database]).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    mock.push([Reply::text("before\u{0}after")]);
    let answered = gw
        .post_json(
            "/v1/responses",
            &key.secret,
            &json!({"model": "svc/sonnet", "input": "hi"}),
        )
        .await
        .expect_ok();
    let text = |response: &Value| response["output"][0]["content"][0]["text"].clone();
    assert_eq!(text(&answered), "before\u{0}after", "{answered}");
    let id = answered["id"].as_str().expect("an id");
    let stored = gw
        .get(&format!("/v1/responses/{id}"), &key.secret)
        .await
        .expect_ok();
    assert_eq!(text(&stored), "before\u{FFFD}after", "{stored}");
}

/// A batch's metadata holding U+0000 is a 400 naming it (was 503 "retry with backoff" on
/// Postgres, which keeps no NUL in jsonb); nothing is created.
#[tokio::test]
async fn in_postgres_a_nul_in_a_batchs_metadata_is_a_400_and_no_batch_is_created() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "svc/haiku", "max_tokens": 8,
                 "messages": [{"role": "user", "content": "hi"}]}});
    let boundary = "url-nul-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{line}\r\n--{boundary}--\r\n"
    );
    let upload = gw
        .request(reqwest::Method::POST, "/v1/files", Some(&key.secret))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body);
    let file = gw.send(upload).await.expect_ok()["id"].clone();
    for metadata in [json!({"k": "a\u{0}b"}), json!({"a\u{0}b": "v"})] {
        let create = json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
            "completion_window": "24h", "metadata": metadata});
        let message = gw
            .post_json("/v1/batches", &key.secret, &create)
            .await
            .expect_error(400, "invalid_request_error");
        assert!(message.contains("NUL"), "{metadata}: {message}");
    }
    let listed = gw.get("/v1/batches", &key.secret).await.expect_ok();
    assert_eq!(
        listed["data"],
        json!([]),
        "a refused batch was created: {listed}"
    );
}

/// A dashboard form field holding U+0000 is a 400 page saying so (was a 503 "something went
/// wrong" on Postgres, which keeps no NUL in text); nothing is kept.
#[tokio::test]
async fn in_postgres_a_nul_in_a_dashboard_form_is_a_400_and_nothing_is_kept() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    let mut visitor = Visitor::new(gw);
    visitor.sign_up(&new_email(), &[]).await;
    let (status, page) = visitor.create_key("my\u{0}key").await;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("NUL"), "{page}");
    let (status, page) = visitor.create_key("my key").await;
    assert_eq!(status, 200, "the same form without the NUL: {page}");
    let (_, keys) = visitor.get("/developers/keys").await;
    assert!(keys.contains("my key"), "{keys}");
    assert!(
        !keys.contains("my\u{FFFD}key") && !keys.contains("mykey"),
        "{keys}"
    );
}
