//! Reserve + settle against Postgres, the ledger `gateway serve --database-url` uses: how many
//! turns per second one gateway process gets from one Postgres, and the latency of each of the
//! two statements, over 1,000 accounts.
//!
//! The bench starts no Postgres: it needs one at `DATABASE_URL` it may write to (it applies the
//! migrations and creates accounts `bench-NNNN`). `scripts/bench-ledger` starts a throwaway one:
//!
//! ```sh
//! scripts/bench-ledger
//! # or, with a Postgres of your own:
//! DATABASE_URL=postgres://user@127.0.0.1:5432/db cargo bench -p gateway --bench ledger
//! ```
//!
//! Knobs: `LEDGER_BENCH_SECS` (measured seconds per run, default 10),
//! `LEDGER_BENCH_CONCURRENCY` (turns in flight for the throughput run, default 32),
//! `LEDGER_BENCH_RATE` (turns per second of the paced run, default 2000),
//! `LEDGER_BENCH_POOL` (connections, default 16, the gateway's default),
//! `LEDGER_BENCH_POOLER_URL` (a PgBouncer in transaction pooling mode in front of
//! `DATABASE_URL`: the migrations go to `DATABASE_URL`, the turns through the pooler, as with
//! `--database-pooler transaction`; `LEDGER_BENCH_PGBOUNCER=1 scripts/bench-ledger` starts one).
//!
//! A turn is `Ledger::reserve` then `Ledger::settle` of `PostgresLedger`, exactly as a request
//! makes them (one statement each, the message row written at reserve and completed at
//! settle). Latency is measured around each call, in process.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gateway_core::ids;
use store::accounts::{Accounts, PostgresAccounts};
use store::audit::{Actor, ActorKind};
use store::db::{Database, DbSettings, Pooler};
use store::ledger::{
    fixtures::turn_record, Ledger, MessageStatus, NewReservation, PostgresLedger, Settlement,
};
use store::usage::{StopReason, TokenUsage};

mod support;
use support::{env_u64, ms, open_loop, percentile, OpenLoop};

const ACCOUNTS: usize = 1_000;
const WARMUP: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_secs(5);
const RESERVE: u64 = 5_000;
const COST: u64 = 1_234;

#[derive(Default)]
struct Samples {
    reserve: Vec<Duration>,
    settle: Vec<Duration>,
    errors: u64,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        self.reserve.extend(other.reserve);
        self.settle.extend(other.settle);
        self.errors += other.errors;
    }

    fn rows(mut self, name: &str, seconds: f64) -> String {
        self.reserve.sort_unstable();
        self.settle.sort_unstable();
        let turns = self.settle.len();
        let row = |statement: &str, l: &[Duration]| {
            format!(
                "| {name} | {statement} | {turns} | {:.0} | {} | {} | {} | {} |",
                turns as f64 / seconds,
                ms(percentile(l, 50.0)),
                ms(percentile(l, 99.0)),
                ms(l.last().copied().unwrap_or_default()),
                self.errors,
            )
        };
        format!(
            "{}\n{}",
            row("reserve", &self.reserve),
            row("settle", &self.settle)
        )
    }
}

/// One turn: reserve, then settle; both latencies recorded.
async fn turn(ledger: &PostgresLedger, account_id: &str, samples: &mut Samples) {
    let id = ids::message();
    let record = turn_record(&id, account_id, "key_bench");
    let t = Instant::now();
    let reserved = ledger
        .reserve(NewReservation {
            record,
            spend_cap: None,
            min: RESERVE,
            max: RESERVE,
        })
        .await;
    let reserve_took = t.elapsed();
    if reserved.is_err() {
        samples.errors += 1;
        return;
    }
    let t = Instant::now();
    let settled = ledger
        .settle(Settlement {
            message_id: id,
            served_by: None,
            status: MessageStatus::Completed,
            cost: COST,
            usage: TokenUsage {
                input_tokens: 20,
                output_tokens: 30,
                ..TokenUsage::default()
            },
            stop_reason: Some(StopReason::EndTurn),
            latency_ms: 1,
        })
        .await;
    let settle_took = t.elapsed();
    if settled.is_err() {
        samples.errors += 1;
        return;
    }
    samples.reserve.push(reserve_took);
    samples.settle.push(settle_took);
}

