//! The day partitions of `messages` (migration 0020): created ahead by every pod, and dropped
//! whole by the retention once their export verified (`gateway_core::ledger_export::retention`).
//!
//! Each statement that changes the partitions waits at most [`LOCK_WAIT`] for its locks: a
//! statement queued for a lock on `messages` makes every turn queue behind it, so it gives up
//! instead and is tried again at the next run.

use std::time::Duration;

use sqlx::{Postgres, Row, Transaction};
use thiserror::Error;
use time::Date;

use crate::db::{from_db, Database, DbError};

/// The longest a partition change waits for a lock before giving up until the next run.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);
/// The bound on each statement of a partition change: dropping waits for the count of a day.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);
/// Days created ahead of today.
pub const DAYS_AHEAD: u8 = 7;

/// A day's rows and the sum of their `billed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DayTotals {
    pub rows: u64,
    pub billed: u64,
}

#[derive(Debug, Error)]
pub enum DropError {
    #[error("{day}: the partition holds {found:?}, its export {exported:?}; not dropped")]
    Mismatch {
        day: Date,
        found: DayTotals,
        exported: DayTotals,
    },
    #[error(transparent)]
    Db(#[from] DbError),
}

/// The name of `day`'s partition.
fn partition(day: Date) -> String {
    format!(
        "messages_{:04}{:02}{:02}",
        day.year(),
        u8::from(day.month()),
        day.day()
    )
}

/// A transaction for a partition change: bounded waits for locks and statements.
async fn change(db: &Database) -> Result<Transaction<'static, Postgres>, DbError> {
    let mut tx = db.bounded(db.pool().begin()).await?;
    for setting in [
        format!("SET LOCAL lock_timeout = {}", LOCK_WAIT.as_millis()),
        format!(
            "SET LOCAL statement_timeout = {}",
            STATEMENT_TIMEOUT.as_millis()
        ),
    ] {
        db.bounded(sqlx::query(&setting).persistent(false).execute(&mut *tx))
            .await?;
    }
    Ok(tx)
}

/// Creates `day`'s partition unless it exists (moving the rows the default partition holds of
/// it); whether it did.
pub async fn create(db: &Database, day: Date) -> Result<bool, DbError> {
    let mut tx = change(db).await?;
    let created: bool = db
        .bounded_by(
            STATEMENT_TIMEOUT,
            sqlx::query_scalar("SELECT ledger_day_partition($1)")
                .bind(day)
                .persistent(false)
                .fetch_one(&mut *tx),
        )
        .await?;
    db.bounded(tx.commit()).await?;
    Ok(created)
}

/// Creates the partitions of `today` and the [`DAYS_AHEAD`] days after it that are missing;
/// how many it created.
pub async fn create_ahead(db: &Database, today: Date) -> Result<u32, DbError> {
    let mut created = 0;
    let mut day = today;
    for _ in 0..=DAYS_AHEAD {
        created += u32::from(create(db, day).await?);
        day = day.next_day().unwrap_or(day);
    }
    Ok(created)
}

/// The days that have a partition, oldest first.
pub async fn days(db: &Database) -> Result<Vec<Date>, DbError> {
    let names: Vec<String> = db
        .bounded(
            sqlx::query_scalar(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'messages'::regclass AND c.relname ~ '^messages_[0-9]{8}$'
                 ORDER BY 1",
            )
            .fetch_all(db.pool()),
        )
        .await?;
    let format = time::macros::format_description!("[year][month][day]");
    Ok(names
        .iter()
        .filter_map(|name| Date::parse(name.trim_start_matches("messages_"), &format).ok())
        .collect())
}

/// The days before `before` whose rows the default partition holds (it is empty unless a
/// row's day had no partition): the retention gives them one, then treats them as any day.
pub async fn days_in_default(db: &Database, before: Date) -> Result<Vec<Date>, DbError> {
    db.bounded(
        sqlx::query_scalar(
            "SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date FROM messages_default
             WHERE created_at < $1::date::timestamp AT TIME ZONE 'UTC' ORDER BY 1",
        )
        .bind(before)
        .fetch_all(db.pool()),
    )
    .await
}

/// Detaches and drops `day`'s partition, if it holds exactly what its export holds (counted
/// with its writes blocked, so no row comes in between); a day with no partition is dropped
/// already. Never deletes a row: the partition goes whole.
pub async fn drop_exported(db: &Database, day: Date, exported: DayTotals) -> Result<(), DropError> {
    let name = partition(day);
    let mut tx = change(db).await?;
    let exists: Option<String> = db
        .bounded(
            sqlx::query_scalar("SELECT to_regclass($1)::text")
                .bind(&name)
                .persistent(false)
                .fetch_one(&mut *tx),
        )
        .await?;
    if exists.is_none() {
        return Ok(());
    }
    // SHARE: no write to the day until the drop; reads go on.
    let lock = format!("LOCK TABLE {name} IN SHARE MODE");
    db.bounded_by(
        STATEMENT_TIMEOUT,
        sqlx::query(&lock).persistent(false).execute(&mut *tx),
    )
    .await?;
    let count =
        format!("SELECT count(*) AS rows, coalesce(sum(billed), 0)::bigint AS billed FROM {name}");
    let row = db
        .bounded_by(
            STATEMENT_TIMEOUT,
            sqlx::query(&count).persistent(false).fetch_one(&mut *tx),
        )
        .await?;
    let found = DayTotals {
        rows: from_db(row.try_get("rows").map_err(DbError::Sql)?),
        billed: from_db(row.try_get("billed").map_err(DbError::Sql)?),
    };
    if found != exported {
        return Err(DropError::Mismatch {
            day,
            found,
            exported,
        });
    }
    for statement in [
        format!("ALTER TABLE messages DETACH PARTITION {name}"),
        format!("DROP TABLE {name}"),
    ] {
        db.bounded_by(
            STATEMENT_TIMEOUT,
            sqlx::query(&statement).persistent(false).execute(&mut *tx),
        )
        .await?;
    }
    db.bounded(tx.commit()).await?;
    Ok(())
}

/// The retention's turn, when no other pod has it: a transaction holding the retention's
/// advisory lock until it ends (a transaction's lock, so it works through a transaction
/// pooler too). `None` when another pod holds it.
pub async fn retention_turn(
    db: &Database,
) -> Result<Option<Transaction<'static, Postgres>>, DbError> {
    let mut tx = db.bounded(db.pool().begin()).await?;
    let ours: bool = db
        .bounded(
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('ledger_retention'))")
                .persistent(false)
                .fetch_one(&mut *tx),
        )
        .await?;
    Ok(ours.then_some(tx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_partition_is_named_by_its_date() {
        let day = Date::from_calendar_date(2026, time::Month::March, 7).unwrap();
        assert_eq!(partition(day), "messages_20260307");
    }
}
