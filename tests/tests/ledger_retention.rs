//! The ledger by day and its retention (issue 35), on real Postgres, the real gateway binary
//! and an S3-compatible server (moto): migration 0020 moves a ledger filled by the code of
//! before into day partitions without losing a row or a credit; a lookup by id reads one
//! partition; a day older than `--ledger-retention-days` is exported, verified, then dropped
//! whole, so that its manifest's `billed` plus the remaining rows' equals the accounts'
//! lifetime debits; a failed export, or no archive, leaves the day in place; a rerun changes
//! nothing; a dropped message is a 404.

use std::time::{Duration, Instant};

use e2e::archive::{assert_archive_matches, assert_archived_file_matches, ledger_day, LedgerDay};
use e2e::ledger::{funded, reserve_at, settle};
use e2e::s3::{S3Server, CREDENTIALS};
use e2e::{poll_until, Cluster, PostgresServer};
use futures::future::join_all;
use serde_json::Value;
use store::db::Database;
use store::ledger::message_id;
use store::ledger::partitions;
use store::ledger::{Ledger, MessageStatus, PostgresLedger, Settlement, MESSAGE_BY_TIMED_ID};
use store::usage::{StopReason, TokenUsage};
use time::{Date, OffsetDateTime, Time};

const CREDITS: u64 = 100_000_000;

/// Rows written straight into the ledger of before, over 60 days, to time the migration.
const BULK_ROWS: i64 = 200_000;

async fn reserve(ledger: &PostgresLedger, account: &str, id: &str, at: OffsetDateTime) {
    reserve_at(ledger, account, "key_retention", id, at).await;
}

/// A turn started `at`, its id minted then as the gateway mints it, settled for `cost`; each
/// of its counts a different number, so that an archive with two columns swapped shows.
async fn turn(ledger: &PostgresLedger, account: &str, at: OffsetDateTime, cost: u64) -> String {
    let id = message_id::mint("msg", at);
    let at = message_id::created_at(&id).expect("a time");
    reserve(ledger, account, &id, at).await;
    let n = u32::try_from(cost).expect("a small cost");
    let billed = ledger
        .settle(Settlement {
            cost,
            usage: TokenUsage {
                input_tokens: n + 1,
                output_tokens: n + 2,
                cache_creation_input_tokens: n + 3,
                cache_read_input_tokens: n + 4,
                ..TokenUsage::default()
            },
            stop_reason: Some(StopReason::EndTurn),
            latency_ms: cost + 5,
            ..Settlement::nothing(id.clone(), MessageStatus::Completed)
        })
        .await
        .expect("settle");
    assert_eq!(billed, cost);
    id
}

async fn ledger_on(db: &Database) -> (PostgresLedger, String) {
    funded(db, "retention", CREDITS).await
}

/// What the account was debited over its life: what it was credited less what it has.
async fn lifetime_debits(pg: &PostgresServer, account: &str) -> u64 {
    let balance = pg
        .query_i64(&format!(
            "SELECT balance FROM accounts WHERE id = '{account}'"
        ))
        .await;
    CREDITS - u64::try_from(balance).expect("a balance")
}

async fn rows_billed(pg: &PostgresServer, account: &str) -> u64 {
    let billed = pg
        .query_i64(&format!(
            "SELECT coalesce(sum(billed), 0) FROM messages WHERE account_id = '{account}'"
        ))
        .await;
    u64::try_from(billed).expect("a sum")
}

async fn has_partition(pg: &PostgresServer, day: Date) -> bool {
    let name = format!("messages_{}", day.to_string().replace('-', ""));
    pg.query(&format!("SELECT to_regclass('{name}') IS NOT NULL"))
        .await
        == "t"
}

