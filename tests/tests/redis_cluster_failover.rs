//! Cluster mode on a Redis Cluster (three masters, three replicas) while the master holding a
//! key's counters changes under load: a coordinated `CLUSTER FAILOVER` (maintenance) and a
//! killed master (a crash, its replica elected after the node timeout).
//!
//! Two fail-closed pods (the default `--redis-outage`) count the pay-as-you-go key (60 RPM)
//! with `count_tokens` from both pods while the test moves the key's shard. The rules:
//! - every answer is 200, 429 or 503 in the error envelope, none slower than [`NO_HANG`];
//! - the RPM cap holds: never more than 60 admitted in the minute; after a coordinated
//!   failover exactly 60, and after a crash at least 60 minus the requests refused with 503
//!   (a request whose answer was lost in the crash may have counted: the documented direction
//!   is fewer admissions, never more);
//! - recovery is automatic: each pod admits (or refuses with 429, which also needs Redis) again
//!   without a restart, and does not fall back to 503 once it has.
//!
//! Each test prints what the clients saw, phase by phase.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e::cluster::PAYG;
use e2e::*;

/// An answer slower than this is a hang: a fail-closed refusal comes within about the Redis
/// timeout ([`REDIS_TIMEOUT_MS`]). Speed itself belongs in the benchmarks.
const NO_HANG: Duration = Duration::from_secs(10);
/// The pods' bound on a Redis call: roomier than the default 250 ms, so that a loaded test
/// machine does not turn a slow answer (counted, but too late) into a 503 that spoils the count.
const REDIS_TIMEOUT_MS: u64 = 1_000;
/// Pause between two requests of one client.
const PAUSE: Duration = Duration::from_millis(30);
/// Admissions before the shard is moved.
const ADMITTED_BEFORE: usize = 20;
/// Seconds the key's window must still have left when the load starts, so the whole run
/// (failover included) counts in one window.
const WINDOW_MARGIN_SECS: u64 = 30;
/// How long the pods may take to follow the new master, at most: the cluster's node timeout
/// and a slot-map refresh are seconds; the rest is room for a loaded 2-core machine.
const RECOVERY: Duration = Duration::from_secs(90);

const BEFORE: u8 = 0;
const DURING: u8 = 1;
const AFTER: u8 = 2;
const PHASES: [&str; 3] = ["before", "during", "after"];

#[derive(Clone, Debug)]
struct Sample {
    pod: usize,
    phase: u8,
    /// Since the load started.
    sent_at: Duration,
    elapsed: Duration,
    status: u16,
}

struct Load {
    started: Instant,
    phase: AtomicU8,
    stop: AtomicBool,
    samples: Mutex<Vec<Sample>>,
}

impl Load {
    fn new() -> Load {
        Load {
            started: Instant::now(),
            phase: AtomicU8::new(BEFORE),
            stop: AtomicBool::new(false),
            samples: Mutex::new(Vec::new()),
        }
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    fn count(&self, check: impl Fn(&Sample) -> bool) -> usize {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|s| check(s))
            .count()
    }

    /// One client of one pod, until told to stop.
    async fn run(&self, pod: usize, gw: &Gateway) {
        let body = count_body("svc/haiku", "hi");
        while !self.stop.load(Ordering::SeqCst) {
            let phase = self.phase.load(Ordering::SeqCst);
            let sent = Instant::now();
            let resp = gw.count_tokens(PAYG.secret, &body).await;
            let elapsed = sent.elapsed();
            match resp.status {
                200 => {}
                429 => {
                    resp.expect_rate_limited("requests per minute");
                }
                503 => {
                    resp.expect_error(503, "api_error");
                }
                other => panic!("pod {pod} answered {other}: {resp}\n{}", gw.logs()),
            }
            self.samples.lock().unwrap().push(Sample {
                pod,
                phase,
                sent_at: sent - self.started,
                elapsed,
                status: resp.status,
            });
            tokio::time::sleep(PAUSE).await;
        }
    }
}

/// What the clients saw: answers by phase, pod and status; how long each pod refused with 503;
/// the slowest answer.
fn report(samples: &[Sample]) -> String {
    let mut counts: BTreeMap<(&str, usize, u16), usize> = BTreeMap::new();
    for s in samples {
        *counts
            .entry((PHASES[usize::from(s.phase)], s.pod, s.status))
            .or_default() += 1;
    }
    let mut out = String::from("answers (phase, pod, status) -> count:\n");
    for ((phase, pod, status), n) in &counts {
        out.push_str(&format!("  {phase:6} pod {pod} {status}: {n}\n"));
    }
    for pod in 0..2 {
        let refused: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.pod == pod && s.status == 503)
            .collect();
        if let (Some(first), Some(last)) = (refused.first(), refused.last()) {
            out.push_str(&format!(
                "  pod {pod}: {} refusals (503) sent from {:?} to {:?} after the load started\n",
                refused.len(),
                first.sent_at,
                last.sent_at
            ));
        }
    }
    let slowest = samples.iter().max_by_key(|s| s.elapsed);
    out.push_str(&format!("  slowest answer: {slowest:?}\n"));
    out
}

/// How the key's shard changes master.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// `CLUSTER FAILOVER` on this replica.
    Failover(usize),
    /// SIGKILL of this master; the cluster elects its replica.
    Kill(usize),
}

