//! Cluster mode (`gateway serve`) while redis-server is away: fail-closed pods answer 503
//! `api_error` within about the Redis timeout (never a 500, never a hang), fail-open pods keep
//! serving within their share of the limits (the key's limit divided by `--pods`, rounded up),
//! both recover by themselves when Redis returns, each switch is logged, and nothing is billed
//! for a rejected request.
//!
//! Each test runs a steady load of `/v1/messages` on both pods (the dev key, enterprise tier:
//! 1,000 RPM, so the load itself never meets a limit) while it stops or freezes Redis.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e::cluster::{ENTERPRISE, FREE, PAYG};
use e2e::*;

/// A refusal (Redis away) arrives within this, a generous multiple of the Redis timeout (250 ms
/// by default, 300 ms in the freeze test): past it the pod hung. Successful answers have no
/// bound here; speed belongs in the benchmarks.
const NO_HANG: Duration = Duration::from_secs(10);
/// Pause between two requests of one pod's load loop.
const LOAD_PAUSE: Duration = Duration::from_millis(40);
/// Bound on one pod's load loop.
const LOAD_MAX_REQUESTS: usize = 1_000;

/// What a pod logs when it switches to the outage policy, and back.
const UNAVAILABLE: &str = "redis unavailable";
const REACHABLE: &str = "redis reachable again";

const BEFORE: u8 = 0;
const OUTAGE: u8 = 1;
const AFTER: u8 = 2;

/// One answer of the load.
#[derive(Clone, Debug)]
struct Sample {
    pod: usize,
    /// [`BEFORE`], [`OUTAGE`] (sent after Redis was stopped or frozen) or [`AFTER`] (sent after
    /// it was back).
    phase: u8,
    status: u16,
    elapsed: Duration,
    error_type: Option<String>,
    credits: u64,
    has_rate_limit_headers: bool,
    retry_after: Option<String>,
}

/// The load on every pod, and what the test changes under it.
struct Load {
    phase: AtomicU8,
    stop: AtomicBool,
    samples: Mutex<Vec<Sample>>,
}

impl Load {
    fn new() -> Load {
        Load {
            phase: AtomicU8::new(BEFORE),
            stop: AtomicBool::new(false),
            samples: Mutex::new(Vec::new()),
        }
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    fn count(&self, pod: usize, phase: u8, status: u16) -> usize {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.pod == pod && s.phase == phase && s.status == status)
            .count()
    }

    /// One pod's loop: `/v1/messages` with the dev key until told to stop.
    async fn run(&self, pod: usize, gw: &Gateway) {
        let body = message("svc/haiku", "hi", 16);
        for _ in 0..LOAD_MAX_REQUESTS {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let phase = self.phase.load(Ordering::SeqCst);
            let started = Instant::now();
            let resp = gw.post_messages(DEV_KEY, &body).await;
            let elapsed = started.elapsed();
            let json: Option<serde_json::Value> = serde_json::from_str(&resp.text).ok();
            if resp.status != 200 {
                // Whatever the status, it is the error envelope.
                response::assert_envelope(&resp.text);
            }
            let error_type = json
                .as_ref()
                .and_then(|j| j["error"]["type"].as_str())
                .map(str::to_string);
            let credits = if resp.status == 200 {
                credits_of(json.as_ref().expect("a 200 is JSON"))
            } else {
                0
            };
            self.samples.lock().unwrap().push(Sample {
                pod,
                phase,
                status: resp.status,
                elapsed,
                error_type,
                credits,
                has_rate_limit_headers: RateLimit::from_headers(&resp.headers).is_ok(),
                retry_after: resp.header("retry-after"),
            });
            tokio::time::sleep(LOAD_PAUSE).await;
        }
    }
}