#[tokio::test]
async fn migration_0020_moves_a_ledger_of_before_into_day_partitions_keeping_every_row_and_credit()
{
    let pg = PostgresServer::start().await;
    pg.migrate_before(20).await;

    // Turns as the code of before wrote them (the statements of today write the layout of
    // today), under ids of before (random), over three days; one started a second before
    // midnight is still running when the migration comes.
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(60)).expect("url");
    let (ledger, account) = ledger_on(&db).await;
    let midnight = OffsetDateTime::now_utc().replace_time(Time::MIDNIGHT);
    let mut settled = Vec::new();
    for (back, cost) in [(2, 100), (1, 200), (0, 300)] {
        let id = old_id();
        let at = midnight - time::Duration::days(back) + time::Duration::hours(1);
        pg.query(&row_of_before(&account, &id, at, cost)).await;
        settled.push(id);
    }
    let across = old_id();
    pg.query(&row_of_before(
        &account,
        &across,
        midnight - time::Duration::seconds(1),
        0,
    ))
    .await;
    // And rows as an old ledger holds them, 60 days of them.
    pg.query(&format!(
        "INSERT INTO messages (id, account_id, key_id, model, served_model, provider, upstream,
             upstream_model, endpoint, stream, status, reserved, billed, input_tokens,
             output_tokens, instance_id, created_at, settled_at, latency_ms)
         SELECT 'msg_bulk_' || i, '{account}', 'key_bulk', 'svc/haiku', 'svc/haiku',
             'simulated', 'simulated', 'simulated-haiku', 'messages', i % 2 = 0, 'completed',
             1000, i % 997, i, i % 300, 'inst_bulk',
             now() - interval '60 days' + i * (interval '60 days' / {BULK_ROWS}),
             now() - interval '60 days' + i * (interval '60 days' / {BULK_ROWS}), 7
         FROM generate_series(1, {BULK_ROWS}) i"
    ))
    .await;
    let totals = "SELECT count(*) || '|' || sum(billed) || '|' || sum(input_tokens) FROM messages";
    let before = pg.query(totals).await;
    let accounts = "SELECT balance || '|' || reserved FROM accounts ORDER BY id";
    let balances = pg.query(accounts).await;

    let started = Instant::now();
    db.migrate().await.expect("0020 on a filled ledger");
    let took = started.elapsed();
    let rows = BULK_ROWS + 4;
    eprintln!(
        "migration 0020: {rows} rows in {took:?}, {:.1} s per million rows",
        took.as_secs_f64() * 1e6 / rows as f64
    );

    assert_eq!(
        pg.query(totals).await,
        before,
        "every row, credit and token"
    );
    assert_eq!(pg.query(accounts).await, balances, "the accounts unchanged");
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM messages_default").await,
        0,
        "every row in its day's partition"
    );
    assert_eq!(
        pg.query("SELECT relkind FROM pg_class WHERE relname = 'messages'")
            .await,
        "p",
        "partitioned"
    );
    let today = midnight.date();
    for ahead in 0..=7 {
        assert!(has_partition(&pg, today + time::Duration::days(ahead)).await);
    }
    // Ids of before are found by id alone.
    for (id, cost) in settled.iter().zip([100, 200, 300]) {
        let row = ledger.message(id).await.expect("lookup").expect("found");
        assert_eq!(row.billed, cost, "{id}");
    }
    // The turn in flight through the migration settles after it, across midnight, billed once.
    assert_eq!(settle(&ledger, &across, 400).await, 400);
    assert_eq!(
        settle(&ledger, &across, 999).await,
        400,
        "a replay bills nothing"
    );
    let row = ledger
        .message(&across)
        .await
        .expect("lookup")
        .expect("found");
    assert_eq!(
        (row.status, row.created_at.date()),
        (
            MessageStatus::Completed,
            (midnight - time::Duration::days(1)).date()
        )
    );
    let billed = "SELECT sum(billed) FROM messages WHERE key_id = 'key_retention'";
    assert_eq!(
        lifetime_debits(&pg, &account).await,
        u64::try_from(pg.query_i64(billed).await).expect("a sum"),
        "the balance and the rows of the ledger's turns agree"
    );
    let reserved = format!("SELECT reserved FROM accounts WHERE id = '{account}'");
    assert_eq!(pg.query_i64(&reserved).await, 0);
}

/// A turn of `account` started `at` as the gateway wrote it before 0020 (and 0025: the route
/// and upstream by name), reserving 1,000 credits: completed for `cost` and debited, or, for
/// 0, still reserved.
fn row_of_before(account: &str, id: &str, at: OffsetDateTime, cost: u64) -> String {
    let (status, settled_at) = match cost {
        0 => ("reserved", "NULL"),
        _ => ("completed", "now()"),
    };
    let micros = at.unix_timestamp_nanos() / 1_000;
    format!(
        "INSERT INTO messages (id, account_id, key_id, model, served_model, provider, upstream,
             upstream_model, endpoint, stream, status, reserved, billed, instance_id,
             created_at, settled_at)
         VALUES ('{id}', '{account}', 'key_retention', 'svc/haiku', 'svc/haiku', 'simulated',
             'simulated', 'simulated-haiku', 'messages', false, '{status}', 1000, {cost},
             'inst_before', 'epoch'::timestamptz + {micros} * interval '1 microsecond',
             {settled_at});
         UPDATE accounts SET balance = balance - {cost},
             reserved = reserved + CASE WHEN {cost} = 0 THEN 1000 ELSE 0 END
         WHERE id = '{account}'"
    )
}

/// An id as the gateway minted them before 0020: random.
fn old_id() -> String {
    format!("msg_{}", store::ids::random(24))
}

