//! Cheap rejection before expensive work: authentication and the request-count admission come
//! before the body is parsed or tokenized, so a key over its requests per minute is refused for
//! the price of a counter whatever it sends, every request it makes counts (valid or not), and
//! its flood of large bodies does not slow another key down.

use std::time::{Duration, Instant};

use e2e::*;
use futures::StreamExt;
use reqwest::Method;

const MIB: usize = 1024 * 1024;
/// Generous "no hang" bound for the flood; the latencies are benchmark figures.
const NO_HANG: Duration = Duration::from_secs(120);

/// A `/v1/messages` body of about `len` bytes of ordinary text (valid JSON, many tokens).
fn large_body(len: usize) -> Vec<u8> {
    let text = words(len / 5);
    serde_json::to_vec(&message("svc/haiku", &text, 16)).expect("json")
}

/// A free key (5 requests per minute) that has used its minute up.
async fn refused_key(gw: &Gateway) -> ApiKey {
    let key = gw.new_key(0, &KeySpec::tier("free")).await;
    gw.wait_for_roomy_window(&key.secret, 30).await;
    for _ in 0..5 {
        gw.count_tokens(&key.secret, &count_body("svc/haiku", "hi"))
            .await
            .expect_ok();
    }
    key
}

/// A body that is not even JSON: parsed first, it would be a 400.
async fn expect_refused_before_parsing(gw: &Gateway, key: &ApiKey) {
    let mut garbage = vec![b'{'; 15 * MIB];
    garbage[1] = b'x';
    let rb = gw
        .request(Method::POST, "/v1/messages", Some(&key.secret))
        .header("content-type", "application/json")
        .body(garbage);
    gw.send(rb).await.expect_rate_limited("requests");
}

#[tokio::test]
async fn a_key_over_its_rpm_is_refused_with_429_before_its_body_is_parsed() {
    let gw = Gateway::start().await;
    let key = refused_key(&gw).await;
    expect_refused_before_parsing(&gw, &key).await;
}

/// With the limits in Redis, the pod knows from its own admissions that the key's minute is
/// used up, and refuses with no call at all.
#[tokio::test]
async fn with_shared_limits_a_key_the_pod_saw_over_its_rpm_is_refused_before_its_body_is_parsed_with_no_redis_call(
) {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder().serve(&redis.url()).start().await;
    let key = refused_key(&gw).await;
    let admit = [("store", "redis"), ("op", "admit")];
    let calls = gw
        .metrics()
        .await
        .value("gateway_store_call_duration_seconds_count", &admit);
    expect_refused_before_parsing(&gw, &key).await;
    assert_eq!(
        gw.metrics()
            .await
            .value("gateway_store_call_duration_seconds_count", &admit),
        calls,
        "the refusal made no admission call"
    );
}

#[tokio::test]
async fn invalid_requests_count_against_the_keys_rpm() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("free")).await;
    gw.wait_for_roomy_window(&key.secret, 30).await;
    for _ in 0..5 {
        gw.post_messages(&key.secret, &message("svc/nope", "hi", 16))
            .await
            .expect_status(400);
    }
    gw.post_messages(&key.secret, &message("svc/haiku", "hi", 16))
        .await
        .expect_rate_limited("requests");
}

#[tokio::test]
async fn another_key_is_served_while_a_refused_key_floods_15_mib_bodies() {
    let gw = Gateway::start().await;
    let flooder = refused_key(&gw).await;
    let body = large_body(15 * MIB);
    let flood = async {
        futures::stream::iter(0..24)
            .map(|_| {
                let rb = gw
                    .request(Method::POST, "/v1/messages", Some(&flooder.secret))
                    .header("content-type", "application/json")
                    .body(body.clone());
                async { gw.send(rb).await.status }
            })
            .buffer_unordered(8)
            .collect::<Vec<u16>>()
            .await
    };
    let other = async {
        let mut latencies = Vec::new();
        for _ in 0..40 {
            let started = Instant::now();
            gw.get("/v1/models", &gw.key).await.expect_ok();
            latencies.push(started.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        latencies
    };
    let (statuses, mut latencies) =
        tokio::time::timeout(NO_HANG, async { tokio::join!(flood, other) })
            .await
            .expect("the flood and the other key's requests finish");
    assert!(
        statuses.iter().all(|&s| s == 429),
        "every flooded request is refused: {statuses:?}"
    );
    latencies.sort();
    eprintln!(
        "benchmark: GET /v1/models of another key during a flood of 24 x 15 MiB bodies (8 at \
         once) from a refused key: median {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
}
