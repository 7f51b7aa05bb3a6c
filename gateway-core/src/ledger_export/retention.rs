//! The ledger's retention (`--ledger-retention-days`, default 13 months; the usage rollups are
//! kept forever): each day partition older than the retention is exported to the archive
//! ([`export_day`], which reads the copy back), then detached and dropped whole, once the
//! archived copy, downloaded and decoded again, holds what the day in Postgres holds column
//! for column (per-column checksums over every value, [`partitions::DaySums`], taken with the
//! day's writes blocked). A day whose export fails or does not verify, or whose file differs
//! in any column, stays; with no archive configured nothing is dropped.
//!
//! Every pod runs [`every`]: it creates the days ahead (idempotent), then takes the
//! retention's turn (an advisory lock: one pod at a time) and retains. In the same turn it
//! closes the kept days a week past final ([`partitions::close`]: rows moved into the compact
//! layout, or indexes packed; rows frozen, autovacuum off), a few a run, the newest first.

use std::time::Duration;

use serde::Serialize;
use thiserror::Error;
use time::{Date, OffsetDateTime};
use tokio_util::sync::CancellationToken;

use store::db::{Database, DbError};
use store::ledger::partitions;

use super::{archived_sums, export_day, Destination, ExportError, Manifest};
use crate::telemetry::metrics;

/// How often every pod creates the days ahead and, one pod at a time, retains.
pub const EVERY: Duration = Duration::from_secs(3_600);

/// The most days one run closes: on a steady ledger one a day is due, and a ledger of
/// before is closed back to its oldest day in a few days of runs rather than in one.
const CLOSE_PER_RUN: usize = 2;

/// How long after a day is final it is closed. A closed day's rows have no primary key to
/// refuse a second copy of one: a turn's last write (an allotted turn's row, a void retried
/// until Postgres answers) must have landed long before, and the week's days are the ones the
/// recent lists read first.
const CLOSE_AFTER: Duration = Duration::from_secs(7 * 24 * 3_600);

#[derive(Clone, Debug)]
pub struct Retention {
    /// Days of rows kept: a day is due once it is older than this.
    pub keep_days: u32,
    /// Where due days go before they are dropped; none: nothing is dropped.
    pub archive: Option<Destination>,
    /// No turn runs longer (the reaper's): a day is final once over this long.
    pub longest_turn: Duration,
}

#[derive(Debug, Error)]
pub enum RetentionError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Export(#[from] ExportError),
}

/// What one run did (`gateway ledger retain` prints it).
#[derive(Debug, Default, Serialize)]
pub struct Retained {
    /// Days older than the retention still in Postgres after the run.
    pub awaiting: Vec<String>,
    /// Days exported, verified and dropped, with their manifests.
    pub dropped: Vec<Manifest>,
    /// Days kept because their export or drop failed, and why.
    pub failed: Vec<Failed>,
    /// Days closed by this run (rows moved into the compact layout, or indexes packed; rows
    /// frozen).
    pub closed: Vec<String>,
    /// Days whose close failed, and why (tried again at the next run).
    pub close_failed: Vec<Failed>,
    /// False when another pod held the retention's turn (nothing was done).
    pub ran: bool,
}

#[derive(Debug, Serialize)]
pub struct Failed {
    pub day: String,
    pub error: String,
}

/// The first day kept on `today`.
fn first_kept(today: Date, keep_days: u32) -> Date {
    today.saturating_sub(time::Duration::days(i64::from(keep_days)))
}

/// The days older than the retention that are in Postgres: their partitions, and (rows that
/// fell into the default partition) days without one.
pub async fn due(db: &Database, today: Date, keep_days: u32) -> Result<Vec<Date>, DbError> {
    let first = first_kept(today, keep_days);
    let mut days: Vec<Date> = partitions::days(db)
        .await?
        .into_iter()
        .filter(|&d| d < first)
        .collect();
    days.extend(partitions::days_in_default(db, first).await?);
    days.sort();
    days.dedup();
    Ok(days)
}

/// The first day not closed yet on `now`: the days before it ended [`CLOSE_AFTER`] and
/// `longest_turn` ago or more.
fn first_open(now: OffsetDateTime, longest_turn: Duration) -> Date {
    (now - longest_turn - CLOSE_AFTER).date()
}

