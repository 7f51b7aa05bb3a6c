//! The ledger's rows of one UTC day as they are exported (`gateway ledger export`): every
//! column of `messages`, read in pages through a cursor, so a day of millions of rows is never
//! held whole. A row belongs to the day its turn started (`created_at`), like the rollups; a
//! day is exported only once it is final: over for longer than the longest turn (a turn that
//! started before midnight may write its row, or settle it, until then) and with none of its
//! turns still in flight; so the same day read twice gives the same rows in the same order.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};
use thiserror::Error;
use time::{Date, OffsetDateTime};

use crate::db::{from_db, Database, DbError};

/// The bound on each statement of an export, instead of the request paths' database timeout:
/// the first page sorts the whole day, and the export waits behind a migration's lock.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);

/// One `messages` row, column for column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerRow {
    pub id: String,
    pub account_id: String,
    pub key_id: String,
    pub model: String,
    pub served_model: String,
    pub provider: String,
    pub upstream: String,
    pub upstream_model: String,
    pub endpoint: String,
    pub stream: bool,
    pub status: String,
    pub reserved: u64,
    pub billed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub stop_reason: Option<String>,
    pub instance_id: String,
    pub instance_epoch: u64,
    pub created_at: OffsetDateTime,
    pub settled_at: Option<OffsetDateTime>,
    pub latency_ms: Option<u64>,
    pub batch_id: Option<String>,
    pub end_user: Option<String>,
}

#[derive(Debug, Error)]
pub enum DayError {
    #[error("{day} is not final until {final_at} (UTC): a turn started before its end may still write its row")]
    NotFinal { day: Date, final_at: OffsetDateTime },
    #[error("{day} has {turns} turns still in flight; export it once they settle (or the reaper releases them)")]
    InFlight { day: Date, turns: u64 },
    #[error(transparent)]
    Db(#[from] DbError),
}

/// The rows of one day, in `(created_at, id)` order, from one snapshot of the ledger.
pub struct DayRows {
    db: Database,
    tx: Transaction<'static, Postgres>,
}

impl DayRows {
    /// Opens `day` for reading: refused until it has been over for `longest_turn`, and while
    /// it has turns in flight.
    pub async fn open(db: &Database, day: Date, longest_turn: Duration) -> Result<Self, DayError> {
        let next = day.next_day().unwrap_or(day);
        let final_at = next.midnight().assume_utc() + longest_turn;
        if OffsetDateTime::now_utc() < final_at {
            return Err(DayError::NotFinal { day, final_at });
        }
        let mut tx = db.bounded(db.pool().begin()).await?;
        // One snapshot for the check and every page; read only, so it blocks no writer.
        for setting in [
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY".to_owned(),
            format!(
                "SET LOCAL statement_timeout = {}",
                STATEMENT_TIMEOUT.as_millis()
            ),
        ] {
            db.bounded(sqlx::query(&setting).persistent(false).execute(&mut *tx))
                .await?;
        }
        let on_day = in_day(day);
        let in_flight: i64 = db
            .bounded_by(
                STATEMENT_TIMEOUT,
                sqlx::query_scalar(&format!(
                    "SELECT (SELECT count(*) FROM reservations WHERE {on_day})
                         + (SELECT count(*) FROM messages WHERE {on_day} AND status = 'reserved')"
                ))
                .persistent(false)
                .fetch_one(&mut *tx),
            )
            .await?;
        if in_flight > 0 {
            return Err(DayError::InFlight {
                day,
                turns: from_db(in_flight),
            });
        }
        // A cursor takes no bind parameters: the bounds are written in, from a `Date`.
        db.bounded_by(
            STATEMENT_TIMEOUT,
            sqlx::query(&format!(
                "DECLARE day_rows NO SCROLL CURSOR FOR
                 SELECT * FROM message_rows WHERE {on_day} ORDER BY created_at, id"
            ))
            .persistent(false)
            .execute(&mut *tx),
        )
        .await?;
        Ok(Self { db: db.clone(), tx })
    }

    /// The next `size` rows at most; empty once the day is read.
    pub async fn page(&mut self, size: u32) -> Result<Vec<LedgerRow>, DayError> {
        let rows = self
            .db
            .bounded_by(
                STATEMENT_TIMEOUT,
                sqlx::query(&format!("FETCH {size} FROM day_rows"))
                    .persistent(false)
                    .fetch_all(&mut *self.tx),
            )
            .await?;
        rows.iter()
            .map(row_of)
            .collect::<Result<_, _>>()
            .map_err(|e| DayError::Db(DbError::Sql(e)))
    }
}

/// The rows created on `day`, as SQL: from its midnight (UTC) to the next.
fn in_day(day: Date) -> String {
    let next = day.next_day().unwrap_or(day);
    format!("created_at >= '{day} 00:00:00+00' AND created_at < '{next} 00:00:00+00'")
}

fn row_of(row: &PgRow) -> Result<LedgerRow, sqlx::Error> {
    let count = |column: &str| row.try_get::<i64, _>(column).map(from_db);
    Ok(LedgerRow {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        key_id: row.try_get("key_id")?,
        model: row.try_get("model")?,
        served_model: row.try_get("served_model")?,
        provider: row.try_get("provider")?,
        upstream: row.try_get("upstream")?,
        upstream_model: row.try_get("upstream_model")?,
        endpoint: row.try_get("endpoint")?,
        stream: row.try_get("stream")?,
        status: row.try_get("status")?,
        reserved: count("reserved")?,
        billed: count("billed")?,
        input_tokens: count("input_tokens")?,
        output_tokens: count("output_tokens")?,
        cache_creation_input_tokens: count("cache_creation_input_tokens")?,
        cache_read_input_tokens: count("cache_read_input_tokens")?,
        stop_reason: row.try_get("stop_reason")?,
        instance_id: row.try_get("instance_id")?,
        instance_epoch: count("instance_epoch")?,
        created_at: row.try_get("created_at")?,
        settled_at: row.try_get("settled_at")?,
        latency_ms: row.try_get::<Option<i64>, _>("latency_ms")?.map(from_db),
        batch_id: row.try_get("batch_id")?,
        end_user: row.try_get("end_user")?,
    })
}