/// Runs the load on every pod while `script` runs; stops it when `script` returns.
async fn under_load<F: std::future::Future<Output = ()>>(pods: &[Gateway], load: &Load, script: F) {
    let loops = futures::future::join_all(pods.iter().enumerate().map(|(i, gw)| load.run(i, gw)));
    let script = async {
        script.await;
        load.stop.store(true, Ordering::SeqCst);
    };
    tokio::join!(loops, script);
}

/// Polls (every 50 ms, at most `within`) until `check` holds.
async fn wait_for(
    what: &str,
    within: Duration,
    logs: impl Fn() -> String,
    check: impl Fn() -> bool,
) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each pod's `credits.balance` for the dev key, once nothing is reserved any more.
async fn settled_balances(pods: &[Gateway]) -> Vec<i64> {
    let mut balances = Vec::new();
    for gw in pods {
        let account = poll_until(
            "the dev account's reservations to be settled",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async {
                let account = gw.account(DEV_KEY).await;
                (account["credits"]["reserved"].as_i64() == Some(0)).then_some(account)
            },
        )
        .await;
        balances.push(account["credits"]["balance"].as_i64().expect("balance"));
    }
    balances
}

/// Nothing but the admitted turns was billed: on each pod, the balance dropped by exactly the
/// `credits_consumed` of its 200s.
fn assert_only_admitted_turns_billed(before: &[i64], after: &[i64], samples: &[Sample]) {
    for pod in 0..before.len() {
        let billed: u64 = samples
            .iter()
            .filter(|s| s.pod == pod && s.status == 200)
            .map(|s| s.credits)
            .sum();
        let rejected = samples
            .iter()
            .filter(|s| s.pod == pod && s.status != 200)
            .count();
        assert_eq!(
            before[pod] - after[pod],
            billed as i64,
            "pod {pod}: balance {} -> {}, but its 200s consumed {billed} credits ({rejected} rejected requests must cost nothing)",
            before[pod],
            after[pod]
        );
    }
}

/// Statuses by phase and pod, and the slowest answer, for failure messages and the test log.
fn summary(samples: &[Sample]) -> String {
    let mut counts: BTreeMap<(u8, usize, u16), usize> = BTreeMap::new();
    for s in samples {
        *counts.entry((s.phase, s.pod, s.status)).or_default() += 1;
    }
    let slowest = samples.iter().map(|s| s.elapsed).max().unwrap_or_default();
    let slowest_rejection = samples
        .iter()
        .filter(|s| s.status != 200)
        .map(|s| s.elapsed)
        .max()
        .unwrap_or_default();
    format!(
        "(phase, pod, status) -> count: {counts:?}; slowest answer {slowest:?}, slowest rejection {slowest_rejection:?}"
    )
}

/// The fail-closed rules over the load's samples.
fn assert_fail_closed(samples: &[Sample], logs: &str) {
    let summary = summary(samples);
    eprintln!("fail-closed load: {summary}");
    for s in samples {
        assert!(
            s.status == 200 || s.status == 503,
            "fail-closed pod answered {s:?} (only 200 or 503 allowed)\n{summary}\n{logs}"
        );
        if s.status == 503 {
            assert!(
                s.elapsed < NO_HANG,
                "refused after {:?}: {s:?}\n{summary}",
                s.elapsed
            );
            assert_eq!(
                s.error_type.as_deref(),
                Some("api_error"),
                "503 error.type: {s:?}"
            );
            // A client's backoff has a hint, as with every other 503 of the gateway.
            assert!(s.retry_after.is_some(), "a 503 without Retry-After: {s:?}");
        }
        if s.phase == OUTAGE {
            assert_eq!(
                s.status, 503,
                "a request sent while Redis was away was admitted by a fail-closed pod: {s:?}\n{summary}"
            );
        }
    }
    // Before the outage every pod admitted requests (a 503 there is a request in flight as the
    // outage began, or one whose Redis call ran past the timeout on a loaded machine).
    for pod in 0..2 {
        assert!(
            samples
                .iter()
                .any(|s| s.pod == pod && s.phase == BEFORE && s.status == 200),
            "pod {pod} admitted nothing before the outage\n{summary}\n{logs}"
        );
    }
    // Once a pod has recovered it stays recovered.
    for pod in 0..2 {
        let after: Vec<u16> = samples
            .iter()
            .filter(|s| s.pod == pod && s.phase == AFTER)
            .map(|s| s.status)
            .collect();
        if let Some(first_ok) = after.iter().position(|&st| st == 200) {
            assert!(
                after[first_ok..].iter().all(|&st| st == 200),
                "pod {pod} went back to 503 after recovering: {after:?}"
            );
        }
    }
}

