//! The day partitions of `messages` (migration 0020): created ahead by every pod, closed by the
//! retention a week after they ended, and dropped whole by it once their export verified
//! (`gateway_core::ledger_export::retention`).
//!
//! A day is written while its turns run: its rows in the layout writing needs, its indexes
//! taking their entries out of order (a row is written when its turn ends, under the id and time
//! it started with), so their pages split half full and stay so. Once nothing writes it any
//! more, [`close`] makes it what it will be until it is dropped: its rows moved into
//! `closed_messages`, the compact layout (migration 0027), or, when some row cannot be, its
//! indexes rebuilt packed in place; every row frozen, autovacuum off (a frozen day has nothing
//! for it to do; the anti-wraparound pass that still comes every `autovacuum_freeze_max_age`
//! transactions skips its pages, all frozen).
//!
//! Each statement that changes the partitions waits at most [`LOCK_WAIT`] for its locks: a
//! statement queued for a lock on `messages` makes every turn queue behind it, so it gives up
//! instead and is tried again at the next run.

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest, Sha256};
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
/// The bound on each step of closing a day: a day of a busy ledger is tens of GB to freeze
/// and index again.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(6 * 3_600);
/// The reloption that marks a closed day (see [`close`]).
const CLOSED: &str = "autovacuum_enabled=false";

/// Per-column checksums of a day's rows: what the retention compares between its archived file
/// (decoded) and the day in Postgres before it drops the day. For each column, the sum over the
/// rows of the first 8 bytes (big-endian, signed) of SHA-256 of `<id> 0x1F <value>`, the value
/// written as [`DaySums::add`] says; and the row count. A value moved to another row or
/// column, a column shifted or narrowed, a timestamp in another unit: its column's sum
/// differs. Order-free, so both sides add a row at a time in any order, in constant memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaySums {
    pub rows: u64,
    pub columns: BTreeMap<String, i128>,
}

impl DaySums {
    /// Adds the value of `column` in the row `id`, written as text: a text as it is, an
    /// integer in decimal, a boolean `true` or `false`, a timestamp as microseconds since the
    /// Unix epoch in decimal; `None` for NULL. (`rows` is counted by the caller.)
    pub fn add(&mut self, column: &str, id: &str, value: Option<&str>) {
        let mut hash = Sha256::new();
        hash.update(id.as_bytes());
        hash.update([0x1f]);
        match value {
            Some(value) => {
                hash.update(b"+");
                hash.update(value.as_bytes());
            }
            None => hash.update(b"-"),
        }
        let digest = hash.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        *self.columns.entry(column.to_owned()).or_default() +=
            i128::from(i64::from_be_bytes(first));
    }

    /// The columns whose sums differ from `other`'s (one missing on either side included), and
    /// `rows` when the counts do.
    pub fn differing(&self, other: &DaySums) -> Vec<String> {
        let mut names: Vec<&String> = self.columns.keys().chain(other.columns.keys()).collect();
        names.sort();
        names.dedup();
        let mut differing: Vec<String> = names
            .into_iter()
            .filter(|n| self.columns.get(*n) != other.columns.get(*n))
            .cloned()
            .collect();
        if self.rows != other.rows {
            differing.insert(0, format!("rows ({} against {})", self.rows, other.rows));
        }
        differing
    }
}

#[derive(Debug, Error)]
pub enum DropError {
    #[error(
        "{day}: the day in Postgres differs from its archived file in {differing:?}; not dropped"
    )]
    Mismatch { day: Date, differing: Vec<String> },
    #[error("{day}: column {column} of type {kind} has no checksum; not dropped")]
    Unsupported {
        day: Date,
        column: String,
        kind: String,
    },
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A column of `message_rows` as [`DaySums::add`] writes its values, in SQL; `None` for a type
/// it has no form for.
fn value_as_text(column: &str, kind: &str) -> Option<String> {
    let c = format!("\"{}\"", column.replace('"', "\"\""));
    Some(match kind {
        "text" => c,
        "bigint" | "integer" | "smallint" => format!("{c}::text"),
        "boolean" => format!("CASE WHEN {c} THEN 'true' ELSE 'false' END"),
        // Exact: `extract` answers numeric (Postgres 14 on), microseconds are whole.
        "timestamp with time zone" => format!("(extract(epoch FROM {c}) * 1000000)::bigint::text"),
        _ => return None,
    })
}