/// A ledger of five days (its ids minted as the gateway mints them): four and five days ago
/// are older than a retention of 3 days; yesterday's last turn started before midnight and
/// settled after, on another pod. Four days ago has no partition: its rows sit in the default
/// partition until the retention gives it one.
struct Filled {
    pg: PostgresServer,
    account: String,
    /// Five and four days ago.
    due: [Date; 2],
    /// A turn of five days ago.
    dropped_id: String,
    /// A turn of yesterday.
    kept_id: String,
}

async fn filled() -> Filled {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(60)).expect("url");
    db.migrate().await.expect("migrate");
    let (ledger, account) = ledger_on(&db).await;
    let midnight = OffsetDateTime::now_utc().replace_time(Time::MIDNIGHT);
    let day = |back: i64| (midnight - time::Duration::days(back)).date();
    let due = [day(5), day(4)];
    assert!(partitions::create(&db, day(5)).await.expect("a partition"));
    let mut dropped_id = String::new();
    for (back, cost) in [(5, 100), (5, 150), (4, 200), (1, 300)] {
        let at = midnight - time::Duration::days(back) + time::Duration::hours(3);
        let id = turn(&ledger, &account, at, cost).await;
        if back == 5 {
            dropped_id = id;
        }
    }
    assert!(!has_partition(&pg, day(4)).await);
    let settling = PostgresLedger::new(db.clone());
    settling.heartbeat().await.expect("heartbeat");
    let kept_id = message_id::mint("msg", midnight - time::Duration::microseconds(1));
    let at = message_id::created_at(&kept_id).expect("a time");
    reserve(&ledger, &account, &kept_id, at).await;
    assert_eq!(settle(&settling, &kept_id, 700).await, 700);
    Filled {
        pg,
        account,
        due,
        dropped_id,
        kept_id,
    }
}

async fn retain(pg: &PostgresServer, args: &[&str], env: &[(&str, &str)]) -> Value {
    retain_keeping(pg, "3", args, env).await
}

