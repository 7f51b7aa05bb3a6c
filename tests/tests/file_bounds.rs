//! `/v1/files` held to the bounds of the other surfaces (issue 51, item 2), standalone and
//! `serve` on Postgres: a file name is capped (255 bytes) and counted in the account's file
//! quota with the content; uploads, downloads and lists take the key's requests per minute as
//! `/v1/messages` does, however many arrive at once; a list's page is bounded as the batch
//! lists' are.

use e2e::*;
use reqwest::Method;
use serde_json::json;

/// One JSONL line a batch could run.
fn line() -> String {
    json!({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "svc/haiku", "max_tokens": 8,
                 "messages": [{"role": "user", "content": "hi"}]}})
    .to_string()
}

/// `POST /v1/files` of `content` named `filename`, as multipart.
async fn upload(gw: &Gateway, key: &str, filename: &str, content: &str) -> Resp {
    let boundary = "file-bounds-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
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

fn quota(b: GatewayBuilder) -> GatewayBuilder {
    b.arg("--files-account-max-bytes").arg("1000")
}

/// A name of 256 bytes is refused (400, the envelope, naming the bound) and nothing is kept; a
/// name of 255 is kept, and counted: 600 bytes of content under a 255-byte name leave 145 bytes
/// of a 1,000-byte quota, so a 100-byte upload under another 255-byte name is refused, the
/// same under a 1-byte name kept.
async fn a_file_name_is_capped_and_counted_in_the_quota(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    // A JSON object padded to `bytes`.
    let content = |bytes: usize| format!("{{\"x\": 1}}{}", " ".repeat(bytes - 8));
    let long = "n".repeat(256);
    let message = upload(gw, &key.secret, &long, &content(100))
        .await
        .expect_error(400, "invalid_request_error");
    assert!(message.contains("255"), "{message}");
    let named = "n".repeat(255);
    let first = upload(gw, &key.secret, &named, &content(600))
        .await
        .expect_ok();
    assert_eq!(first["filename"], named.as_str());
    let message = upload(gw, &key.secret, &named, &content(100))
        .await
        .expect_error(400, "invalid_request_error");
    assert!(
        message.contains("1000 bytes"),
        "the quota's refusal: {message}"
    );
    upload(gw, &key.secret, "n", &content(100))
        .await
        .expect_ok();
    let listed = gw.get("/v1/files", &key.secret).await.expect_ok();
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(2), "{listed}");
}

#[tokio::test]
async fn standalone_a_file_name_is_capped_and_counted_in_the_quota() {
    let gw = quota(Gateway::builder()).start().await;
    a_file_name_is_capped_and_counted_in_the_quota(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_file_name_is_capped_and_counted_in_the_quota() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| quota(b.database(&pg.url()))).await;
    a_file_name_is_capped_and_counted_in_the_quota(&cluster.pods[0]).await;
    let kept = pg
        .query_i64("SELECT coalesce(sum(bytes + octet_length(filename)), 0) FROM files")
        .await;
    assert_eq!(kept, 600 + 255 + 100 + 1, "what the account's files hold");
}

/// Twenty uploads at once from a key of 5 requests a minute: five are kept, fifteen get the 429
/// of `/v1/messages` (its envelope and `Retry-After`), and the key's list and download are then
/// refused too; another key of the account lists exactly the five.
async fn uploads_downloads_and_lists_take_the_requests_per_minute(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("free")).await;
    gw.wait_for_roomy_window(&key.secret, 10).await;
    let content = line();
    let uploads = (0..20).map(|_| upload(gw, &key.secret, "in.jsonl", &content));
    let answers = futures::future::join_all(uploads).await;
    let kept: Vec<String> = answers
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.json()["id"].as_str().expect("an id").to_owned())
        .collect();
    let refused: Vec<&Resp> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(
        (kept.len(), refused.len()),
        (5, 15),
        "five of twenty uploads kept, the rest refused"
    );
    refused[0].expect_rate_limited("requests per minute");
    gw.get("/v1/files", &key.secret)
        .await
        .expect_rate_limited("requests per minute");
    gw.get(&format!("/v1/files/{}/content", kept[0]), &key.secret)
        .await
        .expect_rate_limited("requests per minute");
    let other = gw.mint_key(&key.account_id, &KeySpec::api()).await;
    let listed = gw
        .get("/v1/files?limit=100", &other.secret)
        .await
        .expect_ok();
    assert_eq!(
        listed["data"].as_array().map(Vec::len),
        Some(5),
        "only the admitted uploads were kept: {listed}"
    );
}

#[tokio::test]
async fn standalone_uploads_downloads_and_lists_take_the_requests_per_minute() {
    let gw = Gateway::start().await;
    uploads_downloads_and_lists_take_the_requests_per_minute(&gw).await;
}

#[tokio::test]
async fn in_postgres_uploads_downloads_and_lists_take_the_requests_per_minute() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    uploads_downloads_and_lists_take_the_requests_per_minute(&cluster.pods[0]).await;
    assert_eq!(pg.query_i64("SELECT count(*) FROM files").await, 5);
}

/// `GET /v1/files?limit=` takes 1 to 1,000 (the batch lists' bound), 20 by default: 10,000 is a
/// 400 with the envelope, and of 21 uploads the default page holds 20 with `has_more`.
#[tokio::test]
async fn a_file_list_page_is_bounded_as_the_batch_lists() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.wait_for_roomy_window(&key.secret, 10).await;
    for _ in 0..21 {
        upload(&gw, &key.secret, "in.jsonl", &line())
            .await
            .expect_ok();
    }
    gw.get("/v1/files?limit=10000", &key.secret)
        .await
        .expect_invalid(&["limit"]);
    gw.get("/v1/files?limit=1001", &key.secret)
        .await
        .expect_invalid(&["limit"]);
    let page = gw.get("/v1/files", &key.secret).await.expect_ok();
    assert_eq!(page["data"].as_array().map(Vec::len), Some(20), "{page}");
    assert_eq!(page["has_more"], true);
    let all = gw
        .get("/v1/files?limit=1000", &key.secret)
        .await
        .expect_ok();
    assert_eq!(all["data"].as_array().map(Vec::len), Some(21));
}

/// `POST /v1/files` of raw `content` bytes.
async fn upload_bytes(gw: &Gateway, key: &str, content: &[u8]) -> Resp {
    let boundary = "file-bounds-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let rb = gw
        .request(Method::POST, "/v1/files", Some(key))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body);
    gw.send(rb).await
}

/// A batch input file is checked strictly: a line of invalid UTF-8 inside a string, or nested
/// 129 arrays deep, is refused (400, naming its line), while 128 deep is kept.
#[tokio::test]
async fn a_jsonl_upload_is_refused_past_invalid_utf8_or_128_levels_of_nesting() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.wait_for_roomy_window(&key.secret, 10).await;
    let mut invalid = b"{\"x\": 1}\n{\"x\": \"".to_vec();
    invalid.extend_from_slice(&[0xff, 0xfe]);
    invalid.extend_from_slice(b"\"}\n");
    let message = upload_bytes(&gw, &key.secret, &invalid)
        .await
        .expect_error(400, "invalid_request_error");
    assert!(
        message.contains("line 2") && message.contains("UTF-8"),
        "{message}"
    );
    let nested = |depth: usize| {
        format!(
            "{{\"x\": {}1{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    };
    let message = upload_bytes(&gw, &key.secret, nested(129).as_bytes())
        .await
        .expect_error(400, "invalid_request_error");
    assert!(message.contains("128"), "{message}");
    upload_bytes(&gw, &key.secret, nested(128).as_bytes())
        .await
        .expect_ok();
}