/// The [`DaySums`] of `day`'s rows as `message_rows` reads them (open and closed layouts
/// alike), every column of the view.
async fn day_sums(
    db: &Database,
    tx: &mut Transaction<'static, Postgres>,
    day: Date,
) -> Result<DaySums, DropError> {
    let columns: Vec<(String, String)> = db
        .bounded(
            sqlx::query_as(
                "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
                 WHERE attrelid = 'message_rows'::regclass AND attnum > 0 AND NOT attisdropped
                 ORDER BY attnum",
            )
            .persistent(false)
            .fetch_all(&mut **tx),
        )
        .await?;
    let mut sums = Vec::new();
    for (i, (column, kind)) in columns.iter().enumerate() {
        let Some(text) = value_as_text(column, kind) else {
            return Err(DropError::Unsupported {
                day,
                column: column.clone(),
                kind: kind.clone(),
            });
        };
        sums.push(format!(
            "coalesce(sum(('x' || encode(substring(sha256(convert_to(
                 id || chr(31) || CASE WHEN {text} IS NULL THEN '-' ELSE '+' || {text} END,
                 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint), 0)::text AS c{i}"
        ));
    }
    let next = day.next_day().unwrap_or(day);
    let query = format!(
        "SELECT count(*) AS rows, {} FROM message_rows
         WHERE created_at >= '{day} 00:00:00+00' AND created_at < '{next} 00:00:00+00'",
        sums.join(", ")
    );
    let row = db
        .bounded_by(
            STATEMENT_TIMEOUT,
            sqlx::query(&query).persistent(false).fetch_one(&mut **tx),
        )
        .await?;
    let mut found = DaySums {
        rows: from_db(row.try_get("rows").map_err(DbError::Sql)?),
        columns: BTreeMap::new(),
    };
    for (i, (column, _)) in columns.iter().enumerate() {
        let sum: String = row.try_get(i + 1).map_err(DbError::Sql)?;
        let sum = sum.parse::<i128>().map_err(|e| {
            DbError::Sql(sqlx::Error::Decode(
                format!("the sum of {column}: {e}").into(),
            ))
        })?;
        found.columns.insert(column.clone(), sum);
    }
    Ok(found)
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

/// A transaction for a partition change: bounded waits for locks, and statements bounded by
/// `statements` on the server.
async fn change(
    db: &Database,
    statements: Duration,
) -> Result<Transaction<'static, Postgres>, DbError> {
    let mut tx = db.bounded(db.pool().begin()).await?;
    for setting in [
        format!("SET LOCAL lock_timeout = {}", LOCK_WAIT.as_millis()),
        format!("SET LOCAL statement_timeout = {}", statements.as_millis()),
    ] {
        db.bounded(sqlx::query(&setting).persistent(false).execute(&mut *tx))
            .await?;
    }
    Ok(tx)
}

/// Creates `day`'s partition unless it exists (moving the rows the default partition holds of
/// it); whether it did.
pub async fn create(db: &Database, day: Date) -> Result<bool, DbError> {
    let mut tx = change(db, STATEMENT_TIMEOUT).await?;
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
    days_of(db, false).await
}