/// `gateway ledger retain` keeping `days` days.
async fn retain_keeping(
    pg: &PostgresServer,
    days: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Value {
    let mut all = vec![
        "ledger",
        "retain",
        "--ledger-retention-days",
        days,
        "--reaper-max-turn-secs",
        "60",
    ];
    all.extend_from_slice(args);
    let printed = pg
        .gateway_cli_with_env(&all, env)
        .await
        .unwrap_or_else(|e| panic!("gateway ledger retain {args:?}: {e}"));
    // Nothing else retains this test's database; a run that did not get the turn names who
    // held it (once seen in a busy CI run, before the servers' readiness told a test's own
    // Postgres from another test's on the same port).
    if printed["ran"] != true {
        let holders = pg
            .query(
                "SELECT a.pid, a.application_name, a.state, a.query FROM pg_locks l \
                 JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory'",
            )
            .await;
        panic!("gateway ledger retain {args:?} did not run: {printed}\nadvisory locks: {holders}");
    }
    printed
}

fn days(printed: &Value, field: &str) -> Vec<String> {
    printed[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} in {printed}"))
        .iter()
        .map(|d| {
            d.as_str()
                .map(str::to_owned)
                .or_else(|| d["day"].as_str().map(str::to_owned))
                .expect("a day")
        })
        .collect()
}

#[tokio::test]
async fn a_day_older_than_the_retention_is_archived_verified_then_dropped_and_the_books_still_add_up(
) {
    let filled = filled().await;
    let pg = &filled.pg;
    let due: Vec<String> = filled.due.iter().map(Date::to_string).collect();
    let s3 = S3Server::start().await;
    s3.create_bucket("ledger").await;
    let endpoint = s3.url();
    let archive = [
        "--ledger-archive-s3",
        "s3://ledger/archive",
        "--ledger-archive-s3-endpoint",
        &endpoint,
    ];

    // A dry run names the days due and drops nothing.
    let dry = retain(pg, &["--dry-run"], &[]).await;
    assert_eq!(days(&dry, "awaiting"), due, "{dry}");
    assert!(has_partition(pg, filled.due[0]).await);
    let mut rows_due: Vec<LedgerDay> = Vec::new();
    for day in filled.due {
        rows_due.push(ledger_day(pg, day).await);
    }
    assert_eq!(
        rows_due.iter().map(|d| d.rows.len()).collect::<Vec<_>>(),
        [2, 1]
    );

    // The pod's hourly job (its first run is at start) archives and drops them.
    let cluster = Cluster::start(1, |b| {
        archive
            .iter()
            .fold(b.database(&pg.url()), |b, arg| b.arg(arg))
            .arg("--ledger-retention-days=3")
            .arg("--reaper-max-turn-secs=60")
            .env(CREDENTIALS[0].0, CREDENTIALS[0].1)
            .env(CREDENTIALS[1].0, CREDENTIALS[1].1)
            .env(CREDENTIALS[2].0, CREDENTIALS[2].1)
    })
    .await;
    let gw = &cluster.pods[0];
    let remaining = format!(
        "SELECT count(*) FROM messages WHERE created_at < '{}'",
        OffsetDateTime::now_utc().date() - time::Duration::days(3)
    );
    poll_until(
        "the pod to archive and drop the days due",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (pg.query_i64(&remaining).await == 0).then_some(()) },
    )
    .await;
    for day in filled.due {
        assert!(!has_partition(pg, day).await, "{day} dropped");
    }

    // The manifests' `billed` and the rows left add up to what the account was debited.
    let mut archived = 0;
    for day in &due {
        let manifest = s3
            .object("ledger", &format!("archive/messages-{day}.json"))
            .await
            .unwrap_or_else(|| panic!("no manifest for {day}\n{}", s3.logs()));
        let manifest: Value = serde_json::from_slice(&manifest).expect("JSON");
        archived += manifest["billed"].as_u64().expect("billed");
    }
    // Each archived file, decoded by a second reader, holds the dropped rows column for column.
    for rows in &rows_due {
        let file = format!("archive/messages-{}.parquet", rows.day);
        let copy = s3.object("ledger", &file).await.expect("archived");
        assert_archive_matches(&file, &copy, rows).await;
    }
    assert_eq!(archived, 100 + 150 + 200);
    let debits = lifetime_debits(pg, &filled.account).await;
    assert_eq!(
        archived + rows_billed(pg, &filled.account).await,
        debits,
        "archived + remaining = lifetime debits"
    );
    // The rollups are kept whole.
    assert_eq!(
        pg.query_i64("SELECT sum(credits)::bigint FROM usage_rollups")
            .await,
        i64::try_from(debits).expect("debits")
    );

    // A message of a dropped day is not found; one kept (across midnight) still is.
    let gone = gw
        .admin_get(&format!("/admin/messages/{}", filled.dropped_id))
        .await;
    assert_eq!(gone.status, 404, "{gone}");
    let kept = gw
        .admin_get(&format!("/admin/messages/{}", filled.kept_id))
        .await;
    assert_eq!(kept.status, 200, "{kept}");
    assert_eq!(kept.json()["billed"], 700, "{kept}");

    // Again: nothing left to do, the archive as it was.
    let file = format!("archive/messages-{}.parquet", due[0]);
    let copy = s3.object("ledger", &file).await.expect("archived");
    let again = retain(pg, &["--now"], &CREDENTIALS).await;
    let mut with_archive = vec!["--now"];
    with_archive.extend_from_slice(&archive);
    let again_archived = retain(pg, &with_archive, &CREDENTIALS).await;
    for printed in [&again, &again_archived] {
        assert_eq!(printed["ran"], true, "{printed}");
        assert!(days(printed, "awaiting").is_empty(), "{printed}");
        assert!(days(printed, "dropped").is_empty(), "{printed}");
    }
    assert!(s3.object("ledger", &file).await == Some(copy));
    assert_eq!(
        archived + rows_billed(pg, &filled.account).await,
        lifetime_debits(pg, &filled.account).await
    );
}

