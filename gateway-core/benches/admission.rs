//! Admission against Redis, the limiter `gateway serve` uses: how many decisions per second
//! one gateway process gets from one Redis, and how much latency one decision adds at a
//! steady 2,000 decisions per second, over 1,000 distinct keys.
//!
//! The bench starts no Redis: it needs one at `REDIS_URL` (`redis://127.0.0.1:PORT`).
//! `scripts/bench-admission` starts a throwaway redis-server, runs this, and stops it:
//!
//! ```sh
//! scripts/bench-admission
//! # or, with a Redis of your own (it writes keys rl:{bench_key_NNNN}:w and :s):
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench -p gateway --bench admission
//! ```
//!
//! Knobs: `ADMISSION_BENCH_SECS` (measured seconds per run, default 10),
//! `ADMISSION_BENCH_CONCURRENCY` (calls in flight for the throughput run, default 64),
//! `ADMISSION_BENCH_RATE` (decisions per second of the paced run, default 2000).
//!
//! Every call is `Limiter::admit` on `RedisLimiter` exactly as a request would make it: one
//! Lua script call (EVALSHA) deciding RPM, input TPM and streams at once. The limits are set
//! high so every call is admitted (a refusal costs the same one call). Latency is measured
//! around the `admit` call, in process, so it is the latency admission adds to a request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::config::Limits;
use gateway_core::limits::{AdmissionRequest, Limiter, RedisLimiter, RedisSettings};

mod support;
use support::{env_u64, ms, open_loop, percentile};

const KEYS: usize = 1_000;
const WARMUP: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(250);
const SLOT_TTL: Duration = Duration::from_secs(10);

const LIMITS: Limits = Limits {
    requests_per_minute: u32::MAX,
    input_tokens_per_minute: u64::MAX / 4,
    concurrent_streams: 1_000,
};

/// One decision on every dimension, as a turn's admission took before requests were counted
/// ahead of the body (a turn now makes two calls: the request count, then tokens and streams).
const REQUEST: AdmissionRequest = AdmissionRequest {
    input_tokens: 100,
    stream: false,
    count_request: true,
};

struct Run {
    name: String,
    seconds: f64,
    decisions: u64,
    errors: u64,
    latencies: Vec<Duration>,
}

impl Run {
    fn row(mut self) -> String {
        self.latencies.sort_unstable();
        let l = &self.latencies;
        format!(
            "| {} | {:.1} | {} | {:.0} | {} | {} | {} | {} | {} |",
            self.name,
            self.seconds,
            self.decisions,
            self.decisions as f64 / self.seconds,
            ms(percentile(l, 50.0)),
            ms(percentile(l, 99.0)),
            ms(percentile(l, 99.9)),
            ms(l.last().copied().unwrap_or_default()),
            self.errors,
        )
    }
}

fn key_names() -> Arc<Vec<String>> {
    Arc::new((0..KEYS).map(|i| format!("bench_key_{i:04}")).collect())
}