/// How often each pod has logged `line` so far.
fn log_counts(cluster: &Cluster, line: &str) -> Vec<usize> {
    cluster
        .pods
        .iter()
        .map(|gw| gw.stderr().matches(line).count())
        .collect()
}

/// Waits until every pod has logged `line` more often than `before` (one switch, one line).
async fn wait_for_new_log_line(cluster: &Cluster, line: &str, before: &[usize], within: Duration) {
    wait_for(
        &format!("every pod to log {line:?} again (had {before:?})"),
        within,
        || cluster.logs(),
        || {
            log_counts(cluster, line)
                .iter()
                .zip(before)
                .all(|(now, then)| now > then)
        },
    )
    .await;
}

/// Waits until every pod has logged one more switch each way: Redis lost, Redis back.
async fn wait_for_both_switch_lines(cluster: &Cluster, unavailable: &[usize], reachable: &[usize]) {
    wait_for_new_log_line(cluster, UNAVAILABLE, unavailable, Duration::from_secs(30)).await;
    wait_for_new_log_line(cluster, REACHABLE, reachable, Duration::from_secs(30)).await;
}

/// How a test takes Redis away: stopped (connections refused) or frozen with SIGSTOP (the
/// socket stays open and nothing answers, so only the client's timeout helps).
#[derive(Clone, Copy)]
enum Outage {
    Stop,
    Freeze,
}

impl Outage {
    async fn begin(self, redis: &mut RedisServer) {
        match self {
            Self::Stop => redis.stop().await,
            Self::Freeze => redis.freeze(),
        }
    }

    async fn end(self, redis: &mut RedisServer) {
        match self {
            Self::Stop => redis.restart().await,
            Self::Freeze => redis.thaw(),
        }
    }
}

/// Runs load on two fail-closed pods through an outage and checks the rules every outage
/// must keep: 503 within the timeout (never 500, never a hang), recovery by itself, one log
/// line per switch, nothing billed for refused requests. Returns the `GET /v1/account`
/// answers (status, time, body) each pod gave during the outage.
async fn fail_closed_through(mut cluster: Cluster, outage: Outage) -> Vec<(u16, Duration, String)> {
    let before = settled_balances(&cluster.pods).await;
    let unavailable_before = log_counts(&cluster, UNAVAILABLE);
    let reachable_before = log_counts(&cluster, REACHABLE);
    let load = Load::new();
    let mut account_during_outage = Vec::new();
    {
        let Cluster { pods, redis, .. } = &mut cluster;
        let pods: &[Gateway] = pods;
        under_load(pods, &load, async {
            let logs = || summary(&load.samples());
            wait_for(
                "a few answers on each pod before the outage",
                Duration::from_secs(10),
                logs,
                || (0..2).all(|p| load.count(p, BEFORE, 200) >= 3),
            )
            .await;

            outage.begin(redis).await;
            load.phase.store(OUTAGE, Ordering::SeqCst);
            wait_for(
                "503s on each pod while Redis is away",
                Duration::from_secs(10),
                logs,
                || (0..2).all(|p| load.count(p, OUTAGE, 503) >= 5),
            )
            .await;
            // A GET needs no admission: it must not fail badly, nor hang.
            for gw in pods {
                let started = Instant::now();
                let resp = gw.get("/v1/account", DEV_KEY).await;
                account_during_outage.push((resp.status, started.elapsed(), resp.to_string()));
            }

            outage.end(redis).await;
            load.phase.store(AFTER, Ordering::SeqCst);
            wait_for(
                "each pod to admit again after Redis returned",
                Duration::from_secs(20),
                logs,
                || (0..2).all(|p| load.count(p, AFTER, 200) >= 3),
            )
            .await;
        })
        .await;
    }
    let samples = load.samples();
    assert_fail_closed(&samples, &cluster.logs());
    wait_for_both_switch_lines(&cluster, &unavailable_before, &reachable_before).await;
    let after = settled_balances(&cluster.pods).await;
    assert_only_admitted_turns_billed(&before, &after, &samples);
    account_during_outage
}