/// The days that have a partition, oldest first; only those not closed when `open`.
async fn days_of(db: &Database, open: bool) -> Result<Vec<Date>, DbError> {
    let names: Vec<String> = db
        .bounded(
            sqlx::query_scalar(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'messages'::regclass AND c.relname ~ '^messages_[0-9]{8}$'
                     AND NOT ($1 AND coalesce(c.reloptions, '{}') @> ARRAY[$2])
                 ORDER BY 1",
            )
            .bind(open)
            .bind(CLOSED)
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

/// Detaches and drops `day`'s partitions (of `messages`, and of `closed_messages` once closed),
/// if they hold exactly what its archived file holds, column for column ([`DaySums`], taken
/// with their writes blocked, so no row comes in between); a day with no partition is dropped
/// already. Never deletes a row: the partitions go whole.
pub async fn drop_exported(db: &Database, day: Date, exported: &DaySums) -> Result<(), DropError> {
    let open = partition(day);
    let closed = format!("closed_{open}");
    let mut tx = change(db, STATEMENT_TIMEOUT).await?;
    let mut parts = Vec::new();
    for (parent, name) in [("messages", &open), ("closed_messages", &closed)] {
        let exists: Option<String> = db
            .bounded(
                sqlx::query_scalar("SELECT to_regclass($1)::text")
                    .bind(name)
                    .persistent(false)
                    .fetch_one(&mut *tx),
            )
            .await?;
        if exists.is_some() {
            parts.push((parent, name));
        }
    }
    if parts.is_empty() {
        return Ok(());
    }
    for (_, name) in &parts {
        // SHARE: no write to the day until the drop; reads go on.
        let lock = format!("LOCK TABLE {name} IN SHARE MODE");
        db.bounded_by(
            STATEMENT_TIMEOUT,
            sqlx::query(&lock).persistent(false).execute(&mut *tx),
        )
        .await?;
    }
    let found = day_sums(db, &mut tx, day).await?;
    let differing = found.differing(exported);
    if !differing.is_empty() {
        return Err(DropError::Mismatch { day, differing });
    }
    for (parent, name) in &parts {
        for statement in [
            format!("ALTER TABLE {parent} DETACH PARTITION {name}"),
            format!("DROP TABLE {name}"),
        ] {
            db.bounded_by(
                STATEMENT_TIMEOUT,
                sqlx::query(&statement).persistent(false).execute(&mut *tx),
            )
            .await?;
        }
    }
    db.bounded(tx.commit()).await?;
    Ok(())
}

/// The days before `before` that have a partition and are not closed, newest first.
pub async fn open_before(db: &Database, before: Date) -> Result<Vec<Date>, DbError> {
    let open = days_of(db, true).await?;
    Ok(open.into_iter().rev().filter(|&d| d < before).collect())
}

/// How a day was closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Its rows moved into `closed_messages`, the compact layout (migration 0027).
    Moved,
    /// Some row does not fit the compact layout (an id of before 0020, a count past
    /// `integer`): its indexes rebuilt packed, in place.
    InPlace,
}

/// Closes `day`, which no turn writes any more: its rows moved into the day's partition of
/// `closed_messages` when they all fit (`ledger_compact_day`, one transaction), else its
/// indexes rebuilt packed (`fillfactor` 100: no entry will come to split them); then its rows
/// frozen and its autovacuum turned off, which marks it closed. Each step can be run again: a
/// close cut short (a timeout, a pod stopping) is done whole at the next run, and an index a
/// `REINDEX CONCURRENTLY` left invalid is dropped first. Turns do not wait on it: the move
/// blocks only writes to the day (there are none) and, for the `TRUNCATE` at its end, reads of
/// it (at most [`LOCK_WAIT`]); the rebuild and the freeze take no lock a turn waits for.
pub async fn close(db: &Database, day: Date) -> Result<Closed, DbError> {
    let name = partition(day);
    for invalid in indexes(db, &name, false).await? {
        maintain(db, &format!("DROP INDEX CONCURRENTLY IF EXISTS {invalid}")).await?;
    }
    let mut tx = change(db, CLOSE_TIMEOUT).await?;
    let moved: bool = db
        .bounded_by(
            CLOSE_TIMEOUT,
            sqlx::query_scalar("SELECT ledger_compact_day($1)")
                .bind(day)
                .persistent(false)
                .fetch_one(&mut *tx),
        )
        .await?;
    db.bounded(tx.commit()).await?;
    let closed = if moved {
        maintain(db, &format!("VACUUM (FREEZE, ANALYZE) closed_{name}")).await?;
        Closed::Moved
    } else {
        let packed: Vec<String> = indexes(db, &name, true)
            .await?
            .iter()
            .map(|index| format!("ALTER INDEX {index} SET (fillfactor = 100)"))
            .collect();
        changed(db, &packed).await?;
        maintain(db, &format!("VACUUM (FREEZE, ANALYZE) {name}")).await?;
        maintain(db, &format!("REINDEX TABLE CONCURRENTLY {name}")).await?;
        Closed::InPlace
    };
    changed(
        db,
        &[format!("ALTER TABLE {name} SET ({CLOSED}, toast.{CLOSED})")],
    )
    .await?;
    Ok(closed)
}

/// Runs `statements` in one partition change.
async fn changed(db: &Database, statements: &[String]) -> Result<(), DbError> {
    let mut tx = change(db, STATEMENT_TIMEOUT).await?;
    for statement in statements {
        db.bounded(sqlx::query(statement).persistent(false).execute(&mut *tx))
            .await?;
    }
    db.bounded(tx.commit()).await
}

/// The indexes of the table `name`, valid or left invalid by a `REINDEX CONCURRENTLY` cut
/// short.
async fn indexes(db: &Database, name: &str, valid: bool) -> Result<Vec<String>, DbError> {
    db.bounded(
        sqlx::query_scalar(
            "SELECT i.indexrelid::regclass::text FROM pg_index i
             WHERE i.indrelid = to_regclass($1) AND i.indisvalid = $2 ORDER BY 1",
        )
        .bind(name)
        .bind(valid)
        .persistent(false)
        .fetch_all(db.pool()),
    )
    .await
}

/// A maintenance command of [`close`], bounded by [`CLOSE_TIMEOUT`].
async fn maintain(db: &Database, sql: &str) -> Result<(), DbError> {
    db.bounded_by(CLOSE_TIMEOUT, db.pool().maintain(sql, CLOSE_TIMEOUT))
        .await
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
