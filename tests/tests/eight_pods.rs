//! Past one machine's worth of pods: eight `serve` pods sharing one Redis Cluster (three
//! masters, three replicas) and one Postgres behind PgBouncer in transaction pooling mode.
//!
//! 2,000 turns are sent from 50 keys (40 each), one every 10 ms so that the restart meets
//! turns in flight at each of its steps, however fast or slow the machine: 40 pay-as-you-go keys (60 RPM, so
//! all their turns fit) and 10 free keys (5 RPM, so the cap bites). Clients spread them over
//! the live pods and, like a load balancer, try the next pod when one refuses the connection.
//! While they run, the pods are replaced two at a time (a rolling update whose new pods were
//! started and ready beforehand): two new pods join the rotation, two old ones leave it and
//! get SIGTERM, which lets their turns in flight finish (and, for its shutdown delay, serves the
//! turns that picked it just before it left). Then:
//! - every account's books balance to the credit (what its clients were told they consumed is
//!   the balance decrease and the ledger's debits, one completed row per 200, nothing held),
//!   so the restart lost and double-billed nothing;
//! - every key's RPM cap held across all pods: a free key had exactly 5 turns admitted, and
//!   the shared window counts exactly 5; a pay-as-you-go key had all 40;
//! - every answer is 200, a 429 naming requests per minute, or a 503 in the envelope, and each
//!   key had at least the turns it expects served (200): a gateway refusing every turn fails;
//! - the replaced pods had turns in flight when they got their SIGTERMs and finished them:
//!   turns sent to a pod before its SIGTERM and answered 200 by it after;
//! - Postgres saw no more connections than PgBouncer's pool (20), for 16 pods of 16 each, at
//!   every sample taken while the turns ran.
//!
//! The test prints how the answers and the restart interleaved.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e::books::{assert_books_balance, tally, wait_for_turns_in_flight};
use e2e::*;
use futures::StreamExt;

const PODS: usize = 8;
const PAYG_KEYS: usize = 40;
const FREE_KEYS: usize = 10;
const KEYS: usize = PAYG_KEYS + FREE_KEYS;
const TURNS_PER_KEY: usize = 40;
const TURNS: usize = KEYS * TURNS_PER_KEY;
/// Pods replaced at a time.
const SURGE: usize = 2;
/// The restart replaces two pods each time this many more answers are in: mid-burst.
const RESTART_AFTER: usize = 250;
/// One turn is sent every this often: 2,000 take 20 s, and the four restart steps fall in
/// the first half of them.
const SEND_EVERY: Duration = Duration::from_millis(10);
/// The whole run (restart included) must fit in one rate-limit window for the caps to be
/// exact: it starts with at least this many seconds left in the minute.
const WINDOW_MARGIN_SECS: u64 = 50;
const FREE_RPM: u64 = 5;
/// The turns each key is expected to have served (200), at least: a pay-as-you-go key all
/// but a few of its 40 (a turn whose connection a pod accepted at the instant it closed its
/// listener is refused with 503, billed nothing), a free key all but one of the 5 its cap
/// admits. A gateway refusing every turn fails here, whatever its books say.
const PAYG_SERVED_AT_LEAST: u64 = TURNS_PER_KEY as u64 - 4;
const FREE_SERVED_AT_LEAST: u64 = FREE_RPM - 1;
/// Turns the replaced pods had in flight at their SIGTERMs and finished (sent to the pod
/// before its SIGTERM, answered 200 by it after), at least, in all: the restart is a fault
/// only if it hits turns in flight.
const IN_FLIGHT_AT_SIGTERM: u64 = 5;
const PAYG_CREDITS: u64 = 2_000_000;
const FREE_CREDITS: u64 = 500_000;

fn pod(b: GatewayBuilder, pooler_url: &str) -> GatewayBuilder {
    // Roomy bounds: eight debug builds share two cores with their Redis and Postgres.
    b.database_through_pooler(pooler_url)
        .arg("--database-timeout-ms")
        .arg("20000")
        .redis_timeout_ms(5_000)
        // Turns that last, so a pod told to stop has turns in flight to finish.
        .chunk_delay_ms(100)
        // As the chart does: a turn that picked a pod just before it left the rotation still
        // connects after its SIGTERM (a load balancer learns late too).
        .shutdown_delay_secs(3)
}