async fn closed_loop(
    ledger: Arc<PostgresLedger>,
    accounts: Arc<Vec<String>>,
    concurrency: usize,
    duration: Duration,
) -> (Samples, f64) {
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|worker| {
            let (ledger, accounts) = (ledger.clone(), accounts.clone());
            tokio::spawn(async move {
                let mut samples = Samples::default();
                let mut i = worker * (ACCOUNTS / concurrency.max(1));
                while Instant::now() < deadline {
                    turn(&ledger, &accounts[i % ACCOUNTS], &mut samples).await;
                    i += 1;
                }
                samples
            })
        })
        .collect();
    let mut samples = Samples::default();
    for task in tasks {
        samples.merge(task.await.expect("bench task"));
    }
    (samples, started.elapsed().as_secs_f64())
}

/// `rate` turns per second whatever the answers.
async fn paced(
    ledger: Arc<PostgresLedger>,
    accounts: Arc<Vec<String>>,
    rate: u64,
    duration: Duration,
) -> (Samples, OpenLoop) {
    let all = Arc::new(Mutex::new(Samples::default()));
    let open = open_loop(rate, duration, |i| {
        let account = accounts[(i as usize * 7) % ACCOUNTS].clone();
        let (ledger, all) = (ledger.clone(), all.clone());
        async move {
            let mut samples = Samples::default();
            turn(&ledger, &account, &mut samples).await;
            all.lock().expect("samples").merge(samples);
        }
    })
    .await;
    let samples = std::mem::take(&mut *all.lock().expect("samples"));
    (samples, open)
}

fn main() {
    let as_bench = std::env::args().any(|a| a == "--bench");
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!(
            "ledger bench: DATABASE_URL is not set. It needs a Postgres it may write to: run \
             scripts/bench-ledger, which starts a throwaway one, or set DATABASE_URL."
        );
        std::process::exit(if as_bench { 2 } else { 0 });
    };
    let duration = Duration::from_secs(env_u64("LEDGER_BENCH_SECS", 10));
    let concurrency = env_u64("LEDGER_BENCH_CONCURRENCY", 32) as usize;
    let rate = env_u64("LEDGER_BENCH_RATE", 2_000);
    let pool = env_u64("LEDGER_BENCH_POOL", 16) as u32;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let db = Database::connect(&url, pool, TIMEOUT).expect("DATABASE_URL");
        db.migrate().await.expect("migrations");
        let db = match std::env::var("LEDGER_BENCH_POOLER_URL") {
            Ok(url) => Database::connect_with(&DbSettings {
                url,
                pool_size: pool,
                timeout: TIMEOUT,
                pooler: Pooler::Transaction,
                tls: Default::default(),
            })
            .expect("LEDGER_BENCH_POOLER_URL"),
            Err(_) => db,
        };
        let store = PostgresAccounts::new(db.clone());
        let ledger = Arc::new(PostgresLedger::new(db));
        let mut ids = Vec::with_capacity(ACCOUNTS);
        let bench = Actor::new(ActorKind::Cli, "bench", None);
        for i in 0..ACCOUNTS {
            let name = format!("bench-{i:04}");
            let account = match store.account_by_name(&name).await.expect("lookup") {
                Some(account) => account,
                None => store.create_account(&name).await.expect("create account"),
            };
            ledger
                .add_credits(&account.id, 1_000_000_000_000, &bench)
                .await
                .expect("add credits");
            ids.push(account.id);
        }
        let accounts = Arc::new(ids);
        closed_loop(ledger.clone(), accounts.clone(), concurrency, WARMUP).await;

        println!("\nLedger: reserve + settle on Postgres, {ACCOUNTS} accounts, pool {pool}\n");
        println!("| run | statement | turns | turns/s | p50 | p99 | max | errors |");
        println!("|---|---|---|---|---|---|---|---|");
        let (samples, seconds) =
            closed_loop(ledger.clone(), accounts.clone(), concurrency, duration).await;
        println!(
            "{}",
            samples.rows(&format!("closed loop, {concurrency} in flight"), seconds)
        );
        let (samples, open) = paced(ledger, accounts, rate, duration).await;
        println!(
            "{}",
            samples.rows(&format!("paced, {rate}/s"), open.seconds)
        );
        println!(
            "\nThe paced run's latest tick fired {} after it was due.",
            ms(open.max_lag)
        );
    });
}