/// Runs the load on both pods, makes `change` once [`ADMITTED_BEFORE`] requests are in, and
/// stops once both pods answer from Redis again and the cap is reached.
async fn failover_under_load(cluster: &mut Cluster<RedisCluster>, change: Change) -> Vec<Sample> {
    cluster.pods[0]
        .wait_for_roomy_window(PAYG.secret, WINDOW_MARGIN_SECS)
        .await;
    let load = Load::new();
    let pods = &cluster.pods;
    let redis = &mut cluster.redis;
    let clients = futures::future::join_all(pods.iter().enumerate().map(|(i, gw)| load.run(i, gw)));
    let script = async {
        poll_until(
            "the first admissions",
            Duration::from_secs(30),
            Duration::from_millis(10),
            || async { (load.count(|s| s.status == 200) >= ADMITTED_BEFORE).then_some(()) },
        )
        .await;
        load.phase.store(DURING, Ordering::SeqCst);
        match change {
            Change::Failover(replica) => redis.failover(replica).await,
            Change::Kill(master) => {
                redis.kill(master).await;
                redis.wait_settled().await;
            }
        }
        load.phase.store(AFTER, Ordering::SeqCst);
        // Recovered: each pod answers from Redis again (a 429 is counted there too), and the
        // key's cap has been reached.
        let recovered_and_capped = || {
            let recovered = (0..2)
                .all(|pod| load.count(|s| s.pod == pod && s.phase == AFTER && s.status != 503) > 0);
            recovered && load.count(|s| s.phase == AFTER && s.status == 429) >= 4
        };
        let waited = tokio::time::timeout(RECOVERY, async {
            while !recovered_and_capped() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "within {RECOVERY:?} of the change, both pods did not answer from Redis again with \
             the cap reached\n{}\n===== pod 0 =====\n{}\n===== pod 1 =====\n{}",
            report(&load.samples()),
            pods[0].logs(),
            pods[1].logs()
        );
        load.stop.store(true, Ordering::SeqCst);
    };
    tokio::join!(clients, script);
    let samples = load.samples();
    eprintln!("{}", report(&samples));
    samples
}

/// The rules every failover keeps (see the file's doc).
fn assert_failed_closed_and_recovered(samples: &[Sample], report: &str, logs: &str) {
    for s in samples {
        assert!(
            s.elapsed < NO_HANG,
            "an answer took {:?}: {s:?}\n{report}",
            s.elapsed
        );
    }
    for pod in 0..2 {
        let after: Vec<u16> = samples
            .iter()
            .filter(|s| s.pod == pod && s.phase == AFTER)
            .map(|s| s.status)
            .collect();
        let first_answer = after.iter().position(|&st| st != 503).unwrap_or_else(|| {
            panic!("pod {pod} never answered from Redis again\n{report}\n{logs}")
        });
        assert!(
            after[first_answer..].iter().all(|&st| st != 503),
            "pod {pod} went back to 503 after recovering: {after:?}\n{report}"
        );
    }
}

async fn window_requests(cluster: &Cluster<RedisCluster>) -> i64 {
    cluster
        .redis
        .cmd(&["HGET", &format!("rl:{{{}}}:w", PAYG.id), "req"])
        .await
        .as_i64()
        .expect("the window hash counts requests")
}

#[tokio::test]
async fn on_a_redis_cluster_a_coordinated_failover_under_load_keeps_the_rpm_cap_exact_and_the_pods_follow_by_themselves(
) {
    let mut cluster =
        Cluster::start_on_redis_cluster(2, |b| b.redis_timeout_ms(REDIS_TIMEOUT_MS)).await;
    let window = format!("rl:{{{}}}:w", PAYG.id);
    let master = cluster.redis.master_of(&window).await;
    let replica = cluster.redis.replica_of(master).await;
    let samples = failover_under_load(&mut cluster, Change::Failover(replica)).await;
    assert_eq!(
        cluster.redis.master_of(&window).await,
        replica,
        "the replica took the key's slot"
    );
    let report = report(&samples);
    assert_failed_closed_and_recovered(&samples, &report, &cluster.logs());
    let admitted = samples.iter().filter(|s| s.status == 200).count() as i64;
    assert_eq!(
        admitted, PAYG.rpm as i64,
        "admitted in the minute across a coordinated failover\n{report}"
    );
    assert_eq!(
        window_requests(&cluster).await,
        admitted,
        "the new master's count\n{report}"
    );
}

#[tokio::test]
async fn on_a_redis_cluster_a_killed_master_under_load_fails_closed_never_over_the_rpm_cap_and_the_pods_recover_by_themselves(
) {
    let mut cluster =
        Cluster::start_on_redis_cluster(2, |b| b.redis_timeout_ms(REDIS_TIMEOUT_MS)).await;
    let window = format!("rl:{{{}}}:w", PAYG.id);
    let master = cluster.redis.master_of(&window).await;
    let replica = cluster.redis.replica_of(master).await;
    let samples = failover_under_load(&mut cluster, Change::Kill(master)).await;
    assert_eq!(
        cluster.redis.master_of(&window).await,
        replica,
        "the replica was elected for the key's slot"
    );
    let report = report(&samples);
    assert_failed_closed_and_recovered(&samples, &report, &cluster.logs());
    let admitted = samples.iter().filter(|s| s.status == 200).count() as i64;
    let refused = samples.iter().filter(|s| s.status == 503).count() as i64;
    let cap = PAYG.rpm as i64;
    assert!(
        admitted <= cap && admitted >= cap - refused,
        "{admitted} admitted in the minute with a cap of {cap} and {refused} refused with 503\n{report}"
    );
    assert_eq!(
        window_requests(&cluster).await,
        cap,
        "the new master's count once the cap was reached\n{report}"
    );

    // The old master comes back as a replica; the pods keep answering from Redis.
    cluster.redis.restart(master).await;
    for (i, pod) in cluster.pods.iter().enumerate() {
        let resp = pod
            .count_tokens(PAYG.secret, &count_body("svc/haiku", "hi"))
            .await;
        resp.expect_rate_limited("requests per minute");
        assert_eq!(resp.rate_limit().remaining_requests, 0, "pod {i}");
    }
}
