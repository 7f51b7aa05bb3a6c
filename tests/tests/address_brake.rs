//! The key-guessing brake: `/v1` requests without a valid key are limited per client address
//! (30 a minute by default, as the README documents), shared by every pod through Redis, and
//! every answer to them, 401 and 429 alike, carries the X-RateLimit-* headers of that limit
//! under the tier `unauthenticated`; a valid key is served whatever its address's count. `X-Forwarded-For` names the client only when the peer is
//! a trusted proxy (`--trusted-proxies`).
//!
//! The brake's store keeps one contract in process and in Redis (two pods sharing one
//! redis-server, and a Redis Cluster): the last tests run it on each.

use std::sync::Arc;
use std::time::Duration;

use ::gateway_core::limits::{
    self, AddressBrake, AddressBucket, Dimension, LimitError, MemoryLimiter, RedisLimiter,
    RedisSettings,
};
use e2e::cluster::PAYG;
use e2e::*;
use futures::StreamExt;
use reqwest::Method;

/// The README's default: requests without a valid key per client address and minute.
const DOCUMENTED_PER_MINUTE: u64 = 30;

/// A request to `/v1/models` with a key that does not exist.
async fn guess(gw: &Gateway, n: u64) -> Resp {
    let key = format!("sk-svc-guess-{n:040}");
    gw.get("/v1/models", &key).await
}

/// Expects the 401 of a request without a valid key, with the address limit's headers.
fn expect_unauthenticated(resp: &Resp, limit: u64, remaining: u64, what: &str) {
    resp.expect_error(401, "authentication_error");
    let rl = resp.request_limit();
    assert_eq!(
        (rl.tier.as_str(), rl.limit, rl.remaining),
        ("unauthenticated", limit, remaining),
        "{what}: {resp}"
    );
    assert!((1..=60).contains(&rl.reset), "{what}: reset {}", rl.reset);
}

/// Expects the brake's 429: the envelope naming the limit and a delay, Retry-After within
/// the window, and the headers of the used-up address limit.
fn expect_braked(resp: &Resp, limit: u64, what: &str) {
    let message = resp.expect_error(429, "rate_limit_error");
    assert!(
        message.contains("without a valid API key") && mentions_seconds(&message),
        "{what}: {message}"
    );
    let rl = resp.request_limit();
    assert_eq!(
        (rl.tier.as_str(), rl.limit, rl.remaining),
        ("unauthenticated", limit, 0),
        "{what}: {resp}"
    );
    let retry_after = resp.retry_after();
    assert!(
        (1..=60).contains(&retry_after) && retry_after <= rl.reset.max(1),
        "{what}: Retry-After {retry_after}, reset {}",
        rl.reset
    );
}

#[tokio::test]
async fn a_client_guessing_keys_is_slowed_to_the_documented_rate_on_either_of_two_pods() {
    let cluster = Cluster::start(2, |b| b).await;
    // Every guess of the burst must land in one window.
    cluster.pods[0].wait_for_roomy_window(PAYG.secret, 20).await;
    for n in 1..=DOCUMENTED_PER_MINUTE {
        let resp = guess(cluster.pod(n as usize), n).await;
        expect_unauthenticated(
            &resp,
            DOCUMENTED_PER_MINUTE,
            DOCUMENTED_PER_MINUTE - n,
            &format!("guess {n} on pod {}", n % 2),
        );
    }
    for (i, pod) in cluster.pods.iter().enumerate() {
        let resp = guess(pod, 1_000 + i as u64).await;
        expect_braked(&resp, DOCUMENTED_PER_MINUTE, &format!("pod {i}"));
    }
    // Counted once, in Redis, for the address; refusals changed nothing.
    let window: std::collections::BTreeMap<String, String> = cluster
        .redis
        .hgetall("rl:{ip:127.0.0.1}:w")
        .await
        .into_iter()
        .collect();
    assert_eq!(
        window.get("req").map(String::as_str),
        Some(DOCUMENTED_PER_MINUTE.to_string().as_str()),
        "{window:?}"
    );
    // Until the window ends the address's wrong keys are refused, but a valid key is served
    // on either pod: the address may be a proxy or a NAT other clients share.
    for (i, pod) in cluster.pods.iter().enumerate() {
        let resp = pod.get("/v1/models", PAYG.secret).await;
        assert_eq!(resp.status, 200, "valid key, pod {i}: {resp}");
        assert_eq!(resp.rate_limit().tier, PAYG.tier, "valid key, pod {i}");
        expect_braked(
            &guess(pod, 2_000 + i as u64).await,
            DOCUMENTED_PER_MINUTE,
            &format!("pod {i}, after the valid key"),
        );
    }
}

