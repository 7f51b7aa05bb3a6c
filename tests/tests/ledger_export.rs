//! `gateway ledger export` (issue 35, retention with export): each UTC day of ledger rows as
//! one Parquet file with a manifest (rows, sum of `billed`, size, SHA-256), to a folder or to
//! an S3-compatible bucket (moto). A day's rows are those its turns started on, a turn that
//! settled after midnight included; a day not over, or with a turn still in flight, is
//! refused; the export reads the destination's copy back before it writes the manifest, and
//! a day exported again is not uploaded again unless its copy there no longer verifies. Each
//! file is decoded by a second implementation (pyarrow, `e2e::archive`): the schema
//! docs/ledger.md documents, every column of every row equal to the ledger's.

use std::path::Path;
use std::time::Duration;

use e2e::archive::{assert_archive_matches, ledger_day};
use e2e::gateway::unique_name;
use e2e::ledger::{funded, reserve_at, settle};
use e2e::s3::{S3Server, CREDENTIALS};
use e2e::PostgresServer;
use serde_json::Value;
use sha2::{Digest, Sha256};
use store::db::Database;
use store::ledger::PostgresLedger;
use time::{Date, OffsetDateTime, Time};

/// More than one page (10,000 rows) and one row group of the export.
const BULK_ROWS: i64 = 25_000;

/// A ledger filled by the ledger's own statements over three past days (and today), plus a
/// day of bulk rows; one turn of yesterday still in flight.
struct Filled {
    pg: PostgresServer,
    /// The days exported: three days ago (bulk rows), two days ago, yesterday.
    days: [Date; 3],
    /// A second process (pod), to settle yesterday's last turn after midnight.
    settling: PostgresLedger,
}

async fn turn(ledger: &PostgresLedger, account: &str, id: &str, at: OffsetDateTime) {
    reserve_at(ledger, account, "key_export", id, at).await;
}

async fn filled() -> Filled {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(5)).expect("url");
    db.migrate().await.expect("migrate");
    let (ledger, account) = funded(&db, "export", 100_000_000).await;
    let mut now = OffsetDateTime::now_utc();
    let final_at = now.replace_time(Time::MIDNIGHT) + time::Duration::minutes(2);
    if now < final_at {
        // Yesterday is final a minute after midnight (`export`).
        tokio::time::sleep((final_at - now).unsigned_abs()).await;
        now = OffsetDateTime::now_utc();
    }
    let midnight = now.replace_time(Time::MIDNIGHT);
    let day = |back: i64| (midnight - time::Duration::days(back)).date();
    let days = [day(3), day(2), day(1)];

    // Two days ago: three turns through reserve and settle.
    for (i, cost) in [100, 200, 300].into_iter().enumerate() {
        let id = format!("msg_two_days_ago_{i}");
        let at = midnight - time::Duration::days(2) + time::Duration::hours(10 + i as i64);
        turn(&ledger, &account, &id, at).await;
        settle(&ledger, &id, cost).await;
    }
    // Yesterday: one turn settled, one started a second before midnight, still running.
    let at = midnight - time::Duration::hours(5);
    turn(&ledger, &account, "msg_yesterday", at).await;
    settle(&ledger, "msg_yesterday", 50).await;
    turn(
        &ledger,
        &account,
        "msg_across_midnight",
        midnight - time::Duration::seconds(1),
    )
    .await;
    // Today: not exportable yet.
    turn(&ledger, &account, "msg_today", now).await;
    settle(&ledger, "msg_today", 70).await;
    // Three days ago: bulk rows, more than a page of the export.
    pg.query(&format!(
        "INSERT INTO messages (id, account_id, key_id, model, served_model, provider, upstream,
             upstream_model, endpoint, stream, status, reserved, billed, input_tokens,
             output_tokens, instance_id, created_at, settled_at, latency_ms)
         SELECT 'msg_bulk_' || i, '{account}', 'key_bulk', 'svc/haiku', 'svc/haiku', 'simulated',
             'simulated', 'simulated-haiku', 'messages', i % 2 = 0, 'completed', 1000, i % 997,
             i, i % 300, 'inst_bulk', '{} 00:00:00+00'::timestamptz + i * interval '3 seconds',
             '{} 00:00:00+00'::timestamptz + i * interval '3 seconds' + interval '1 second', 7
         FROM generate_series(1, {BULK_ROWS}) i",
        days[0], days[0]
    ))
    .await;
    let settling = PostgresLedger::new(db);
    settling.heartbeat().await.expect("heartbeat");
    Filled { pg, days, settling }
}