#[tokio::test]
async fn stopping_redis_makes_fail_closed_pods_answer_503_within_the_timeout_and_they_recover_by_themselves(
) {
    let cluster = Cluster::start_each(&[&|b| b.dev_enterprise(), &|b| {
        b.dev_enterprise().redis_outage("fail-closed")
    }])
    .await;
    let account_during_outage = fail_closed_through(cluster, Outage::Stop).await;
    for (pod, (status, elapsed, resp)) in account_during_outage.iter().enumerate() {
        eprintln!("GET /v1/account on pod {pod} while Redis was away: {resp} after {elapsed:?}");
        assert!(
            *status == 200 || *status == 503,
            "GET /v1/account during the outage on pod {pod}: {resp}"
        );
        if *status == 503 {
            assert!(
                *elapsed < NO_HANG,
                "GET /v1/account refused after {elapsed:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_frozen_redis_makes_fail_closed_pods_answer_503_within_the_timeout_instead_of_hanging() {
    let cluster = Cluster::start(2, |b| b.dev_enterprise().redis_timeout_ms(300)).await;
    fail_closed_through(cluster, Outage::Freeze).await;
}

/// Sends `count_tokens` on `gw` until the first 429; returns how many were admitted.
async fn admitted_until_429(gw: &Gateway, key: &str, at_most: u64) -> (u64, Resp) {
    for admitted in 0..at_most {
        let resp = gw.count_tokens(key, &count_body("svc/haiku", "hi")).await;
        match resp.status {
            200 => continue,
            429 => return (admitted, resp),
            _ => panic!("fail-open pod answered {resp}\n{}", gw.logs()),
        }
    }
    panic!("no 429 within {at_most} requests\n{}", gw.logs());
}

#[tokio::test]
async fn stopping_redis_makes_fail_open_pods_serve_within_their_share_of_the_limits_and_they_recover_by_themselves(
) {
    let mut cluster =
        Cluster::start(2, |b| b.dev_enterprise().redis_outage("fail-open").pods(2)).await;
    // The free key is funded on each pod so that its turns are billed and its 429s can be
    // seen not to be; its tier is pinned by its grant.
    for (i, gw) in cluster.pods.iter().enumerate() {
        let account = gw.account(FREE.secret).await;
        let id = account["id"].as_str().expect("account id").to_string();
        let resp = gw.top_up(&id, 1_000, &format!("cluster-outage-{i}")).await;
        assert!(resp.status < 300, "top-up on pod {i}: {resp}");
    }
    // The local windows are fixed minutes too: the whole outage must fit in one.
    cluster.pods[0].wait_for_roomy_window(FREE.secret, 25).await;
    let before = settled_balances(&cluster.pods).await;
    let unavailable_before = log_counts(&cluster, UNAVAILABLE);
    let reachable_before = log_counts(&cluster, REACHABLE);
    let mut free_before = Vec::new();
    for gw in &cluster.pods {
        free_before.push(gw.balance(FREE.secret).await);
    }
    let load = Load::new();
    let mut free_samples = Vec::new();
    let mut shares = Vec::new();
    {
        let Cluster { pods, redis, .. } = &mut cluster;
        let pods: &[Gateway] = pods;
        under_load(pods, &load, async {
            let logs = || summary(&load.samples());
            wait_for(
                "a few answers on each pod before the outage",
                Duration::from_secs(10),
                logs,
                || (0..2).all(|p| load.count(p, BEFORE, 200) >= 3),
            )
            .await;

            redis.stop().await;
            load.phase.store(OUTAGE, Ordering::SeqCst);
            wait_for(
                "answers on each pod while Redis is away",
                Duration::from_secs(10),
                logs,
                || (0..2).all(|p| load.count(p, OUTAGE, 200) >= 5),
            )
            .await;

            // Each pod admits its share: 7 RPM / 2 pods -> 4, 5 RPM / 2 pods -> 3.
            for (i, gw) in pods.iter().enumerate() {
                let (admitted, rejection) = admitted_until_429(gw, ENTERPRISE.secret, 10).await;
                shares.push((
                    i,
                    "enterprise",
                    admitted,
                    ENTERPRISE.rpm.div_ceil(2),
                    rejection,
                ));
                let body = message("svc/haiku", "hi", 16);
                for _ in 0..FREE.rpm {
                    let resp = gw.post_messages(FREE.secret, &body).await;
                    assert!(
                        resp.status == 200 || resp.status == 429,
                        "free key on fail-open pod {i}: {resp}"
                    );
                    let credits = if resp.status == 200 {
                        credits_of(&resp.json())
                    } else {
                        0
                    };
                    free_samples.push((i, resp.status, credits, resp));
                }
            }

            redis.restart().await;
            load.phase.store(AFTER, Ordering::SeqCst);
            wait_for(
                "both pods to log that Redis is back",
                Duration::from_secs(20),
                logs,
                || {
                    pods.iter()
                        .all(|gw| gw.stderr().contains("redis reachable again"))
                },
            )
            .await;
        })
        .await;
    }

    let samples = load.samples();
    let summary = summary(&samples);
    eprintln!("fail-open load: {summary}");
    for s in &samples {
        assert_eq!(
            s.status,
            200,
            "the load under fail-open: {s:?}\n{summary}\n{}",
            cluster.logs()
        );
        assert!(
            s.has_rate_limit_headers,
            "a fail-open 200 without rate-limit headers: {s:?}"
        );
    }
    for (pod, what, admitted, share, rejection) in &shares {
        assert_eq!(
            admitted, share,
            "pod {pod} admitted {admitted} requests of the {what} key while failing open (its share: {share})\n{}",
            cluster.logs()
        );
        rejection.expect_rate_limited("requests per minute");
    }
    let mut free_admitted = [0u64; 2];
    for (pod, status, _, resp) in &free_samples {
        if *status == 200 {
            free_admitted[*pod] += 1;
        } else {
            resp.expect_rate_limited("requests per minute");
        }
    }
    assert_eq!(
        free_admitted,
        [FREE.rpm.div_ceil(2); 2],
        "free-key messages admitted per fail-open pod (5 RPM / 2 pods, rounded up)"
    );
    wait_for_both_switch_lines(&cluster, &unavailable_before, &reachable_before).await;

    // Nothing billed for the 429s: each pod's free account paid for its 200s only.
    for (pod, gw) in cluster.pods.iter().enumerate() {
        let after = poll_until(
            "the free account's reservations to be settled",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async {
                let account = gw.account(FREE.secret).await;
                (account["credits"]["reserved"].as_i64() == Some(0))
                    .then(|| account["credits"]["balance"].as_i64().expect("balance"))
            },
        )
        .await;
        let billed: u64 = free_samples
            .iter()
            .filter(|(p, ..)| *p == pod)
            .map(|(_, _, credits, _)| credits)
            .sum();
        assert_eq!(
            free_before[pod] - after,
            billed as i64,
            "pod {pod}: the free account paid for more than its admitted turns"
        );
    }
    let after = settled_balances(&cluster.pods).await;
    assert_only_admitted_turns_billed(&before, &after, &samples);

    // Shared again: Redis came back empty, and across both pods exactly the enterprise key's
    // whole cap is admitted (failing open, the pods would admit 4 + 4 = 8).
    cluster.pods[0]
        .wait_for_roomy_window(ENTERPRISE.secret, 5)
        .await;
    for n in 1..=ENTERPRISE.rpm {
        let resp = cluster
            .pod(n as usize)
            .count_tokens(ENTERPRISE.secret, &count_body("svc/haiku", "hi"))
            .await;
        assert_eq!(
            resp.status,
            200,
            "enterprise request {n} after recovery: {resp}\n{}",
            cluster.logs()
        );
        assert_eq!(resp.rate_limit().remaining_requests, ENTERPRISE.rpm - n);
    }
    for gw in &cluster.pods {
        gw.count_tokens(ENTERPRISE.secret, &count_body("svc/haiku", "hi"))
            .await
            .expect_rate_limited("requests per minute");
    }

    // Headers agree with the answer while failing open: a 429 for requests per minute says
    // nothing is left.
    for (pod, what, _, _, rejection) in &shares {
        let rl = rejection.rate_limit();
        assert_eq!(
            rl.remaining_requests,
            0,
            "pod {pod}, {what} key, failing open: a 429 for requests per minute reports {rl:?} \
             (Retry-After {:?}): {rejection}",
            rejection.header("retry-after")
        );
    }
}

#[tokio::test]
async fn a_request_refused_with_503_while_redis_is_frozen_is_not_counted_once_redis_returns() {
    // The admission call times out and the client gets a 503; Redis still holds the call and
    // runs it when it wakes up, a second later (a stall, not a blip: the gateway's deadline
    // is exact to half a round trip). A refused request must not use up the key's minute.
    let mut cluster = Cluster::start(1, |b| b.redis_timeout_ms(200)).await;
    let gw = &cluster.pods[0];
    gw.wait_for_roomy_window(ENTERPRISE.secret, 10).await;
    cluster.redis.freeze();
    let resp = gw
        .count_tokens(ENTERPRISE.secret, &count_body("svc/haiku", "hi"))
        .await;
    resp.expect_error(503, "api_error");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.redis.thaw();
    // Recovery: the next probe (at most a second later) finds Redis again.
    poll_until(
        "the pod to admit again after Redis thawed",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let resp = gw
                .count_tokens(PAYG.secret, &count_body("svc/haiku", "hi"))
                .await;
            (resp.status == 200).then_some(())
        },
    )
    .await;
    let window = cluster
        .redis
        .hgetall(&format!("rl:{{{}}}:w", ENTERPRISE.id))
        .await;
    let rl = gw.get("/v1/models", ENTERPRISE.secret).await.rate_limit();
    assert_eq!(
        rl.remaining_requests, ENTERPRISE.rpm,
        "after one request refused with 503 (and no other), the key's window is {window:?}"
    );
}

/// One slow Redis call (the server stopped for a moment: a busy node, a pause) refuses its own
/// turn only: Redis is taken for down after three failed calls in a row, so the turn sent once
/// Redis answers again is served, not refused for the outage policy's probe interval.
#[tokio::test]
async fn a_single_redis_timeout_refuses_its_own_turn_and_not_the_turns_after_it() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .serve(&redis.url())
        .redis_timeout_ms(200)
        .start()
        .await;
    let body = message("svc/haiku", "hi", 16);
    let turn = || gw.post_messages(DEV_KEY, &body);
    turn().await.expect_ok();

    redis.freeze();
    let refused = turn().await;
    redis.thaw();
    refused.expect_status(503);
    poll_until(
        "redis to answer again",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { redis.command(&["PING"]).await.ok() },
    )
    .await;
    turn().await.expect_ok();
    assert!(
        !gw.logs()
            .contains("rate limiting switches to the outage policy"),
        "one timeout was taken for an outage:\n{}",
        gw.logs()
    );
}
