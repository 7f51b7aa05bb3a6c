//! Cluster mode (`gateway serve`): a key's requests-per-minute and input-tokens-per-minute
//! limits hold across two pods sharing one redis-server exactly as if there were one pod.
//!
//! Every test starts its own redis-server (or, in the `on_a_redis_cluster_` tests, a Redis
//! Cluster of three masters and three replicas: the same rules, the keys spread over shards),
//! over TLS only with an ACL user, as managed ones are (`start_tls`; the ones on their own
//! manifests in plaintext),
//! and two pods on the manifests of `tests/cluster-manifests` (see `e2e::cluster`). Counting requests use count_tokens, which is
//! free and counts against RPM like `/v1/messages`, so the seeded accounts need no credits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::cluster::{ENTERPRISE, FREE, PAYG, SEEDED};
use e2e::*;
use futures::StreamExt;

fn hi() -> serde_json::Value {
    count_body("svc/haiku", "hi")
}

/// Expects a 200, with every pod's log in the failure message.
fn expect_ok(cluster: &Cluster<impl SharedRedis>, what: &str, resp: &Resp) -> serde_json::Value {
    assert_eq!(
        resp.status,
        200,
        "{what}: unexpected answer {resp}\n{}",
        cluster.logs()
    );
    resp.json()
}

/// The window hash of a key (`rl:{K}:w`) as a map.
async fn window_hash(redis: &impl SharedRedis, key_id: &str) -> BTreeMap<String, String> {
    redis
        .hgetall(&format!("rl:{{{key_id}}}:w"))
        .await
        .into_iter()
        .collect()
}

#[tokio::test]
async fn across_two_pods_exactly_the_rpm_cap_is_accepted_for_free_payg_and_enterprise_keys() {
    rpm_caps_are_exact_across_pods(&Cluster::start_tls(2, |b| b).await).await;
}

#[tokio::test]
async fn on_a_redis_cluster_across_two_pods_exactly_the_rpm_cap_is_accepted_for_free_payg_and_enterprise_keys(
) {
    rpm_caps_are_exact_across_pods(&Cluster::start_on_redis_cluster_tls(2, |b| b).await).await;
}

async fn rpm_caps_are_exact_across_pods(cluster: &Cluster<impl SharedRedis>) {
    for key in SEEDED {
        // Every request of one key's burst must land in one fixed window.
        cluster.pods[0].wait_for_roomy_window(key.secret, 8).await;
        for (i, pod) in cluster.pods.iter().enumerate() {
            let rl = pod.get("/v1/models", key.secret).await.rate_limit();
            assert_eq!(
                (
                    rl.tier.as_str(),
                    rl.limit_requests,
                    rl.limit_tokens,
                    rl.limit_streams
                ),
                (key.tier, key.rpm, key.tpm, key.streams),
                "pod {i}: limits of {}",
                key.id
            );
            assert_eq!(rl.remaining_requests, key.rpm, "pod {i}: {} unused", key.id);
        }

        // Alternating pods: each answer counts down from the other pod's.
        for n in 1..=key.rpm {
            let pod = cluster.pod(n as usize);
            let resp = pod.count_tokens(key.secret, &hi()).await;
            expect_ok(cluster, &format!("{} request {n}", key.id), &resp);
            let rl = resp.rate_limit();
            assert_eq!(rl.limit_requests, key.rpm);
            assert_eq!(
                rl.remaining_requests,
                key.rpm - n,
                "{}: Remaining-Requests after request {n} (pod {})\n{}",
                key.id,
                n % 2,
                cluster.logs()
            );
        }

        // The cap is reached on both pods: the next request is a 429 whichever pod gets it.
        let mut resets = Vec::new();
        for (i, pod) in cluster.pods.iter().enumerate() {
            let resp = pod.count_tokens(key.secret, &hi()).await;
            resp.expect_rate_limited("requests per minute");
            let rl = resp.rate_limit();
            assert_eq!(rl.remaining_requests, 0, "pod {i}: {}", key.id);
            assert!(
                resp.retry_after() <= rl.reset_requests.max(1),
                "pod {i}: Retry-After {} beyond Reset-Requests {}",
                resp.retry_after(),
                rl.reset_requests
            );
            resets.push(rl.reset_requests);
        }
        // Both pods derive the window from Redis' clock: the same reset (a second may tick
        // between the two answers).
        assert!(
            resets[0].abs_diff(resets[1]) <= 1,
            "{}: Reset-Requests differs between pods: {resets:?}",
            key.id
        );
        // GETs see the same exhausted window on both pods.
        for pod in &cluster.pods {
            let rl = pod.get("/v1/models", key.secret).await.rate_limit();
            assert_eq!(rl.remaining_requests, 0, "{}: GET after the cap", key.id);
        }

        // The shared counter is the one in Redis; rejections did not change it.
        let window = window_hash(&cluster.redis, key.id).await;
        assert_eq!(
            window.get("req").map(String::as_str),
            Some(key.rpm.to_string().as_str()),
            "rl:{{{}}}:w after {} admitted requests and 2 rejected: {window:?}",
            key.id,
            key.rpm
        );
    }
}