/// What the ledger holds for `day`: rows and sum of `billed`.
async fn day_totals(pg: &PostgresServer, day: Date) -> (u64, u64) {
    let text = pg
        .query(&format!(
            "SELECT count(*) || '|' || coalesce(sum(billed), 0) FROM messages
             WHERE (created_at AT TIME ZONE 'UTC')::date = '{day}'"
        ))
        .await;
    let (rows, billed) = text.split_once('|').expect("two numbers");
    (rows.parse().expect("rows"), billed.parse().expect("billed"))
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn export(
    pg: &PostgresServer,
    days: (Date, Date),
    destination: &[&str],
    env: &[(&str, &str)],
) -> Result<Value, String> {
    let (from, to) = (days.0.to_string(), days.1.to_string());
    // Turns here are short: a day is final a minute after its end (`filled` keeps clear of
    // that minute).
    let mut args = vec!["ledger", "export", "--from", &from, "--to", &to];
    if !destination.contains(&"--reaper-max-turn-secs") {
        args.extend_from_slice(&["--reaper-max-turn-secs", "60"]);
    }
    args.extend_from_slice(destination);
    pg.gateway_cli_with_env(&args, env).await
}

/// The manifest the export printed for `day`, checked against the ledger's rows and against
/// the file and manifest found at the destination (`read(name)`); the file decoded by pyarrow
/// and held to docs/ledger.md's schema and to the ledger's rows, column for column.
async fn check_day(pg: &PostgresServer, printed: &Value, day: Date, stored: (Vec<u8>, Vec<u8>)) {
    let manifest = printed["days"]
        .as_array()
        .expect("days")
        .iter()
        .find(|d| d["day"] == day.to_string())
        .unwrap_or_else(|| panic!("no manifest for {day}: {printed}"));
    let (rows, billed) = day_totals(pg, day).await;
    assert_eq!(
        (manifest["rows"].as_u64(), manifest["billed"].as_u64()),
        (Some(rows), Some(billed)),
        "{day}: {manifest}"
    );
    let (file, stored_manifest) = stored;
    assert_eq!(manifest["file"], format!("messages-{day}.parquet"));
    assert_eq!(manifest["bytes"].as_u64(), Some(file.len() as u64));
    assert_eq!(manifest["sha256"], sha256(&file), "{day}");
    assert!(file.starts_with(b"PAR1"), "{day}: not a Parquet file");
    let stored_manifest: Value = serde_json::from_slice(&stored_manifest).expect("manifest JSON");
    for field in ["day", "file", "rows", "billed", "bytes", "sha256"] {
        assert_eq!(stored_manifest[field], manifest[field], "{field} of {day}");
    }
    // A second reader: every column of every row, and the documented schema.
    let what = format!("messages-{day}.parquet");
    assert_archive_matches(&what, &file, &ledger_day(pg, day).await).await;
}

fn written(printed: &Value) -> Vec<bool> {
    printed["days"]
        .as_array()
        .expect("days")
        .iter()
        .map(|d| d["written"].as_bool().expect("written"))
        .collect()
}

fn read_dir_files(dir: &Path, day: Date) -> (Vec<u8>, Vec<u8>) {
    let read =
        |name: String| std::fs::read(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    (
        read(format!("messages-{day}.parquet")),
        read(format!("messages-{day}.json")),
    )
}

#[tokio::test]
async fn each_day_is_one_verified_file_with_its_rows_and_credits_and_exporting_again_changes_nothing(
) {
    let filled = filled().await;
    let pg = &filled.pg;
    let [first, _, yesterday] = filled.days;
    let dir = std::env::temp_dir().join(unique_name("ledger-export"));
    let to_dir = ["--to-dir", dir.to_str().expect("utf-8 path")];

    // Yesterday's last turn is still running: its day is not final, so it is refused.
    let refused = export(pg, (yesterday, yesterday), &to_dir, &[])
        .await
        .expect_err("a day with a turn in flight");
    assert!(refused.contains("still in flight"), "{refused}");
    // Today is not over; yesterday is, but not for as long as turns may run.
    let today = OffsetDateTime::now_utc().date();
    let refused = export(pg, (today, today), &to_dir, &[])
        .await
        .expect_err("today");
    assert!(refused.contains("not final"), "{refused}");
    let two_days = [to_dir[0], to_dir[1], "--reaper-max-turn-secs", "172800"];
    let refused = export(pg, (yesterday, yesterday), &two_days, &[])
        .await
        .expect_err("a day over for less than the longest turn");
    assert!(
        refused.contains(&format!("{yesterday} is not final")),
        "{refused}"
    );

    // It settles after midnight, on another process: it belongs to yesterday, with its bill.
    assert_eq!(
        settle(&filled.settling, "msg_across_midnight", 600).await,
        600
    );
    let printed = export(pg, (first, yesterday), &to_dir, &[])
        .await
        .expect("export");
    assert_eq!(written(&printed), [true, true, true], "{printed}");
    for day in filled.days {
        check_day(pg, &printed, day, read_dir_files(&dir, day)).await;
    }
    let days = printed["days"].as_array().expect("days");
    assert_eq!(days[0]["rows"], BULK_ROWS, "every page of the bulk day");
    assert_eq!(
        (days[1]["rows"].as_u64(), days[1]["billed"].as_u64()),
        (Some(3), Some(600))
    );
    assert_eq!(
        (days[2]["rows"].as_u64(), days[2]["billed"].as_u64()),
        (Some(2), Some(650)),
        "yesterday holds the turn settled after midnight: {printed}"
    );

    // Again: the same files; nothing uploaded, each verified.
    let before: Vec<_> = filled
        .days
        .iter()
        .map(|d| read_dir_files(&dir, *d))
        .collect();
    let again = export(pg, (first, yesterday), &to_dir, &[])
        .await
        .expect("export again");
    assert_eq!(written(&again), [false, false, false], "{again}");
    let after: Vec<_> = filled
        .days
        .iter()
        .map(|d| read_dir_files(&dir, *d))
        .collect();
    assert!(before == after, "exporting again changed the files");

    // A damaged copy no longer verifies: the next export writes it again.
    let damaged = dir.join(format!("messages-{first}.parquet"));
    let mut bytes = std::fs::read(&damaged).expect("file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&damaged, bytes).expect("damage");
    let repaired = export(pg, (first, first), &to_dir, &[])
        .await
        .expect("export over a damaged copy");
    assert_eq!(written(&repaired), [true], "{repaired}");
    assert!(
        read_dir_files(&dir, first) == before[0],
        "the copy is whole again"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_day_exports_to_an_s3_compatible_bucket_verified_and_idempotent() {
    let filled = filled().await;
    let pg = &filled.pg;
    let s3 = S3Server::start().await;
    s3.create_bucket("ledger").await;
    let endpoint = s3.url();
    let to_s3 = ["--to-s3", "s3://ledger/exports", "--s3-endpoint", &endpoint];
    let [first, _, yesterday] = filled.days;
    settle(&filled.settling, "msg_across_midnight", 600).await;

    let stored = |day: Date| {
        let s3 = &s3;
        async move {
            let object = |name: String| async move {
                s3.object("ledger", &format!("exports/{name}"))
                    .await
                    .unwrap_or_else(|| panic!("no {name} in the bucket\n{}", s3.logs()))
            };
            (
                object(format!("messages-{day}.parquet")).await,
                object(format!("messages-{day}.json")).await,
            )
        }
    };
    let printed = export(pg, (first, yesterday), &to_s3, &CREDENTIALS)
        .await
        .unwrap_or_else(|e| panic!("export to moto: {e}\n{}", s3.logs()));
    assert_eq!(written(&printed), [true, true, true], "{printed}");
    for day in filled.days {
        check_day(pg, &printed, day, stored(day).await).await;
    }

    let again = export(pg, (first, yesterday), &to_s3, &CREDENTIALS)
        .await
        .expect("export again");
    assert_eq!(written(&again), [false, false, false], "{again}");

    // Damaged in the bucket: read back, found wrong, uploaded again.
    let (file, _) = stored(yesterday).await;
    s3.put_object(
        "ledger",
        &format!("exports/messages-{yesterday}.parquet"),
        b"PAR1 not the export".to_vec(),
    )
    .await;
    let repaired = export(pg, (yesterday, yesterday), &to_s3, &CREDENTIALS)
        .await
        .expect("export over a damaged copy");
    assert_eq!(written(&repaired), [true], "{repaired}");
    assert!(stored(yesterday).await.0 == file, "the copy is whole again");

    // No bucket there: an error, no manifest claimed.
    let missing = [
        "--to-s3",
        "s3://no-such-bucket/x",
        "--s3-endpoint",
        &endpoint,
    ];
    let failed = export(pg, (first, first), &missing, &CREDENTIALS)
        .await
        .expect_err("a missing bucket");
    assert!(failed.contains("destination"), "{failed}");

    // Credentials in the endpoint's URL: refused, and neither echoed.
    let with_credentials = endpoint.replacen("://", "://leaked-user:leaked-secret@", 1);
    let credentialed = [
        "--to-s3",
        "s3://ledger/exports",
        "--s3-endpoint",
        &with_credentials,
    ];
    let failed = export(pg, (first, first), &credentialed, &CREDENTIALS)
        .await
        .expect_err("credentials in the endpoint");
    assert!(failed.contains("carries credentials"), "{failed}");
    assert!(
        !failed.contains("leaked-secret") && !failed.contains("leaked-user"),
        "the credentials echoed: {failed}"
    );
}

/// The export's statements are a job's, not a request's: the first page sorts a whole day,
/// and a migration may hold the table meanwhile. Behind a lock held three times the database
/// timeout, the export waits and succeeds instead of timing out.
#[tokio::test]
async fn an_export_waits_out_longer_than_the_request_paths_database_timeout() {
    let filled = filled().await;
    let pg = &filled.pg;
    let [first, _, _] = filled.days;
    let dir = std::env::temp_dir().join(unique_name("ledger-export"));
    let held = pg
        .hold_locks("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .await;
    let exporting = async {
        let args = [
            "--to-dir",
            dir.to_str().expect("utf-8 path"),
            "--database-timeout-ms",
            "500",
        ];
        export(pg, (first, first), &args, &[]).await
    };
    let releasing = async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        held.release().await;
    };
    let (exported, ()) = tokio::join!(exporting, releasing);
    let exported = exported.expect("an export behind a lock");
    assert_eq!(exported["days"][0]["rows"], BULK_ROWS, "{exported}");
    let _ = std::fs::remove_dir_all(&dir);
}