/// The pods' API addresses in rotation, as a load balancer's endpoints.
struct Rotation {
    live: Mutex<Vec<String>>,
    answered: AtomicUsize,
    /// Connections refused by a pod that had just left (tried again on the next pod).
    refused_connections: AtomicUsize,
    /// SIGTERMs sent so far: a turn reads it when it is sent and when its answer is in.
    sigterms: AtomicUsize,
}

/// Where a turn was served, and the SIGTERMs sent before it was sent and before its answer
/// was in.
struct Served {
    api: String,
    sent: usize,
    answered: usize,
}

impl Rotation {
    fn pick(&self, n: usize) -> String {
        let live = self.live.lock().unwrap();
        live[n % live.len()].clone()
    }

    /// Sends one turn, moving to the next pod while connections are refused.
    async fn turn(&self, http: &reqwest::Client, t: usize, key: &str) -> (Resp, Served) {
        let body = message("svc/haiku", "count to three", 16);
        for attempt in 0..(PODS * 4) {
            let api = self.pick(t + attempt);
            let sent = self.sigterms.load(Ordering::SeqCst);
            match http
                .post(format!("{api}/v1/messages"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
            {
                Ok(response) => {
                    let resp = Resp::read(response).await;
                    self.answered.fetch_add(1, Ordering::SeqCst);
                    let answered = self.sigterms.load(Ordering::SeqCst);
                    return (
                        resp,
                        Served {
                            api,
                            sent,
                            answered,
                        },
                    );
                }
                // Never reached a pod: nothing ran, so sending it elsewhere is safe.
                Err(e) if e.is_connect() => {
                    self.refused_connections.fetch_add(1, Ordering::SeqCst);
                }
                // Sent, answer lost: that is what a restart must never do.
                Err(e) => panic!("turn {t} on {api}: the answer was lost: {e}"),
            }
        }
        panic!("turn {t}: every pod refused the connection");
    }
}

#[tokio::test]
async fn eight_pods_on_a_redis_cluster_and_pgbouncer_keep_the_books_and_the_rpm_caps_exact_through_a_rolling_restart(
) {
    let pg = PostgresServer::start().await;
    let bouncer = PgBouncer::start(&pg).await;
    let pooler_url = bouncer.url();
    let configure = |b: GatewayBuilder| pod(b, &pooler_url);
    let configure: &dyn Fn(GatewayBuilder) -> GatewayBuilder = &configure;
    let mut cluster = Cluster::start_with_redis(
        RedisCluster::start().await,
        ManifestDir::cluster(),
        &[configure; PODS],
    )
    .await;

    // (key, account id, starting balance, free?)
    let mut keys = Vec::new();
    for i in 0..KEYS {
        let free = i >= PAYG_KEYS;
        let (credits, tier) = if free {
            (FREE_CREDITS, "free")
        } else {
            (PAYG_CREDITS, "pay_as_you_go")
        };
        let gw = cluster.pod(i);
        let key = gw.new_key(credits, &KeySpec::tier(tier)).await;
        let start = gw.admin_account(&key.account_id).await["balance"]
            .as_u64()
            .expect("balance");
        keys.push((key, start, free));
    }
    // The new pods of the rolling update, started and ready before it begins (as with a surge
    // of new pods that must be Ready before an old one is stopped).
    let mut spares =
        futures::future::join_all((0..PODS).map(|_| configure(cluster.pod_builder()).start()))
            .await;
    let window = wait_for_roomy_minute(&cluster.redis).await;

    let rotation = Rotation {
        live: Mutex::new(cluster.pods.iter().map(|p| p.api.clone()).collect()),
        answered: AtomicUsize::new(0),
        refused_connections: AtomicUsize::new(0),
        sigterms: AtomicUsize::new(0),
    };
    // No kept-alive connections: a connection to a pod is made per turn, as from many clients.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .expect("http client");
    let started = Instant::now();
    let mut timeline: Vec<String> = Vec::new();
    let mut retired: Vec<Gateway> = Vec::new();
    let load = futures::stream::iter(0..TURNS)
        .map(|t| {
            let (key, _, _) = &keys[t % KEYS];
            let (rotation, http) = (&rotation, &http);
            async move {
                tokio::time::sleep(SEND_EVERY * t as u32).await;
                let (resp, served) = rotation.turn(http, t, &key.secret).await;
                (t % KEYS, resp, served)
            }
        })
        .buffer_unordered(TURNS)
        .collect::<Vec<_>>();
    let mut hit = 0;
    // The replaced pods' APIs, each with the count of SIGTERMs once its own was sent.
    let mut terminated: Vec<(String, usize)> = Vec::new();
    // Postgres' client connections, sampled while the turns run and the pods come and go.
    let sampling = std::sync::atomic::AtomicBool::new(true);
    // One connection of its own (counted among the backends it sees), so a sample costs a
    // query, not a psql process.
    let mut sampling_connection = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&pg.url())
            .await
            .expect("a sampling connection")
    };
    let sampler = async {
        let mut samples: Vec<i64> = Vec::new();
        while sampling.load(Ordering::SeqCst) {
            samples.push(
                sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
                )
                .fetch_one(&mut sampling_connection)
                .await
                .expect("a sample"),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        samples
    };
    let restart = async {
        for (step, first) in (0..PODS).step_by(SURGE).enumerate() {
            let after = RESTART_AFTER * (step + 1);
            poll_until(
                &format!("{after} answers before restart step {step}"),
                Duration::from_secs(120),
                Duration::from_millis(10),
                || async { (rotation.answered.load(Ordering::SeqCst) >= after).then_some(()) },
            )
            .await;
            for i in first..first + SURGE {
                // The turns keep coming, so a pod has some in flight within moments.
                let in_flight = wait_for_turns_in_flight(&cluster.pods[i], 1).await;
                hit += in_flight;
                let new = spares.pop().expect("a replacement pod");
                let old = std::mem::replace(&mut cluster.pods[i], new);
                {
                    let mut live = rotation.live.lock().unwrap();
                    live.retain(|api| *api != old.api);
                    live.push(cluster.pods[i].api.clone());
                }
                let sigterms = rotation.sigterms.fetch_add(1, Ordering::SeqCst) + 1;
                old.send_sigterm();
                terminated.push((old.api.clone(), sigterms));
                timeline.push(format!(
                    "{:>6.1?}: pod {i} replaced (SIGTERM) with {} answers in and {in_flight} turns in flight on it",
                    started.elapsed(),
                    rotation.answered.load(Ordering::SeqCst)
                ));
                retired.push(old);
            }
        }
        for old in &mut retired {
            let status = old.wait_exit(Duration::from_secs(120)).await;
            assert!(
                status.success(),
                "a SIGTERMed pod exited {status:?}\n{}",
                old.logs()
            );
        }
        timeline.push(format!(
            "{:>6.1?}: every replaced pod exited (0) with {} answers in",
            started.elapsed(),
            rotation.answered.load(Ordering::SeqCst)
        ));
    };
    let sampled = async {
        let (answers, ()) = tokio::join!(load, restart);
        sampling.store(false, Ordering::SeqCst);
        answers
    };
    let (answers, samples) = tokio::join!(sampled, sampler);
    timeline.push(format!(
        "{:>6.1?}: all {TURNS} answered; {} connections refused by leaving pods and sent elsewhere",
        started.elapsed(),
        rotation.refused_connections.load(Ordering::SeqCst)
    ));

    // What the clients saw.
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for (_, resp, _) in &answers {
        *by_status.entry(resp.status).or_default() += 1;
    }
    eprintln!("{}\nanswers by status: {by_status:?}", timeline.join("\n"));
    // The turns a replaced pod had in flight at its SIGTERM (sent to it before, answered
    // after) that it finished: 200s. A pod that dropped or refused its turns in flight at the
    // signal has none.
    let finished_after_sigterm = answers
        .iter()
        .filter(|(_, resp, served)| {
            resp.status == 200
                && terminated.iter().any(|(api, sigterm)| {
                    served.api == *api && served.sent < *sigterm && served.answered >= *sigterm
                })
        })
        .count() as u64;
    eprintln!(
        "turns in flight on the replaced pods just before their SIGTERMs (their gauges): {hit}; \
         sent before a pod's SIGTERM and answered 200 by it after: {finished_after_sigterm}"
    );
    assert_eq!(terminated.len(), PODS, "every pod replaced");
    assert!(
        finished_after_sigterm >= IN_FLIGHT_AT_SIGTERM,
        "the replaced pods finished {finished_after_sigterm} turns in flight at their SIGTERMs (200s answered after the signal): the restart hit next to nothing, or cut what it hit"
    );
    assert_eq!(
        minute(&cluster.redis).await.0,
        window,
        "the run outlasted its rate-limit window, so the caps cannot be checked in one window"
    );

    // Sixteen pods came and went, each with a pool of up to 16 connections to PgBouncer;
    // Postgres saw at most PgBouncer's pool (and the sampling query's own connection) at every
    // sample taken while the turns ran.
    let backends = samples.iter().copied().max().unwrap_or(0);
    eprintln!(
        "Postgres client backends during the run: at most {backends} in {} samples (PgBouncer pool {})",
        samples.len(),
        pgbouncer::POOL_SIZE
    );
    assert!(
        samples.len() >= 20,
        "{} samples of Postgres' connections during the run",
        samples.len()
    );
    assert!(
        backends <= i64::from(pgbouncer::POOL_SIZE) + 1,
        "{backends} Postgres backends behind a PgBouncer pool of {}: {samples:?}",
        pgbouncer::POOL_SIZE
    );

    let mut per_key: Vec<Vec<&Resp>> = vec![Vec::new(); KEYS];
    for (k, resp, _) in &answers {
        per_key[*k].push(resp);
    }
    for (k, (key, start, free)) in keys.iter().enumerate() {
        let tallied = tally(per_key[k].iter().copied(), &[(429, "rate_limit_error")]);
        let accepted = tallied.0;
        for resp in per_key[k].iter().filter(|r| r.status == 429) {
            resp.expect_rate_limited("requests per minute");
        }
        let refused = per_key[k].iter().filter(|r| r.status == 503).count() as u64;
        if *free {
            assert!(
                accepted <= FREE_RPM && accepted + refused >= FREE_RPM,
                "free key {k}: {accepted} admitted, {refused} refused with 503, cap {FREE_RPM}"
            );
            let window = cluster
                .redis
                .cmd(&["HGET", &format!("rl:{{{}}}:w", key.id), "req"])
                .await
                .as_i64();
            assert_eq!(
                window,
                Some(FREE_RPM as i64),
                "free key {k}: the shared window"
            );
        } else {
            assert_eq!(
                accepted + refused,
                TURNS_PER_KEY as u64,
                "pay-as-you-go key {k}: under its cap every turn is admitted (or refused with 503)"
            );
        }
        let served_at_least = if *free {
            FREE_SERVED_AT_LEAST
        } else {
            PAYG_SERVED_AT_LEAST
        };
        assert_books_balance(&pg, &key.account_id, *start, served_at_least, tallied).await;
    }
}

/// The current rate-limit window by Redis' clock (the minute number) and its seconds left.
async fn minute(redis: &RedisCluster) -> (i64, u64) {
    let secs = match redis.cmd(&["TIME"]).await {
        redis::Reply::Array(parts) => parts.first().and_then(|p| p.as_i64()),
        _ => None,
    }
    .expect("TIME answers seconds");
    (secs / 60, 60 - (secs % 60) as u64)
}

/// Waits (if need be) for a minute with at least [`WINDOW_MARGIN_SECS`] left; returns it.
async fn wait_for_roomy_minute(redis: &RedisCluster) -> i64 {
    let (window, left) = minute(redis).await;
    if left >= WINDOW_MARGIN_SECS {
        return window;
    }
    poll_until(
        "the next minute",
        Duration::from_secs(70),
        Duration::from_millis(100),
        || async { Some(minute(redis).await).filter(|(w, _)| *w > window) },
    )
    .await
    .0
}