#[tokio::test]
async fn a_day_whose_archive_fails_or_is_not_configured_stays_in_postgres() {
    let filled = filled().await;
    let pg = &filled.pg;
    let due: Vec<String> = filled.due.iter().map(Date::to_string).collect();
    let s3 = S3Server::start().await;
    let endpoint = s3.url();
    let rows = "SELECT count(*) || '|' || sum(billed) FROM messages";
    let before = pg.query(rows).await;

    // No archive: the days are awaiting, nothing dropped.
    let kept = retain(pg, &["--now"], &[]).await;
    assert_eq!(days(&kept, "awaiting"), due, "{kept}");
    assert!(days(&kept, "dropped").is_empty(), "{kept}");

    // An archive that cannot be written (no such bucket): each day fails and stays.
    let missing = [
        "--now",
        "--ledger-archive-s3",
        "s3://no-such-bucket/archive",
        "--ledger-archive-s3-endpoint",
        &endpoint,
    ];
    let failed = retain(pg, &missing, &CREDENTIALS).await;
    assert_eq!(days(&failed, "failed"), due, "{failed}");
    assert_eq!(days(&failed, "awaiting"), due, "{failed}");
    assert!(days(&failed, "dropped").is_empty(), "{failed}");
    for day in filled.due {
        assert!(has_partition(pg, day).await, "{day} kept");
    }

    // An archived file that differs from the day in Postgres in one column, one the rows'
    // count and sum of `billed` do not see (a row written again since, say): not dropped, the
    // column named; nor one with a row less.
    let db = Database::connect(&pg.url(), 2, Duration::from_secs(10)).expect("url");
    let [day, _] = filled.due;
    let dir = std::env::temp_dir().join(e2e::gateway::unique_name("mismatched"));
    let (from, to) = (day.to_string(), dir.to_str().expect("a path").to_owned());
    pg.gateway_cli_with_env(
        &[
            "ledger",
            "export",
            "--from",
            &from,
            "--to",
            &from,
            "--to-dir",
            &to,
            "--reaper-max-turn-secs",
            "60",
        ],
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("gateway ledger export: {e}"));
    let file =
        || std::fs::File::open(dir.join(format!("messages-{day}.parquet"))).expect("the file");
    let archived = gateway_core::ledger_export::file_sums(file()).expect("decoded");
    assert_eq!(archived.rows, 2);
    let one_row = format!("id = '{}'", filled.dropped_id);
    pg.query(&format!(
        "UPDATE messages SET latency_ms = latency_ms + 1 WHERE {one_row}"
    ))
    .await;
    let refused = partitions::drop_exported(&db, day, &archived).await;
    assert!(
        matches!(&refused, Err(partitions::DropError::Mismatch { differing, .. }) if differing == &["latency_ms"]),
        "{refused:?}"
    );
    pg.query(&format!(
        "UPDATE messages SET latency_ms = latency_ms - 1 WHERE {one_row}"
    ))
    .await;
    let mut a_row_less = archived.clone();
    a_row_less.rows -= 1;
    let refused = partitions::drop_exported(&db, day, &a_row_less).await;
    assert!(
        matches!(&refused, Err(partitions::DropError::Mismatch { .. })),
        "{refused:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(has_partition(pg, day).await, "{day} kept");
    assert_eq!(pg.query(rows).await, before, "not a row lost");
}

/// A lookup by id decodes the day from the id: the plan of the statement `ledger.message()`
/// runs (`MESSAGE_BY_TIMED_ID`, on `message_rows`, with its parameters bound as the store
/// binds them) reads one partition of the open days and at most one of the closed, whatever
/// the number of days.
#[tokio::test]
async fn a_lookup_by_id_reads_one_partition() {
    let filled = filled().await;
    let at = message_id::created_at(&filled.dropped_id).expect("a time");
    let plan = filled
        .pg
        .query(&format!(
            "PREPARE lookup (text, timestamptz) AS {MESSAGE_BY_TIMED_ID};
             EXPLAIN EXECUTE lookup('{}', '{}')",
            filled.dropped_id,
            at.format(&time::format_description::well_known::Rfc3339)
                .expect("format")
        ))
        .await;
    let scans = |table: &str| {
        plan.lines()
            .filter(|l| l.contains(&format!(" on {table}_")))
            .count()
    };
    let day = at.date().to_string().replace('-', "");
    // The id's own day (by its index, or by a scan of a partition of a few rows).
    assert_eq!(scans("messages"), 1, "{plan}");
    assert!(plan.contains(&format!(" on messages_{day}")), "{plan}");
    assert!(scans("closed_messages") <= 1, "{plan}");
    let parts = filled
        .pg
        .query_i64("SELECT count(*) FROM pg_inherits WHERE inhparent = 'messages'::regclass")
        .await;
    assert!(
        parts >= 3,
        "{parts} partitions: several days to choose from"
    );
}

/// A day closed by the retention: `CLOSED_DAY` days ago, a week past final.
const CLOSED_DAY: i64 = 9;

/// A ledger holding `turns` turns of the day [`CLOSED_DAY`] days ago, written as the gateway
/// writes them: started in time order, ended out of it (as turns of different lengths end: a
/// fixed shuffle, 1,237 being prime to `turns`), a third of them by a client gone, a fifth
/// stopped at max tokens; each billed 10. (The server, the day, its partition's name, the
/// ledger, the account, the ids in the order they ended.)
struct Day {
    pg: PostgresServer,
    day: Date,
    part: String,
    ledger: PostgresLedger,
    account: String,
    ended: Vec<String>,
}

async fn day_of_turns(turns: usize) -> Day {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 8, Duration::from_secs(60)).expect("url");
    db.migrate().await.expect("migrate");
    let (ledger, account) = ledger_on(&db).await;
    let day = (OffsetDateTime::now_utc() - time::Duration::days(CLOSED_DAY)).date();
    assert!(partitions::create(&db, day).await.expect("a partition"));
    let part = format!("messages_{}", day.to_string().replace('-', ""));
    let start = day.midnight().assume_utc() + time::Duration::hours(9);
    let ids: Vec<String> = (0..turns)
        .map(|i| message_id::mint("msg", start + time::Duration::milliseconds(i as i64 * 37)))
        .collect();
    join_all(ids.iter().map(|id| {
        let at = message_id::created_at(id).expect("a time");
        reserve(&ledger, &account, id, at)
    }))
    .await;
    let ended: Vec<String> = (0..turns).map(|i| ids[i * 1_237 % turns].clone()).collect();
    for (chunk, ids) in ended.chunks(100).enumerate() {
        let billed = join_all(ids.iter().enumerate().map(|(i, id)| {
            let n = chunk * 100 + i;
            let status = if n % 3 == 0 {
                MessageStatus::ClientDisconnected
            } else {
                MessageStatus::Completed
            };
            ledger.settle(Settlement {
                cost: 10,
                latency_ms: 900 + n as u64,
                // Every stop reason a closed row holds as its number (0032 added the last).
                stop_reason: match n % 10 {
                    0 => Some(StopReason::MaxTokens),
                    5 => Some(StopReason::ModelContextWindowExceeded),
                    _ => None,
                },
                // A different number in each count (a swapped column shows in the archive).
                usage: TokenUsage {
                    input_tokens: n as u32,
                    output_tokens: 2 * n as u32 + 1,
                    cache_creation_input_tokens: (n % 7) as u32,
                    cache_read_input_tokens: (n % 11) as u32 + 20,
                    ..TokenUsage::default()
                },
                ..Settlement::nothing(id.clone(), status)
            })
        }))
        .await;
        assert!(billed.iter().all(|b| matches!(b, Ok(10))), "{billed:?}");
    }
    Day {
        pg,
        day,
        part,
        ledger,
        account,
        ended,
    }
}

