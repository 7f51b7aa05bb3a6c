//! `/v1/files/{id}/content` streams an upload from the store a range at a time under the memory
//! budget of what is in flight (issue 51, item 5), standalone and `serve` on Postgres: many
//! downloads of one large upload at once add little to the process' peak memory, and an
//! account's downloads held open take their share of the budget, past which the next one gets
//! the budget's 503.

use e2e::*;
use reqwest::Method;

const MIB: usize = 1024 * 1024;

/// `POST /v1/files` of `content` as multipart.
async fn upload(gw: &Gateway, key: &str, content: &str) -> String {
    let boundary = "file-downloads-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n\
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
    file["id"].as_str().expect("an id").to_owned()
}

/// About `bytes` of JSONL: one object a line.
fn jsonl(bytes: usize) -> String {
    let line = format!("{{\"x\": \"{}\"}}\n", "y".repeat(1_000));
    line.repeat(bytes / line.len())
}

/// Sixteen downloads at once of a 15 MiB upload each read whole and equal to it, and the peak
/// memory grows less than 48 MiB past what the upload itself took (a download that copied the
/// file whole held 15 MiB each: 240 MiB).
async fn downloads_at_once_hold_ranges_not_files(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.wait_for_roomy_window(&key.secret, 10).await;
    let content = jsonl(15 * MIB);
    let id = upload(gw, &key.secret, &content).await;
    let before = gw.peak_rss();
    let path = format!("/v1/files/{id}/content");
    let downloads = (0..16).map(|_| async {
        let response = gw
            .request(Method::GET, &path, Some(&key.secret))
            .send()
            .await
            .expect("a download");
        assert_eq!(response.status(), 200);
        response.bytes().await.expect("its body")
    });
    let bodies = futures::future::join_all(downloads).await;
    assert_eq!(bodies.len(), 16);
    for body in &bodies {
        assert!(body.as_ref() == content.as_bytes(), "the upload, whole");
    }
    let grown = gw.peak_rss().saturating_sub(before);
    assert!(
        grown < 48 * MIB as u64,
        "the peak grew {} MiB for 16 downloads",
        grown / MIB as u64
    );
}

#[tokio::test]
async fn standalone_downloads_at_once_hold_ranges_not_files() {
    let gw = Gateway::start().await;
    downloads_at_once_hold_ranges_not_files(&gw).await;
}

#[tokio::test]
async fn in_postgres_downloads_at_once_hold_ranges_not_files() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    downloads_at_once_hold_ranges_not_files(&cluster.pods[0]).await;
}

/// With a 128 MiB budget (a 15 MiB upload takes 60 MiB, within the half one body may hold),
/// one account's downloads of that upload held open (their client reads nothing: the stream
/// waits on the socket) take 2 MiB each, up to the account's share (a quarter of the budget
/// with several bodies): the seventeenth gets the budget's 503 with `Retry-After`, and once
/// they are dropped a download is served again.
#[tokio::test]
async fn downloads_held_open_take_the_accounts_share_of_the_body_budget() {
    let gw = Gateway::builder()
        .arg("--body-memory-budget-mib")
        .arg("128")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.wait_for_roomy_window(&key.secret, 10).await;
    let content = jsonl(15 * MIB);
    let id = upload(&gw, &key.secret, &content).await;
    let path = format!("/v1/files/{id}/content");
    let mut held = Vec::new();
    for _ in 0..16 {
        let response = gw
            .request(Method::GET, &path, Some(&key.secret))
            .send()
            .await
            .expect("a download");
        assert_eq!(response.status(), 200);
        held.push(response);
    }
    let refused = gw
        .send(gw.request(Method::GET, &path, Some(&key.secret)))
        .await;
    refused.expect_status(503);
    assert!(refused.retry_after() >= 1, "{refused}");
    drop(held);
    let mut served = 0;
    // The dropped downloads' streams end as their connections close: a few tries at most.
    for _ in 0..40 {
        let response = gw
            .request(Method::GET, &path, Some(&key.secret))
            .send()
            .await
            .expect("a download");
        if response.status() == 200 {
            let body = response.bytes().await.expect("its body");
            assert!(body.as_ref() == content.as_bytes());
            served += 1;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        served, 1,
        "served again once the held downloads were dropped"
    );
}