/// `concurrency` callers back to back for `duration`, each walking the keys from its own
/// offset.
async fn closed_loop(
    limiter: Arc<RedisLimiter>,
    keys: Arc<Vec<String>>,
    concurrency: usize,
    duration: Duration,
    measure: bool,
) -> Run {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let limiter = limiter.clone();
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut i = worker * (KEYS / concurrency.max(1));
            while Instant::now() < deadline {
                let key = &keys[i % KEYS];
                i += 1;
                let t = Instant::now();
                let result = limiter.admit(key, &LIMITS, REQUEST).await;
                let elapsed = t.elapsed();
                match result {
                    Ok(_) => {
                        if measure {
                            latencies.push(elapsed);
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut run = Run {
        name: format!("closed loop, {concurrency} in flight"),
        seconds: 0.0,
        decisions: 0,
        errors: 0,
        latencies: Vec::new(),
    };
    for task in tasks {
        let (latencies, errors) = task.await.expect("bench task");
        run.decisions += latencies.len() as u64;
        run.errors += errors;
        run.latencies.extend(latencies);
    }
    run.seconds = started.elapsed().as_secs_f64();
    run
}

/// `rate` decisions per second whatever the answers, for `duration`. Latency is per call.
async fn paced(
    limiter: Arc<RedisLimiter>,
    keys: Arc<Vec<String>>,
    rate: u64,
    duration: Duration,
) -> (Run, Duration) {
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(
        (rate * duration.as_secs() + 16) as usize,
    )));
    let errors = Arc::new(AtomicU64::new(0));
    let open = open_loop(rate, duration, |i| {
        let key = keys[(i as usize * 7) % KEYS].clone();
        let (limiter, latencies, errors) = (limiter.clone(), latencies.clone(), errors.clone());
        async move {
            let t = Instant::now();
            let result = limiter.admit(&key, &LIMITS, REQUEST).await;
            let elapsed = t.elapsed();
            match result {
                Ok(_) => latencies.lock().expect("latencies").push(elapsed),
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
    .await;
    let latencies = std::mem::take(&mut *latencies.lock().expect("latencies"));
    let run = Run {
        name: format!("paced, {rate}/s"),
        seconds: open.seconds,
        decisions: latencies.len() as u64,
        errors: errors.load(Ordering::Relaxed),
        latencies,
    };
    (run, open.max_lag)
}

fn main() {
    let as_bench = std::env::args().any(|a| a == "--bench");
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!(
            "admission bench: REDIS_URL is not set. It needs a redis-server it may write to \
             (keys rl:{{bench_key_NNNN}}:*): run scripts/bench-admission, which starts a \
             throwaway one, or set REDIS_URL=redis://127.0.0.1:PORT."
        );
        // Run as a test (`cargo test --benches`) without Redis: nothing to measure.
        std::process::exit(if as_bench { 2 } else { 0 });
    };
    let seconds = env_u64("ADMISSION_BENCH_SECS", 10);
    let concurrency = env_u64("ADMISSION_BENCH_CONCURRENCY", 64) as usize;
    let rate = env_u64("ADMISSION_BENCH_RATE", 2_000);
    let duration = Duration::from_secs(seconds);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let limiter = Arc::new(
            RedisLimiter::connect(&RedisSettings {
                url: url.clone(),
                tls: Default::default(),
                timeout: TIMEOUT,
                slot_ttl: SLOT_TTL,
            })
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}")),
        );
        let keys = key_names();
        // Loads the scripts and fills the connection's buffers; also checks Redis answers.
        limiter
            .admit(&keys[0], &LIMITS, REQUEST)
            .await
            .unwrap_or_else(|e| panic!("admission against {url} failed: {e}"));
        closed_loop(limiter.clone(), keys.clone(), concurrency, WARMUP, false).await;

        let throughput =
            closed_loop(limiter.clone(), keys.clone(), concurrency, duration, true).await;
        let single = closed_loop(
            limiter.clone(),
            keys.clone(),
            1,
            Duration::from_secs(seconds.min(3)),
            true,
        )
        .await;
        let (paced_run, max_lag) = paced(limiter.clone(), keys.clone(), rate, duration).await;

        // The decisions landed in Redis: the paced run touches every key each half second.
        let snapshot = limiter
            .snapshot(&keys[0])
            .await
            .unwrap_or_else(|e| panic!("snapshot from {url} failed: {e}"));
        assert!(
            snapshot.requests > 0,
            "Redis holds no requests for {} after the runs: {snapshot:?}",
            keys[0]
        );

        let workers = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!();
        println!(
            "Admission with Redis: {KEYS} distinct keys, RedisLimiter::admit (one EVALSHA), \
             timeout {} ms, tokio multi-thread runtime ({workers} workers), {url}",
            TIMEOUT.as_millis()
        );
        println!();
        println!("| run | seconds | decisions | decisions/s | p50 | p99 | p99.9 | max | errors |");
        println!("|---|---|---|---|---|---|---|---|---|");
        println!("{}", throughput.row());
        println!("{}", single.row());
        println!("{}", paced_run.row());
        println!();
        println!(
            "paced run: ticks of 1 ms, the latest tick {} behind schedule",
            ms(max_lag)
        );
    });
}