/// A retention run keeping 30 days closes `day`, and only it.
async fn closes(pg: &PostgresServer, day: Date) {
    let run = retain_keeping(pg, "30", &["--now"], &[]).await;
    assert_eq!(days(&run, "closed"), [day.to_string()], "{run}");
    assert!(days(&run, "close_failed").is_empty(), "{run}");
}

/// A retention run keeping 30 days closes nothing.
async fn closes_nothing(pg: &PostgresServer) {
    let run = retain_keeping(pg, "30", &["--now"], &[]).await;
    assert!(days(&run, "closed").is_empty(), "{run}");
    assert!(days(&run, "close_failed").is_empty(), "{run}");
}

/// The day's rows as `message_rows` reads them, every column, in the export's order.
async fn rows_of(pg: &PostgresServer, day: Date) -> String {
    pg.query(&format!(
        "SELECT * FROM message_rows
         WHERE created_at >= '{day}'::date::timestamp AT TIME ZONE 'UTC'
             AND created_at < '{day}'::date::timestamp AT TIME ZONE 'UTC' + interval '1 day'
         ORDER BY created_at, id"
    ))
    .await
}

/// `gateway ledger export` of `day` into `dir`: its Parquet file's bytes.
async fn exported(pg: &PostgresServer, day: Date, dir: &std::path::Path) -> Vec<u8> {
    let day = day.to_string();
    let dir = dir.to_str().expect("a path");
    pg.gateway_cli_with_env(
        &[
            "ledger", "export", "--from", &day, "--to", &day, "--to-dir", dir,
        ],
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("gateway ledger export: {e}"));
    std::fs::read(format!("{dir}/messages-{day}.parquet")).expect("the day's file")
}