#[tokio::test]
async fn every_answer_without_a_valid_key_carries_the_address_limits_headers() {
    let gw = Gateway::start().await;
    gw.wait_for_roomy_window(&gw.key, 10).await;
    let body = message("svc/haiku", "hi", 16);
    let requests = [
        (
            "no key",
            gw.request(Method::POST, "/v1/messages", None).json(&body),
        ),
        (
            "Basic instead of Bearer",
            gw.request(Method::POST, "/v1/messages", None)
                .header("authorization", format!("Basic {}", gw.key))
                .json(&body),
        ),
        (
            "unknown bearer key",
            gw.request(Method::GET, "/v1/models", Some("sk-svc-unknown-0000000000")),
        ),
        (
            "unknown x-api-key",
            gw.request(Method::POST, "/v1/chat/completions", None)
                .header("x-api-key", "sk-svc-unknown-0000000000")
                .json(&chat_body("svc/haiku", "hi", Some(16))),
        ),
        (
            "empty x-api-key",
            gw.request(Method::GET, "/v1/account", None)
                .header("x-api-key", ""),
        ),
        ("unknown path", gw.request(Method::GET, "/v1/nope", None)),
    ];
    for (n, (what, rb)) in requests.into_iter().enumerate() {
        let resp = gw.send(rb).await;
        expect_unauthenticated(
            &resp,
            DOCUMENTED_PER_MINUTE,
            DOCUMENTED_PER_MINUTE - 1 - n as u64,
            what,
        );
    }
    // Answers with a valid key carry the key's tier, and do not count for the address.
    let rl = gw.get("/v1/models", &gw.key).await.rate_limit();
    assert_eq!(rl.tier, "pay_as_you_go");
    let resp = guess(&gw, 1).await;
    expect_unauthenticated(
        &resp,
        DOCUMENTED_PER_MINUTE,
        DOCUMENTED_PER_MINUTE - 7,
        "after",
    );
}

/// `GET /v1/models` with a bad key, as if forwarded for `xff`.
async fn guess_from(gw: &Gateway, xff: &str) -> Resp {
    let rb = gw
        .request(Method::GET, "/v1/models", Some("sk-svc-guess-000000000000"))
        .header("x-forwarded-for", xff);
    gw.send(rb).await
}

#[tokio::test]
async fn x_forwarded_for_names_the_client_only_behind_a_trusted_proxy() {
    let behind_proxy = Gateway::builder()
        .arg("--unauthenticated-per-minute")
        .arg("2")
        .arg("--trusted-proxies")
        .arg("10.0.0.0/8,127.0.0.1")
        .start()
        .await;
    behind_proxy
        .wait_for_roomy_window(&behind_proxy.key, 10)
        .await;
    expect_unauthenticated(&guess_from(&behind_proxy, "203.0.113.1").await, 2, 1, "1st");
    expect_unauthenticated(&guess_from(&behind_proxy, "203.0.113.1").await, 2, 0, "2nd");
    expect_braked(&guess_from(&behind_proxy, "203.0.113.1").await, 2, "3rd");
    // Claiming another address to the left of what the trusted proxy saw changes nothing.
    expect_braked(
        &guess_from(&behind_proxy, "198.51.100.7, 203.0.113.1").await,
        2,
        "spoofed hop",
    );
    // Behind two trusted hops, the client is the first untrusted one from the right.
    expect_braked(
        &guess_from(&behind_proxy, "203.0.113.1, 10.1.1.1").await,
        2,
        "two hops",
    );
    // Another client behind the same proxy has its own allowance.
    expect_unauthenticated(
        &guess_from(&behind_proxy, "203.0.113.2").await,
        2,
        1,
        "other",
    );

    // Without trusted proxies the header is the client's own claim and is ignored: every
    // request counts for the peer, whatever it names.
    let direct = Gateway::builder()
        .arg("--unauthenticated-per-minute")
        .arg("2")
        .start()
        .await;
    direct.wait_for_roomy_window(&direct.key, 10).await;
    expect_unauthenticated(
        &guess_from(&direct, "203.0.113.1").await,
        2,
        1,
        "direct 1st",
    );
    expect_unauthenticated(
        &guess_from(&direct, "203.0.113.2").await,
        2,
        0,
        "direct 2nd",
    );
    expect_braked(&guess_from(&direct, "203.0.113.3").await, 2, "direct 3rd");
}