#[tokio::test]
async fn concurrent_requests_on_both_pods_are_admitted_exactly_up_to_the_cap() {
    concurrent_requests_are_admitted_exactly_up_to_the_cap(&Cluster::start_tls(2, |b| b).await)
        .await;
}

#[tokio::test]
async fn on_a_redis_cluster_concurrent_requests_on_both_pods_are_admitted_exactly_up_to_the_cap() {
    concurrent_requests_are_admitted_exactly_up_to_the_cap(
        &Cluster::start_on_redis_cluster_tls(2, |b| b).await,
    )
    .await;
}

async fn concurrent_requests_are_admitted_exactly_up_to_the_cap(
    cluster: &Cluster<impl SharedRedis>,
) {
    cluster.pods[0].wait_for_roomy_window(PAYG.secret, 10).await;
    let total = PAYG.rpm as usize + 30;
    let answers: Vec<(u16, Option<u64>)> = futures::stream::iter(0..total)
        .map(|i| {
            let pod = cluster.pod(i);
            async move {
                let resp = pod.count_tokens(PAYG.secret, &hi()).await;
                let remaining = (resp.status == 200).then(|| resp.rate_limit().remaining_requests);
                if resp.status == 429 {
                    resp.expect_rate_limited("requests per minute");
                }
                (resp.status, remaining)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for (status, _) in &answers {
        *statuses.entry(*status).or_default() += 1;
    }
    assert_eq!(
        statuses,
        BTreeMap::from([(200, PAYG.rpm as usize), (429, 30)]),
        "{total} concurrent requests on two pods, cap {}\n{}",
        PAYG.rpm,
        cluster.logs()
    );
    // Each admission saw its own count: every Remaining value from cap-1 down to 0 once.
    let mut remaining: Vec<u64> = answers.iter().filter_map(|(_, r)| *r).collect();
    remaining.sort_unstable();
    let expected: Vec<u64> = (0..PAYG.rpm).collect();
    assert_eq!(
        remaining, expected,
        "Remaining-Requests of the admitted requests"
    );
}

#[tokio::test]
async fn a_retry_after_the_retry_after_of_a_429_succeeds_on_either_pod() {
    let cluster = Cluster::start_tls(2, |b| b).await;
    let (a, b) = (&cluster.pods[0], &cluster.pods[1]);
    // Any window with a few seconds left will do; its end is what the test waits for.
    a.wait_for_roomy_window(FREE.secret, 3).await;
    for n in 1..=FREE.rpm {
        let resp = cluster
            .pod(n as usize)
            .count_tokens(FREE.secret, &hi())
            .await;
        expect_ok(&cluster, &format!("free request {n}"), &resp);
    }
    let rejected = a.count_tokens(FREE.secret, &hi()).await;
    let received = Instant::now();
    let retry_after = rejected.expect_rate_limited("requests per minute");
    let on_b = b.count_tokens(FREE.secret, &hi()).await;
    let retry_after_b = on_b.expect_rate_limited("requests per minute");
    assert!(
        retry_after.abs_diff(retry_after_b) <= 1,
        "Retry-After differs between pods: {retry_after} and {retry_after_b}"
    );

    // Exactly Retry-After seconds after the 429 arrived, the retry (on the other pod) is
    // admitted, in a new window.
    tokio::time::sleep_until((received + Duration::from_secs(retry_after)).into()).await;
    let retry = b.count_tokens(FREE.secret, &hi()).await;
    expect_ok(
        &cluster,
        &format!("the retry {retry_after} s after a 429 with Retry-After {retry_after}"),
        &retry,
    );
    assert_eq!(retry.rate_limit().remaining_requests, FREE.rpm - 1);
    let next = a.count_tokens(FREE.secret, &hi()).await;
    expect_ok(&cluster, "the request after the retry, other pod", &next);
    assert_eq!(next.rate_limit().remaining_requests, FREE.rpm - 2);
}

#[tokio::test]
async fn input_tokens_per_minute_are_shared_across_pods_and_corrected_to_actual_usage() {
    let (mock, manifests) = tpm_upstream().await;
    let cluster = Cluster::start_on(manifests, &[&|b| b, &|b| b]).await;
    input_tokens_are_shared_and_corrected(&cluster).await;
    drop(mock);
}

#[tokio::test]
async fn on_a_redis_cluster_input_tokens_per_minute_are_shared_across_pods_and_corrected_to_actual_usage(
) {
    let (mock, manifests) = tpm_upstream().await;
    let cluster = Cluster::start_on_redis_cluster_with(manifests, 2, |b| b).await;
    input_tokens_are_shared_and_corrected(&cluster).await;
    drop(mock);
}

/// The upstream of the TPM tests: it counts [`ACTUAL_INPUT`] input tokens per turn.
async fn tpm_upstream() -> (MockUpstream, ManifestDir) {
    // The upstream counts a third of the gateway's estimate. Admission counts the estimate, and
    // settling corrects it to the upstream's count, so the minute holds more turns than the
    // estimates alone would let in.
    let reply = Reply::text("ok").usage(MockUsage {
        input: ACTUAL_INPUT,
        output: 2,
        ..MockUsage::default()
    });
    let mock = MockUpstream::serve("127.0.0.1:0", Unscripted::Always(reply), false).await;
    let manifests = ManifestDir::cluster_routed(&[UpstreamDef::anthropic(&mock)]);
    (mock, manifests)
}

const ACTUAL_INPUT: u64 = 5_000;

/// Six turns of about 15,000 tokens by the gateway's count fit under the enterprise key's
/// 50,000 TPM because each is corrected to the upstream's 5,000.
async fn input_tokens_are_shared_and_corrected(cluster: &Cluster<impl SharedRedis>) {
    // Credits are per pod until accounts move to Postgres: fund the enterprise account on each.
    for (i, pod) in cluster.pods.iter().enumerate() {
        let account = pod.account(ENTERPRISE.secret).await;
        let id = account["id"].as_str().expect("account id").to_string();
        let resp = pod.top_up(&id, 1_000, &format!("cluster-tpm-{i}")).await;
        assert!(resp.status < 300, "top-up on pod {i}: {resp}");
        let rl = pod.get("/v1/models", ENTERPRISE.secret).await.rate_limit();
        assert_eq!(
            rl.tier, "enterprise",
            "a top-up must not move a pinned grant"
        );
    }

    // About 15,000 input tokens each by the gateway's count: uncorrected, the fourth would take
    // the minute past 50,000 and the fifth be refused. Corrected, six fit (30,000 counted).
    let body = message("svc/haiku", &words(15_000), 16);
    let turns = 6;
    for n in 0..turns {
        let resp = cluster.pod(n).post_messages(ENTERPRISE.secret, &body).await;
        let reply = expect_ok(cluster, &format!("15k-token message {n}"), &resp);
        assert_eq!(
            reply["usage"]["input_tokens"].as_u64(),
            Some(ACTUAL_INPUT),
            "{reply}"
        );
        if n == 0 {
            // The first admission's headers: what the window counted before any correction.
            let estimate = ENTERPRISE.tpm - resp.rate_limit().remaining_tokens;
            assert!(
                estimate * 4 > ENTERPRISE.tpm && estimate >= 2 * ACTUAL_INPUT,
                "the estimate {estimate} is too close to the upstream's count to tell"
            );
        }
    }

    let counted = ACTUAL_INPUT * turns as u64;
    let window = poll_until(
        "the window's tokens to equal the upstream's input counts",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let window = window_hash(&cluster.redis, ENTERPRISE.id).await;
            (window.get("tok") == Some(&counted.to_string())).then_some(window)
        },
    )
    .await;
    assert_eq!(window.get("req"), Some(&turns.to_string()), "{window:?}");
    for (i, pod) in cluster.pods.iter().enumerate() {
        let rl = pod.get("/v1/models", ENTERPRISE.secret).await.rate_limit();
        assert_eq!(
            rl.remaining_tokens,
            ENTERPRISE.tpm - counted,
            "pod {i}: {rl:?}"
        );
    }
}