/// A day a week past final, every row of it fitting the compact layout (one written as before
/// 0025, with its names), is moved into `closed_messages` by the retention's next run: under
/// 200 bytes a turn with its indexes, where the open day took about twice that, and read back
/// column for column as before (the view, a lookup by id, the account's recent list, the
/// day's export to the byte). A second run closes nothing; the retention later drops the
/// closed day whole once archived, its manifest's `billed` the day's.
#[tokio::test]
async fn a_day_a_week_past_final_moves_into_the_compact_layout_and_reads_the_same() {
    const TURNS: usize = 10_000;
    let Day {
        pg,
        day,
        part,
        ledger,
        account,
        ended,
        ..
    } = day_of_turns(TURNS).await;
    let closed = format!("closed_{part}");
    // A row as written before 0025: its names, no keys.
    let named = message_id::mint(
        "chatcmpl",
        day.midnight().assume_utc() + time::Duration::hours(20),
    );
    let at = message_id::created_at(&named).expect("a time");
    pg.query(&format!(
        "INSERT INTO messages (id, account_id, key_id, model, served_model, provider, upstream,
             upstream_model, endpoint, stream, status, reserved, billed, input_tokens,
             output_tokens, stop_reason, instance_id, created_at, settled_at, latency_ms,
             batch_id)
         VALUES ('{named}', '{account}', 'key_before', 'svc/old', 'svc/old', 'simulated',
             'simulated-old', 'old-model', 'chat_completions', true, 'completed', 1000, 7, 12,
             34, 'tool_use', 'gw_before', '{}', '{}', 250, 'msgbatch_before')",
        at.format(&time::format_description::well_known::Rfc3339)
            .expect("format"),
        (at + time::Duration::seconds(3))
            .format(&time::format_description::well_known::Rfc3339)
            .expect("format"),
    ))
    .await;
    let rows = TURNS + 1;
    let before = rows_of(&pg, day).await;
    assert_eq!(before.lines().count(), rows);
    let open_rows = ledger_day(&pg, day).await;
    let open_bytes = pg
        .query_i64(&format!("SELECT pg_total_relation_size('{part}')"))
        .await;
    let work = std::env::temp_dir().join(e2e::gateway::unique_name("closed-day"));
    let export_before = exported(&pg, day, &work.join("before")).await;
    assert_archive_matches("the open day's export", &export_before, &open_rows).await;
    let xid_before = pg.query_i64("SELECT txid_current()").await;

    closes(&pg, day).await;

    assert_eq!(
        pg.query_i64(&format!("SELECT count(*) FROM {part}")).await,
        0
    );
    assert_eq!(
        pg.query_i64(&format!("SELECT count(*) FROM {closed}"))
            .await,
        rows as i64
    );
    assert!(
        rows_of(&pg, day).await == before,
        "every row reads as it did, column for column"
    );
    let closed_bytes = pg
        .query_i64(&format!("SELECT pg_total_relation_size('{closed}')"))
        .await;
    let per_turn = closed_bytes / rows as i64;
    assert!(
        per_turn < 200 && closed_bytes * 10 < open_bytes * 6,
        "closed: {per_turn} bytes a turn ({closed_bytes} in all), open: {open_bytes}"
    );
    assert_eq!(
        pg.query(&format!(
            "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname IN ('{part}', '{closed}')"
        ))
        .await,
        "autovacuum_enabled=false\nautovacuum_enabled=false",
        "both autovacuum off"
    );
    assert_eq!(
        pg.query(&format!(
            "SELECT relfrozenxid::text::bigint >= {xid_before} FROM pg_class WHERE relname = '{closed}'"
        ))
        .await,
        "t",
        "every closed row frozen"
    );

    let last = ended.last().expect("a turn");
    let found = ledger
        .message(last)
        .await
        .expect("a lookup")
        .expect("found");
    assert_eq!((found.id.as_str(), found.billed), (last.as_str(), 10));
    let old = ledger
        .message(&named)
        .await
        .expect("a lookup")
        .expect("found");
    assert_eq!(
        (
            old.model.as_str(),
            old.upstream.as_str(),
            old.billed,
            old.batch_id.as_deref()
        ),
        ("svc/old", "simulated-old", 7, Some("msgbatch_before"))
    );
    let recent = ledger.recent_messages(&account, 3).await.expect("a list");
    let newest: Vec<&str> = recent.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(newest[0], named, "newest first: {newest:?}");
    assert_eq!(newest.len(), 3, "{newest:?}");
    let closed_rows = ledger_day(&pg, day).await;
    let export_after = exported(&pg, day, &work.join("after")).await;
    assert_archive_matches("the closed day's export", &export_after, &closed_rows).await;
    assert!(
        export_after == export_before,
        "the day's export is the same file"
    );

    closes_nothing(&pg).await;

    let archive = work.join("archive");
    let dropped = retain_keeping(
        &pg,
        "5",
        &[
            "--now",
            "--ledger-archive-dir",
            archive.to_str().expect("a path"),
        ],
        &[],
    )
    .await;
    assert_eq!(days(&dropped, "dropped"), [day.to_string()], "{dropped}");
    assert_eq!(
        pg.query(&format!(
            "SELECT to_regclass('{part}') IS NULL AND to_regclass('{closed}') IS NULL"
        ))
        .await,
        "t",
        "both partitions dropped"
    );
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(archive.join(format!("messages-{day}.json"))).expect("a manifest"),
    )
    .expect("JSON");
    assert_eq!(manifest["rows"], rows);
    assert_eq!(manifest["billed"], TURNS * 10 + 7);
    assert_archived_file_matches(
        &archive.join(format!("messages-{day}.parquet")),
        &closed_rows,
    )
    .await;
    let _ = std::fs::remove_dir_all(&work);
}