// ----- the brake's store contract, in process and in Redis -----

const CONTRACT_LIMIT: u32 = 5;

fn address(s: &str) -> AddressBucket {
    AddressBucket::of(s.parse().expect("address"))
}

fn brake(limiter: Arc<dyn limits::Limiter>) -> AddressBrake {
    AddressBrake::new("ip", Dimension::Unauthenticated, CONTRACT_LIMIT, limiter)
}

/// Waits until the current minute has `secs` left, so a burst lands in one window.
async fn roomy_window(secs: u64) {
    let (_, left) = limits::current_window();
    if left < secs {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// The contract, on two brakes over one shared store (two pods; in process, one store).
async fn contract(pod_a: &AddressBrake, pod_b: &AddressBrake) {
    roomy_window(15).await;
    // Exactly the limit across both pods, Remaining counting down; then refused on both.
    let guesser = address("203.0.113.9");
    for n in 1..=CONTRACT_LIMIT {
        let pod = if n % 2 == 0 { pod_a } else { pod_b };
        let standing = pod.count(guesser).await.expect("within the limit");
        assert_eq!(standing.per_minute, CONTRACT_LIMIT);
        assert_eq!(standing.snapshot.requests, n, "count after attempt {n}");
    }
    for pod in [pod_a, pod_b] {
        match pod.count(guesser).await {
            Err(LimitError::Exceeded {
                dimension,
                retry_after_secs,
                snapshot,
                ..
            }) => {
                assert_eq!(dimension, Dimension::Unauthenticated);
                assert_eq!(snapshot.requests, CONTRACT_LIMIT);
                assert!((1..=60).contains(&retry_after_secs), "{retry_after_secs}");
            }
            other => panic!("past the limit: {other:?}"),
        }
        assert!(pod.refused(guesser).is_some(), "the refusal is remembered");
    }
    // Another address, and another /64, are untouched; one /64 is one client.
    let v6 = address("2001:db8:0:1::1");
    pod_a
        .count(address("203.0.113.10"))
        .await
        .expect("another address");
    pod_a.count(v6).await.expect("first of the /64");
    let same_64 = pod_b
        .count(address("2001:db8:0:1:ffff::2"))
        .await
        .expect("second of the /64");
    assert_eq!(same_64.snapshot.requests, 2, "one /64 is one client");

    // Concurrent attempts on both pods: exactly the limit admitted.
    roomy_window(10).await;
    let crowd = address("198.51.100.1");
    let admitted = futures::stream::iter(0..CONTRACT_LIMIT * 4)
        .map(|i| async move {
            let pod = if i % 2 == 0 { pod_a } else { pod_b };
            pod.count(crowd).await.is_ok()
        })
        .buffer_unordered(16)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    assert_eq!(admitted, CONTRACT_LIMIT as usize);
}

#[tokio::test]
async fn the_in_process_brake_store_keeps_the_contract() {
    let store: Arc<dyn limits::Limiter> = Arc::new(MemoryLimiter::default());
    let pod = brake(store);
    contract(&pod, &pod).await;
}

#[tokio::test]
async fn the_redis_brake_store_keeps_the_contract_across_two_pods() {
    let redis = RedisServer::start().await;
    let (pod_a, pod_b) = (redis_brake(&redis).await, redis_brake(&redis).await);
    contract(&pod_a, &pod_b).await;
}

#[tokio::test]
async fn the_redis_cluster_brake_store_keeps_the_contract_across_two_pods() {
    let redis = RedisCluster::start().await;
    let (pod_a, pod_b) = (redis_brake(&redis).await, redis_brake(&redis).await);
    contract(&pod_a, &pod_b).await;
}

/// A brake on its own connection to `redis`, as a pod has.
async fn redis_brake(redis: &impl SharedRedis) -> AddressBrake {
    let limiter = RedisLimiter::connect(&RedisSettings {
        url: redis.url(),
        tls: Default::default(),
        timeout: Duration::from_millis(2_000),
        slot_ttl: Duration::from_secs(10),
    })
    .await
    .expect("redis limiter");
    brake(Arc::new(limiter))
}