/// One retention run, when this pod gets the turn: exports, verifies and drops each due day
/// (oldest first), unless `dry_run` or there is no archive; then closes up to
/// [`CLOSE_PER_RUN`] of the kept days before [`first_open`] (none on a dry run).
pub async fn retain(
    db: &Database,
    retention: &Retention,
    now: OffsetDateTime,
    dry_run: bool,
) -> Result<Retained, RetentionError> {
    let today = now.date();
    let Some(_turn) = partitions::retention_turn(db).await? else {
        return Ok(Retained::default());
    };
    let mut retained = Retained {
        ran: true,
        ..Retained::default()
    };
    let due = due(db, today, retention.keep_days).await?;
    let archive = match (&retention.archive, dry_run) {
        (Some(archive), false) => Some(archive.open()?),
        _ => None,
    };
    let mut awaiting = Vec::new();
    for day in due {
        let Some(target) = &archive else {
            awaiting.push(day);
            continue;
        };
        match archive_day(db, target, day, retention.longest_turn).await {
            Ok(manifest) => retained.dropped.push(manifest),
            Err(e) => {
                tracing::warn!(%day, error = %e, "a ledger day older than the retention is kept: its archive failed");
                retained.failed.push(Failed {
                    day: day.to_string(),
                    error: e.to_string(),
                });
                awaiting.push(day);
            }
        }
    }
    metrics::ledger_partitions_awaiting_archive(awaiting.len());
    retained.awaiting = awaiting.iter().map(Date::to_string).collect();
    if !dry_run {
        close_due(db, retention, now, &mut retained).await?;
    }
    Ok(retained)
}

/// Closes up to [`CLOSE_PER_RUN`] of the days the retention keeps before [`first_open`], the
/// newest first.
async fn close_due(
    db: &Database,
    retention: &Retention,
    now: OffsetDateTime,
    retained: &mut Retained,
) -> Result<(), DbError> {
    let first = first_kept(now.date(), retention.keep_days);
    let open: Vec<Date> = partitions::open_before(db, first_open(now, retention.longest_turn))
        .await?
        .into_iter()
        .filter(|&d| d >= first)
        .collect();
    for &day in open.iter().take(CLOSE_PER_RUN) {
        match partitions::close(db, day).await {
            Ok(how) => {
                tracing::info!(%day, ?how, "ledger day closed");
                retained.closed.push(day.to_string());
            }
            Err(e) => {
                tracing::warn!(%day, error = %e, "could not close a ledger day; retrying at the next run");
                retained.close_failed.push(Failed {
                    day: day.to_string(),
                    error: e.to_string(),
                });
            }
        }
    }
    metrics::ledger_partitions_awaiting_close(open.len().saturating_sub(retained.closed.len()));
    Ok(())
}

/// Gives `day` its own partition (its rows may sit in the default one), exports it, and
/// drops it once the export verified and the archived file, decoded again, still matches the
/// day in Postgres column for column (per-column checksums, not two totals).
async fn archive_day(
    db: &Database,
    target: &super::Target,
    day: Date,
    longest_turn: Duration,
) -> Result<Manifest, ArchiveError> {
    partitions::create(db, day).await?;
    let exported = export_day(db, target, day, longest_turn).await?;
    let manifest = exported.manifest;
    let sums = archived_sums(target, &manifest).await?;
    partitions::drop_exported(db, day, &sums).await?;
    tracing::info!(%day, rows = manifest.rows, billed = manifest.billed, file = %manifest.file, "ledger day archived and dropped");
    Ok(manifest)
}

#[derive(Debug, Error)]
enum ArchiveError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error(transparent)]
    Drop(#[from] partitions::DropError),
}

/// Every [`EVERY`], from now until `draining`: creates today's partition and the next days',
/// then retains. Without an archive it says once that nothing will be dropped.
pub async fn every(db: Database, retention: Retention, draining: CancellationToken) {
    let mut ticks = tokio::time::interval(EVERY);
    let mut told = false;
    loop {
        tokio::select! {
            _ = draining.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let now = OffsetDateTime::now_utc();
        if let Err(e) = partitions::create_ahead(&db, now.date()).await {
            tracing::warn!(error = %e, "could not create the ledger's partitions ahead; retrying at the next run (rows of a day without one go to the default partition)");
        }
        match retain(&db, &retention, now, false).await {
            Ok(retained) if retention.archive.is_none() && !retained.awaiting.is_empty() => {
                if !told {
                    told = true;
                    tracing::warn!(
                        days = retained.awaiting.len(),
                        "ledger days older than --ledger-retention-days are kept: no archive is configured (--ledger-archive-dir or --ledger-archive-s3), and a day is dropped only once archived"
                    );
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "ledger retention failed; retrying at the next run")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_is_due_once_older_than_the_retention() {
        let today = Date::from_calendar_date(2027, time::Month::January, 31).unwrap();
        let first = first_kept(today, 396);
        assert_eq!(first.to_string(), "2025-12-31");
    }

    #[test]
    fn a_day_is_closed_a_week_after_its_longest_turn_has_ended() {
        let midnight = time::macros::datetime!(2027-01-31 00:00 UTC);
        let hour = Duration::from_secs(3_600);
        let week_ago = time::macros::date!(2027 - 01 - 24);
        assert_eq!(first_open(midnight + hour, hour), week_ago);
        assert_eq!(
            first_open(midnight + Duration::from_secs(3_599), hour),
            week_ago.previous_day().unwrap(),
            "the day a week ago is not closed before its last turn is a week past"
        );
    }
}