/// A day a week past final that holds a row the compact layout cannot (an id minted before
/// 0020, random) is closed in place: its indexes rebuilt packed (an index a `REINDEX
/// CONCURRENTLY` cut short left invalid dropped first), its rows frozen, its autovacuum off.
/// Every row and credit stays and is found by id; a second run closes nothing.
#[tokio::test]
async fn a_day_the_compact_layout_cannot_hold_is_closed_in_place_indexes_packed_rows_frozen() {
    const TURNS: usize = 10_000;
    let Day {
        pg,
        day,
        part,
        ledger,
        account,
        ended,
        ..
    } = day_of_turns(TURNS).await;
    let random = old_id();
    reserve(
        &ledger,
        &account,
        &random,
        day.midnight().assume_utc() + time::Duration::hours(22),
    )
    .await;
    assert_eq!(settle(&ledger, &random, 10).await, 10);
    let rows = TURNS + 1;
    let totals = format!("SELECT count(*) || '|' || sum(billed) FROM {part}");
    assert_eq!(pg.query(&totals).await, format!("{rows}|{}", rows * 10));
    let index_bytes = format!(
        "SELECT sum(pg_relation_size(indexrelid)) FROM pg_index WHERE indrelid = '{part}'::regclass"
    );
    let before = pg.query_i64(&index_bytes).await;
    // A rebuild cut short: its new index left behind, invalid.
    pg.query(&format!(
        "CREATE INDEX {part}_pkey_ccnew ON {part} (id);
         UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{part}_pkey_ccnew'::regclass"
    ))
    .await;
    let xid_before = pg.query_i64("SELECT txid_current()").await;

    closes(&pg, day).await;

    assert_eq!(
        pg.query(&totals).await,
        format!("{rows}|{}", rows * 10),
        "every row and credit"
    );
    assert_eq!(
        pg.query(&format!("SELECT to_regclass('closed_{part}') IS NULL"))
            .await,
        "t",
        "not moved"
    );
    let after = pg.query_i64(&index_bytes).await;
    assert!(
        after * 10 < before * 8,
        "indexes packed: {before} bytes before, {after} after"
    );
    assert_eq!(
        pg.query(&format!(
            "SELECT string_agg(c.relname || ':' || array_to_string(c.reloptions, ','), ' ' ORDER BY c.relname)
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = '{part}'::regclass"
        ))
        .await,
        format!(
            "{part}_account_id_created_at_idx:fillfactor=100 {part}_instance_id_idx:fillfactor=100 \
             {part}_pkey:fillfactor=100"
        ),
        "the invalid index dropped, the others packed"
    );
    assert_eq!(
        pg.query(&format!(
            "SELECT array_to_string(reloptions, ',') || '|' || (relfrozenxid::text::bigint >= {xid_before})
             FROM pg_class WHERE relname = '{part}'"
        ))
        .await,
        "autovacuum_enabled=false|true",
        "autovacuum off, every row frozen"
    );
    for id in [ended.last().expect("a turn"), &random] {
        let found = ledger.message(id).await.expect("a lookup").expect("found");
        assert_eq!(found.billed, 10, "{id} found by id once closed");
    }

    closes_nothing(&pg).await;
}

/// A close cut short once its move committed (the pod stopped before it froze the day) is
/// finished by the next run: the day listed closed, its rows frozen, its autovacuum off, the
/// move not done twice.
#[tokio::test]
async fn a_close_cut_short_after_its_move_is_finished_by_the_next_run() {
    let Day { pg, day, part, .. } = day_of_turns(1_000).await;
    let closed = format!("closed_{part}");
    assert_eq!(
        pg.query(&format!("SELECT ledger_compact_day('{day}')"))
            .await,
        "t"
    );
    let xid_before = pg.query_i64("SELECT txid_current()").await;
    let totals = format!("SELECT count(*) || '|' || sum(billed) FROM message_rows WHERE created_at >= '{day}' AND created_at < '{day}'::date + 1");
    let moved = pg.query(&totals).await;
    assert_eq!(moved, "1000|10000");

    closes(&pg, day).await;
    assert_eq!(pg.query(&totals).await, moved, "not moved twice");
    assert_eq!(
        pg.query(&format!(
            "SELECT relname || ':' || array_to_string(reloptions, ',') || ':'
                 || (relname <> '{closed}' OR relfrozenxid::text::bigint >= {xid_before})
             FROM pg_class WHERE relname IN ('{part}', '{closed}') ORDER BY relname"
        ))
        .await,
        format!("{closed}:autovacuum_enabled=false:true\n{part}:autovacuum_enabled=false:true"),
    );
}
