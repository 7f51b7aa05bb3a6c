//! The Postgres ledger of cluster mode. Every money movement is one statement, so it is atomic
//! without a client-side transaction and costs one round trip:
//! - reserve locks the account row, holds what the balance allows and writes the message row,
//!   all or nothing; concurrent reservations queue on the row lock, so none can overdraw;
//! - settle moves the message out of `reserved` and debits the account in the same statement,
//!   so a replay (or a racing reaper) finds nothing left to settle;
//! - both run batched: the turns waiting when a lane frees up share one statement and one
//!   commit ([`turns`]), which is what lets one Postgres carry thousands of turns a second;
//! - a top-up is inserted (or a pending one confirmed) and credited in one statement, keyed
//!   by its unique payment reference.
//!
//! - with allotments ([`allotment`], `--allotment-turns`), the turns of a busy account take
//!   their credits from what this process holds for it, and their rows are written after the
//!   turn, so neither statement waits on the request path.
//!
//! Each process holds a lease, its row in `gateway_instances`, renewed by a heartbeat; the
//! reaper deletes the lease of a process that stopped beating and releases the reservations
//! and allotments of leases that are gone ([`lease`], `PostgresLedger::reap`). Allotments and
//! reservations carry the lease's epoch, and a refill or a write under a lease that is gone is
//! refused by Postgres.
//!
//! What a client is told a turn cost is what the ledger bills: a turn's bill is told only once
//! Postgres has recorded it; when it cannot be confirmed the client is told 0 and the turn is
//! voided (written `unbilled`, billed nothing, whatever the unconfirmed statement did).

/// The last CTE of a statement that makes message rows final (or changes a final row's bill):
/// adds what those rows change to their `usage_rollups` rows (migration 0015), one upsert in
/// the statement's own transaction, so the rollups are never behind the books. `$source` is
/// a query of the rows' `account_id, key_id, model, created_at, batch_id, status, billed`
/// and token columns, and a `sign`: 1 for a row's final state, -1 for a final state it
/// leaves. Last in the statement, and its source joined to the statement's locked accounts
/// where it has them: Postgres runs the unread CTEs in their order, so a rollup row is only
/// ever locked after its account row, and in key order (the `ORDER BY`): no deadlock.
macro_rules! rolled_up {
    ($source:literal) => {
        concat!(
            "rolled_up AS (
                 INSERT INTO usage_rollups AS r (account_id, hour, key_id, model, turns, errors,
                     input_tokens, output_tokens, cache_creation_input_tokens,
                     cache_read_input_tokens, credits, batch_turns, batch_credits)
                 SELECT account_id, date_trunc('hour', created_at, 'UTC'), key_id, model,
                     sum(sign * served), sum(sign * (1 - served)),
                     sum(sign * served * input_tokens), sum(sign * served * output_tokens),
                     sum(sign * served * cache_creation_input_tokens),
                     sum(sign * served * cache_read_input_tokens),
                     sum(sign * billed),
                     coalesce(sum(sign * served) FILTER (WHERE batch_id IS NOT NULL), 0),
                     coalesce(sum(sign * billed) FILTER (WHERE batch_id IS NOT NULL), 0)
                 FROM (SELECT *, (status NOT IN ('failed', 'abandoned'))::int AS served
                       FROM (",
            $source,
            ") final) d
                 GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
                 ON CONFLICT (account_id, hour, key_id, model) DO UPDATE SET
                     turns = r.turns + EXCLUDED.turns, errors = r.errors + EXCLUDED.errors,
                     input_tokens = r.input_tokens + EXCLUDED.input_tokens,
                     output_tokens = r.output_tokens + EXCLUDED.output_tokens,
                     cache_creation_input_tokens =
                         r.cache_creation_input_tokens + EXCLUDED.cache_creation_input_tokens,
                     cache_read_input_tokens =
                         r.cache_read_input_tokens + EXCLUDED.cache_read_input_tokens,
                     credits = r.credits + EXCLUDED.credits,
                     batch_turns = r.batch_turns + EXCLUDED.batch_turns,
                     batch_credits = r.batch_credits + EXCLUDED.batch_credits
             )"
        )
    };
}

/// The row a turn held in `ended` (a `DELETE … RETURNING` of `reservations`, with the turn's
/// `status`, `billed`, usage and serving `upstream_id`) ends as, inserted into `messages` once
/// (migration 0026); returns what the rollups read of it.
macro_rules! written {
    () => {
        "INSERT INTO messages (id, account_id, key_id, route_id, upstream_id, stream, status,
             reserved, billed, input_tokens, output_tokens, cache_creation_input_tokens,
             cache_read_input_tokens, stop_reason, latency_ms, instance_id, instance_epoch,
             created_at, settled_at, batch_id, end_user)
         SELECT id, account_id, key_id, route_id, upstream_id, stream, status, reserved, billed,
             input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
             stop_reason, latency_ms, instance_id, instance_epoch, created_at, now(), batch_id,
             end_user
         FROM ended
         RETURNING id, account_id, key_id, reserved, billed,
             message_model(route_id, model) AS model, created_at, batch_id, status,
             input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens"
    };
}

/// The `RETURNING` of a `DELETE` of `reservations` whose turns end `$status` (a SQL string
/// literal), billed nothing and with no usage: the `ended` rows [`written`] reads.
macro_rules! ended_billing_nothing {
    ($status:literal) => {
        concat!(
            "RETURNING id, account_id, key_id, route_id, upstream_id, stream, ",
            $status,
            " AS status, reserved, 0::bigint AS billed, 0::bigint AS input_tokens,
             0::bigint AS output_tokens, 0::bigint AS cache_creation_input_tokens,
             0::bigint AS cache_read_input_tokens, NULL::text AS stop_reason,
             NULL::bigint AS latency_ms, instance_id, instance_epoch, created_at, batch_id,
             end_user"
        )
    };
}

mod allotment;
mod lease;
mod name_keys;
mod reversals;
mod turns;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;
use time::{Date, OffsetDateTime, Time};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::allotment::{Grow, Pools, Release, Written, IDLE};
use self::lease::Lease;
use self::name_keys::NameKeys;
use super::coalesce::Coalescer;
use super::message_id;
use super::{
    audited, Balance, Confirmation, DisputeStage, EndUserUsageRow, KeySpend, Ledger, LedgerError,
    MessageRecord, MessageStatus, NewReservation, NewTopUp, Reversal, Settlement, TopUp, UsageRow,
    UsageTotals,
};
use crate::audit::{append_in, Actor};
use crate::db::{from_db, parse_name, to_db, Database, DbError};
use crate::ids;
use crate::metrics;
use crate::usage::{StopReason, TokenUsage};

const STATUSES: [MessageStatus; 7] = [
    MessageStatus::Reserved,
    MessageStatus::Completed,
    MessageStatus::ClientDisconnected,
    MessageStatus::Interrupted,
    MessageStatus::Failed,
    MessageStatus::Abandoned,
    MessageStatus::Unbilled,
];

const STOP_REASONS: [StopReason; 5] = [
    StopReason::EndTurn,
    StopReason::MaxTokens,
    StopReason::StopSequence,
    StopReason::ToolUse,
    StopReason::ModelContextWindowExceeded,
];

const ENDPOINTS: [&str; 6] = [
    "messages",
    "chat_completions",
    "responses",
    "message_batches",
    "chat_completions_batches",
    "responses_batches",
];

/// How far back the recent messages are looked for first (see `recent_messages`).
const RECENT: Duration = Duration::from_secs(7 * 24 * 3_600);

/// The most turns one reserve or settle statement carries.
const MAX_BATCH: usize = 128;

/// Reserve (and settle) statements in flight at once per process. One is the fastest measured
/// (docs/benchmarks.md, "Ledger with Postgres (1,000 accounts)"): more lanes mean smaller
/// batches, so more commits and more Postgres backends competing for the cores, which costs
/// more than the wait for the lane saves (1 lane: 6,400 turns/s, and p99 2.9 ms at 2,000
/// turns/s; 2 lanes: 3,800 and 6 ms; 8 lanes: 2,100 and 18 ms).
/// Each lane holds one pooled connection while it runs, the rest of the pool serves reads.
const LANES: usize = 1;

/// How long a stopping process waits for its last voids (see [`PostgresLedger::void`]) to
/// land; it keeps its lease meanwhile.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// The statement of a lookup by an id that carries its time (`$1` the id, `$2` the time it
/// carries): the view of every row, open and closed, pruned to that time's partitions. Public
/// so that a test EXPLAINs the statement the lookup runs, not a copy of it.
pub const MESSAGE_BY_TIMED_ID: &str =
    "SELECT * FROM message_rows WHERE id = $1 AND created_at = $2";

/// How many times a stopping process tries to return its allotments.
const CLOSE_RETURN_ATTEMPTS: usize = 4;

/// The longest pause between two attempts of a void.
const VOID_RETRY_MAX: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct PostgresLedger {
    db: Database,
    lease: Arc<Lease>,
    /// The keys of the route and upstream names this process' rows carry.
    names: Arc<NameKeys>,
    reserves: Coalescer<NewReservation, Result<u64, LedgerError>>,
    settles: Coalescer<Settlement, Result<Option<u64>, LedgerError>>,
    allotting: Option<Arc<Allotting>>,
    /// Voids still trying to land; a stopping process waits for them.
    voids: TaskTracker,
}

/// The allotments of this process.
struct Allotting {
    pools: Pools,
    writes: Coalescer<Written, Result<Option<u64>, LedgerError>>,
    stop: CancellationToken,
    /// Allotments whose return failed: retried at the next tick, and at close.
    unreturned: Mutex<Vec<Release>>,
    /// The loop returning idle allotments; close waits for it, so that no return is in flight
    /// (and no failure unrecorded) when close returns the rest.
    returning: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Allotting {
    fn unreturned(&self) -> std::sync::MutexGuard<'_, Vec<Release>> {
        self.unreturned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The allotments to return now: those whose return failed, and those idle for `idle`.
    fn due(&self, idle: Duration) -> Vec<Release> {
        let failed = std::mem::take(&mut *self.unreturned());
        failed.into_iter().chain(self.pools.idle(idle)).collect()
    }
}

impl PostgresLedger {
    /// Starts the batching of reserves and settles (needs a Tokio runtime).
    pub fn new(db: Database) -> Self {
        let lease = Arc::new(Lease::new(ids::instance()));
        let names = Arc::new(NameKeys::default());
        let reserves = coalescer(
            &db,
            &lease,
            &names,
            |r: &NewReservation| r.record.id.as_str(),
            |db, lease, names, batch| async move { turns::reserve(&db, &lease, &names, batch).await },
        );
        let settles = coalescer(
            &db,
            &lease,
            &names,
            |s: &Settlement| s.message_id.as_str(),
            |db, _, names, batch| async move { turns::settle(&db, &names, &batch).await },
        );
        Self {
            db,
            lease,
            names,
            reserves,
            settles,
            allotting: None,
            voids: TaskTracker::new(),
        }
    }

    /// Serves busy accounts' turns from allotments of about `turns` turns each (0: every turn
    /// reserved in Postgres), usable for `fresh_for` after each heartbeat.
    pub fn with_allotments(mut self, turns: u64, fresh_for: Duration) -> Self {
        if turns == 0 {
            return self;
        }
        let writes = coalescer(
            &self.db,
            &self.lease,
            &self.names,
            |w: &Written| w.record.id.as_str(),
            |db, lease, names, batch| async move { turns::write(&db, &lease.id, &names, &batch).await },
        );
        let allotting = Arc::new(Allotting {
            pools: Pools::new(turns, fresh_for),
            writes,
            stop: CancellationToken::new(),
            unreturned: Mutex::new(Vec::new()),
            returning: Mutex::new(None),
        });
        self.allotting = Some(allotting.clone());
        let returning = tokio::spawn(self.clone().return_idle_allotments());
        *allotting
            .returning
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(returning);
        self
    }

    /// Takes the turn's credits from its account's allotment, growing it first when it falls
    /// short (once). `None`: reserve the turn in Postgres.
    async fn take(&self, a: &Allotting, r: &NewReservation) -> Result<Option<u64>, LedgerError> {
        let mut take = a.pools.take(r, true);
        if let (None, Some(grow)) = (take.amount, &take.grow) {
            match self.grow(grow).await {
                Ok(()) => {}
                // Postgres refused the refill: the account's check (`reserved <= balance`) when
                // other turns took its last credits meanwhile. Not an outage: the turn is
                // reserved on its own below, which answers 402 when the credits are short.
                Err(LedgerError::Refused(constraint)) => {
                    tracing::warn!(%constraint, account_id = %grow.account_id, "allotment refill refused; the turn is reserved on its own");
                }
                Err(e) => return Err(e),
            }
            take = a.pools.take(r, false);
        }
        if let Some(grow) = take.grow {
            let ledger = self.clone();
            tokio::spawn(async move {
                if let Err(e) = ledger.grow(&grow).await {
                    tracing::warn!(error = %e, "could not grow an allotment");
                }
            });
        }
        Ok(take.amount)
    }

    async fn grow(&self, g: &Grow) -> Result<(), LedgerError> {
        let refilled = allotment::grow(&self.db, &self.lease.id, g).await;
        if let Some(a) = &self.allotting {
            a.pools.refilled(g, refilled.as_ref().ok().copied());
        }
        refilled.map(drop).map_err(LedgerError::from)
    }

    /// Writes an allotted turn's row before its bill is told: what Postgres recorded is what
    /// the turn is told it cost (nothing when its allotment or lease is gone). When the write
    /// cannot be confirmed, the turn is voided and told 0.
    async fn write(&self, a: &Allotting, w: Written) -> u64 {
        match self.batched(&a.writes, w.clone()).await {
            Ok(Some(billed)) => {
                if billed < w.record.billed {
                    // Refused: the allotment was returned (its lease is gone) or holds less
                    // than this process counts on; no turn takes from it any more.
                    tracing::warn!(message_id = %w.record.id, "allotment refused a turn's bill; written unbilled");
                    a.pools.forsake(&w.pool);
                }
                a.pools.written(&w);
                billed
            }
            Ok(None) => {
                // A row under its id was there already: what it says is not this write's to
                // tell, so the turn is voided like an unconfirmed one (the void marks it
                // written).
                self.void(w.record.id.clone(), Some(w));
                0
            }
            Err(e) => {
                tracing::warn!(error = %e, message_id = %w.record.id, "could not write a settled turn; voided, told 0");
                a.pools.forsake(&w.pool);
                self.void(w.record.id.clone(), Some(w));
                0
            }
        }
    }

    /// Makes a turn whose bill could not be confirmed billed nothing, for good: its row ends
    /// `unbilled` with nothing billed, what it held released and what an unconfirmed
    /// statement of it did billed back. Runs in the background, retrying until it lands (a
    /// stopping process waits for it): its client has been told 0. A void that Postgres
    /// refuses (a constraint) cannot land by retrying: it is reported and counted.
    fn void(&self, message_id: String, written: Option<Written>) {
        let ledger = self.clone();
        self.voids.spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                match ledger.void_once(&message_id, written.as_ref()).await {
                    Ok(()) => break,
                    Err(e) if e.constraint().is_some() => {
                        metrics::ledger_refused("void");
                        tracing::error!(error = %e, %message_id, "void refused by the ledger; not retried: the row is marked unbilled, what it holds stays held for an operator");
                        if let Err(e) = turns::mark_unbilled(&ledger.db, &message_id).await {
                            tracing::error!(error = %e, %message_id, "could not mark a refused turn unbilled");
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, %message_id, "could not void a turn; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(VOID_RETRY_MAX);
                    }
                }
            }
            if let (Some(a), Some(w)) = (&ledger.allotting, &written) {
                a.pools.written(w);
            }
        });
    }

    async fn void_once(&self, message_id: &str, written: Option<&Written>) -> Result<(), DbError> {
        if let Some(w) = written {
            // The row, when no attempt wrote it: unbilled.
            let mut record = MessageRecord::clone(&w.record);
            record.status = MessageStatus::Unbilled;
            record.billed = 0;
            let unbilled = Written {
                pool: w.pool.clone(),
                record: Arc::new(record),
            };
            turns::write_rows(
                &self.db,
                &self.lease.id,
                &self.names,
                std::slice::from_ref(&unbilled),
            )
            .await?;
        }
        turns::void(&self.db, message_id, written.map(|w| w.pool.as_str())).await
    }

    /// Returns idle and retiring allotments to their accounts, retrying those it could not.
    async fn return_idle_allotments(self) {
        let Some(a) = self.allotting.clone() else {
            return;
        };
        let mut ticks = tokio::time::interval(IDLE / 4);
        loop {
            tokio::select! {
                _ = a.stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            self.release(&a, a.due(IDLE)).await;
        }
    }

    /// Returns `due` to their accounts; those that fail are kept in `unreturned`.
    async fn release(&self, a: &Allotting, due: Vec<Release>) {
        for r in due {
            if let Err(e) = allotment::release(&self.db, &r).await {
                tracing::warn!(error = %e, allotment = %r.pool, account_id = %r.account_id, "could not return an allotment; retrying");
                a.unreturned().push(r);
            }
        }
    }

    /// At close: returns every allotment, those whose return failed before included, trying a
    /// few times. What is still held after that waits for another pod's reaper (the lease is
    /// given up next, so it does not wait for the stale time, only for a reaper's turn).
    async fn return_all_allotments(&self, a: &Allotting) {
        a.stop.cancel();
        let returning = a.returning.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(returning) = returning {
            if let Err(e) = returning.await {
                tracing::error!(error = %e, "the allotment returns ended abnormally");
            }
        }
        let attempts = async {
            for _ in 0..CLOSE_RETURN_ATTEMPTS {
                self.release(a, a.due(Duration::ZERO)).await;
                if a.unreturned().is_empty() {
                    return;
                }
                tokio::time::sleep(IDLE / 4).await;
            }
        };
        if tokio::time::timeout(CLOSE_WAIT, attempts).await.is_err() {
            tracing::warn!("returning the allotments at stop timed out");
        }
        for r in a.unreturned().iter() {
            tracing::warn!(allotment = %r.pool, account_id = %r.account_id, "stopping with an allotment not returned; another pod's reaper will return it");
        }
    }

    /// After a reserve timed out here, the statement may still commit on the server, holding
    /// credits for a turn that was refused. Once the server's statement_timeout has passed it
    /// has either committed or been cancelled; this then releases it, billing nothing (a
    /// message that never got written is simply not found).
    fn release_late(&self, message_id: String) {
        let ledger = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ledger.db.timeout() * 2).await;
            match ledger
                .settle(Settlement::nothing(message_id, MessageStatus::Failed))
                .await
            {
                Ok(_) | Err(LedgerError::UnknownMessage) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not release a timed-out reservation; the reaper will")
                }
            }
        });
    }

    /// Runs `item` in its coalescer's next batch, within the database timeout (the wait for
    /// the batch included).
    async fn batched<T, R>(
        &self,
        coalescer: &Coalescer<T, Result<R, LedgerError>>,
        item: T,
    ) -> Result<R, LedgerError>
    where
        T: Send + 'static,
        R: Send + 'static,
    {
        match tokio::time::timeout(self.db.timeout(), coalescer.submit(item)).await {
            Ok(Some(result)) => result,
            Ok(None) => Err(LedgerError::Unavailable("ledger worker stopped".into())),
            Err(_) => Err(DbError::Timeout(self.db.timeout()).into()),
        }
    }

    async fn top_up_by_reference(&self, reference: &str) -> Result<Option<TopUp>, LedgerError> {
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT reference, account_id, usd_cents, credits, status,
                            coalesce(confirmed_at, created_at) AS confirmed_at
                     FROM top_ups WHERE reference = $1",
                )
                .bind(reference)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(row
            .as_ref()
            .map(top_up_of)
            .transpose()
            .map_err(DbError::Sql)?)
    }
}

/// A coalescer whose batches run `statement` against this process' database, under `lease`.
fn coalescer<T, R, F, Fut>(
    db: &Database,
    lease: &Arc<Lease>,
    names: &Arc<NameKeys>,
    key: fn(&T) -> &str,
    statement: F,
) -> Coalescer<T, R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Database, Arc<Lease>, Arc<NameKeys>, Vec<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<R>> + Send + 'static,
{
    let (db, lease, names) = (db.clone(), lease.clone(), names.clone());
    Coalescer::spawn(LANES, MAX_BATCH, key, move |batch| {
        statement(db.clone(), lease.clone(), names.clone(), batch)
    })
}

impl From<DbError> for LedgerError {
    fn from(e: DbError) -> Self {
        match e.constraint() {
            Some(constraint) => Self::Refused(constraint.to_owned()),
            None => Self::Unavailable(e.to_string()),
        }
    }
}

fn top_up_of(row: &PgRow) -> Result<TopUp, sqlx::Error> {
    let status: String = row.try_get("status")?;
    Ok(TopUp {
        reference: row.try_get("reference")?,
        account_id: row.try_get("account_id")?,
        usd_cents: from_db(row.try_get("usd_cents")?),
        credits: from_db(row.try_get("credits")?),
        status: if status == "confirmed" {
            "confirmed"
        } else {
            "pending"
        },
        confirmed_at: row.try_get("confirmed_at")?,
    })
}

fn balance_of(row: &PgRow) -> Result<Balance, sqlx::Error> {
    Ok(Balance {
        balance: from_db(row.try_get("balance")?),
        reserved: from_db(row.try_get("reserved")?),
        lifetime_top_up_cents: from_db(row.try_get("lifetime_top_up_cents")?),
        owed: from_db(row.try_get("owed_credits")?),
    })
}

fn tokens(row: &PgRow, column: &str) -> Result<u32, sqlx::Error> {
    Ok(u32::try_from(row.try_get::<i64, _>(column)?).unwrap_or(u32::MAX))
}

fn message_of(row: &PgRow) -> Result<MessageRecord, sqlx::Error> {
    let status: String = row.try_get("status")?;
    let endpoint: String = row.try_get("endpoint")?;
    let stop_reason: Option<String> = row.try_get("stop_reason")?;
    Ok(MessageRecord {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        key_id: row.try_get("key_id")?,
        model: row.try_get("model")?,
        served_model: row.try_get("served_model")?,
        provider: row.try_get("provider")?,
        upstream: row.try_get("upstream")?,
        upstream_model: row.try_get("upstream_model")?,
        endpoint: ENDPOINTS
            .into_iter()
            .find(|e| *e == endpoint)
            .unwrap_or("unknown"),
        stream: row.try_get("stream")?,
        status: parse_name(&STATUSES, &status).ok_or_else(|| {
            sqlx::Error::Decode(format!("unknown message status {status}").into())
        })?,
        reserved: from_db(row.try_get("reserved")?),
        billed: from_db(row.try_get("billed")?),
        usage: TokenUsage {
            input_tokens: tokens(row, "input_tokens")?,
            output_tokens: tokens(row, "output_tokens")?,
            cache_creation_input_tokens: tokens(row, "cache_creation_input_tokens")?,
            cache_read_input_tokens: tokens(row, "cache_read_input_tokens")?,
            // The row keeps the writes' total; their 1-hour part is in `billed`.
            cache_creation_1h_input_tokens: 0,
        },
        stop_reason: stop_reason.and_then(|s| parse_name(&STOP_REASONS, &s)),
        created_at: row.try_get("created_at")?,
        latency_ms: row.try_get::<Option<i64>, _>("latency_ms")?.map(from_db),
        batch_id: row.try_get("batch_id")?,
        end_user: row.try_get("end_user")?,
    })
}

fn midnight(day: Date) -> OffsetDateTime {
    day.with_time(Time::MIDNIGHT).assume_utc()
}

#[async_trait]
impl Ledger for PostgresLedger {
    async fn reachable(&self) -> Result<(), LedgerError> {
        self.db
            .bounded(sqlx::query("SELECT 1").execute(self.db.pool()))
            .await?;
        Ok(())
    }

    async fn add_credits(
        &self,
        account_id: &str,
        credits: u64,
        by: &Actor,
    ) -> Result<Balance, LedgerError> {
        let row = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let row = sqlx::query(
                    "UPDATE accounts SET balance = balance + $2 WHERE id = $1
                     RETURNING balance, reserved, lifetime_top_up_cents, owed_credits",
                )
                .bind(account_id)
                .bind(to_db(credits))
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                if row.is_some() && credits > 0 {
                    let entry = audited::credits_added(account_id, credits, None, by);
                    append_in(&mut tx, &entry).await?;
                }
                tx.commit().await?;
                Ok(row)
            })
            .await?
            .ok_or(LedgerError::UnknownAccount)?;
        Ok(balance_of(&row).map_err(DbError::Sql)?)
    }

    async fn add_credits_once(
        &self,
        account_id: &str,
        credits: u64,
        reference: &str,
        by: &Actor,
    ) -> Result<bool, LedgerError> {
        // One statement: the reference's row and the credit commit together or not at all,
        // with the audit row in the same transaction.
        let credited = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let credited = sqlx::query(
                    "WITH added AS (
                         INSERT INTO ledger_grants (reference, account_id, credits)
                         VALUES ($3, $1, $2)
                         ON CONFLICT (reference) DO NOTHING
                         RETURNING account_id, credits
                     )
                     UPDATE accounts a SET balance = a.balance + added.credits
                     FROM added WHERE a.id = added.account_id
                     RETURNING a.id",
                )
                .bind(account_id)
                .bind(to_db(credits))
                .bind(reference)
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
                if credited && credits > 0 {
                    let entry = audited::credits_added(account_id, credits, Some(reference), by);
                    append_in(&mut tx, &entry).await?;
                }
                tx.commit().await?;
                Ok(credited)
            })
            .await?;
        Ok(credited)
    }

    async fn balance(&self, account_id: &str) -> Result<Balance, LedgerError> {
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT balance, reserved, lifetime_top_up_cents, owed_credits
                     FROM accounts WHERE id = $1",
                )
                .bind(account_id)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(row
            .as_ref()
            .map(balance_of)
            .transpose()
            .map_err(DbError::Sql)?
            .unwrap_or_default())
    }

    async fn top_up(&self, t: NewTopUp<'_>) -> Result<Confirmation, LedgerError> {
        // Inserts the top-up confirmed, or confirms a pending one of the same account and
        // amount, and credits the account (what it owes first), in one statement, and audits
        // it in the same transaction; anything else changes nothing.
        let row = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let row = sqlx::query(
                    "WITH confirmed AS (
                         INSERT INTO top_ups (reference, account_id, usd_cents, credits, status, confirmed_at, payment_id)
                         VALUES ($1, $2, $3, $4, 'confirmed', now(), $5)
                         ON CONFLICT (reference) DO UPDATE
                         SET status = 'confirmed', confirmed_at = now(), payment_id = EXCLUDED.payment_id
                         WHERE top_ups.status = 'pending'
                           AND top_ups.account_id = EXCLUDED.account_id
                           AND top_ups.usd_cents = EXCLUDED.usd_cents
                         RETURNING reference, account_id, usd_cents, credits, status, confirmed_at
                     ), credited AS (
                         UPDATE accounts a
                         SET balance = a.balance + c.credits - least(a.owed_credits, c.credits),
                             owed_credits = a.owed_credits - least(a.owed_credits, c.credits),
                             lifetime_top_up_cents = a.lifetime_top_up_cents + c.usd_cents
                         FROM confirmed c WHERE a.id = c.account_id
                         RETURNING a.id
                     )
                     SELECT c.* FROM confirmed c JOIN credited ON credited.id = c.account_id",
                )
                .bind(t.reference)
                .bind(t.account_id)
                .bind(to_db(t.usd_cents))
                .bind(to_db(t.credits))
                .bind(t.payment_id)
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else {
                    return Ok(None);
                };
                let top_up = top_up_of(&row)?;
                append_in(&mut tx, &audited::top_up(&top_up, t.payment_id, t.by)).await?;
                tx.commit().await?;
                Ok(Some(top_up))
            })
            .await;
        let confirmed = match row {
            Ok(confirmed) => confirmed,
            // The account does not exist (foreign key).
            Err(e) if e.constraint().is_some() => return Err(LedgerError::UnknownAccount),
            Err(e) => return Err(e.into()),
        };
        if let Some(top_up) = confirmed {
            return Ok(Confirmation {
                top_up,
                first: true,
            });
        }
        let existing = self
            .top_up_by_reference(t.reference)
            .await?
            .ok_or(LedgerError::UnknownAccount)?;
        if existing.account_id != t.account_id {
            return Err(LedgerError::ReferenceConflict);
        }
        if existing.status != "confirmed" || existing.usd_cents != t.usd_cents {
            return Err(LedgerError::TopUpMismatch);
        }
        Ok(Confirmation {
            top_up: existing,
            first: false,
        })
    }

    async fn refund(
        &self,
        payment_id: &str,
        refunded_cents: u64,
        by: &Actor,
    ) -> Result<Option<Reversal>, LedgerError> {
        self.db
            .bounded(reversals::refund(
                self.db.pool(),
                payment_id,
                refunded_cents,
                by,
            ))
            .await?
    }

    async fn dispute(
        &self,
        dispute_id: &str,
        payment_id: &str,
        usd_cents: u64,
        stage: DisputeStage,
        by: &Actor,
    ) -> Result<Option<Reversal>, LedgerError> {
        let dispute = reversals::Dispute {
            id: dispute_id,
            payment_id,
            usd_cents,
            stage,
            by,
        };
        self.db
            .bounded(reversals::dispute(self.db.pool(), dispute))
            .await?
    }

    async fn reversals(&self, account_id: &str) -> Result<Vec<Reversal>, LedgerError> {
        Ok(self
            .db
            .bounded(reversals::of_account(self.db.pool(), account_id))
            .await?)
    }

    async fn reserve(&self, r: NewReservation) -> Result<u64, LedgerError> {
        // A capped key's turns are reserved in Postgres one by one, never from an allotment:
        // its cap is then checked against what its turns on every pod hold, as a balance is.
        if let Some(a) = self.allotting.as_ref().filter(|_| r.spend_cap.is_none()) {
            if let Some(amount) = self.take(a, &r).await? {
                return Ok(amount);
            }
        }
        let message_id = r.record.id.clone();
        let result = self.batched(&self.reserves, r).await;
        // Unanswered: the statement may still commit, holding credits for a refused turn.
        if matches!(result, Err(LedgerError::Unavailable(_))) {
            self.release_late(message_id);
        }
        result
    }

    /// What it answers is what the ledger bills, for good: a bill Postgres could not confirm
    /// is voided and answered 0 (see [`PostgresLedger::void`]).
    async fn settle(&self, s: Settlement) -> Result<u64, LedgerError> {
        if let Some(a) = &self.allotting {
            if let Some(written) = a.pools.settle(&s) {
                return Ok(self.write(a, written).await);
            }
        }
        let message_id = s.message_id.clone();
        let settled = match self.batched(&self.settles, s).await {
            // Already settled (a replay) or reaped: report what it was billed, change nothing.
            Ok(None) => match self.message(&message_id).await {
                Ok(None) => return Err(LedgerError::UnknownMessage),
                found => found.map(|m| m.map(|m| m.billed)),
            },
            settled => settled,
        };
        match settled {
            Ok(Some(billed)) => Ok(billed),
            Ok(None) => Err(LedgerError::UnknownMessage),
            Err(e) => {
                tracing::warn!(error = %e, %message_id, "could not settle a turn; voided, told 0");
                self.void(message_id, None);
                Ok(0)
            }
        }
    }

    /// Writes the last rows (voids still trying), returns the allotments, then gives the lease
    /// up; the heartbeat keeps the lease alive until then.
    async fn close(&self) {
        self.voids.close();
        if tokio::time::timeout(CLOSE_WAIT, self.voids.wait())
            .await
            .is_err()
        {
            tracing::error!("stopping with voids not landed: those turns' rows may not match what their clients were told");
        }
        if let Some(a) = &self.allotting {
            self.return_all_allotments(a).await;
        }
        self.give_up_lease().await;
    }

    /// One probe of one partition when the id carries its time; an id of before 0020
    /// (random, or of another form) is looked for by id alone, one probe per partition of the
    /// open days (a closed day holds no such id: migration 0027). A row of a day retention
    /// dropped is not found.
    async fn message(&self, id: &str) -> Result<Option<MessageRecord>, LedgerError> {
        let mut row = None;
        if let Some(created_at) = message_id::created_at(id) {
            // Unnamed: planned with its time, it locks one partition, not all (see
            // `turns::settle_rows`).
            row = self
                .db
                .bounded(
                    sqlx::query(MESSAGE_BY_TIMED_ID)
                        .bind(id)
                        .bind(created_at)
                        .persistent(false)
                        .fetch_optional(self.db.pool()),
                )
                .await?;
        }
        if row.is_none() {
            row = self
                .db
                .bounded(
                    sqlx::query("SELECT * FROM open_message_rows WHERE id = $1")
                        .bind(id)
                        .fetch_optional(self.db.pool()),
                )
                .await?;
        }
        Ok(row
            .as_ref()
            .map(message_of)
            .transpose()
            .map_err(DbError::Sql)?)
    }

    async fn usage(
        &self,
        account_id: &str,
        from: Date,
        to: Date,
    ) -> Result<Vec<UsageRow>, LedgerError> {
        let end = to.next_day().map_or(OffsetDateTime::now_utc(), midnight);
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    // The rollups, not the rows (see `rolled_up!`): one index range of
                    // an account's hours, however many turns they hold.
                    "SELECT (hour AT TIME ZONE 'UTC')::date AS day, model,
                            sum(turns)::bigint AS requests,
                            sum(input_tokens)::bigint AS input_tokens,
                            sum(output_tokens)::bigint AS output_tokens,
                            sum(cache_creation_input_tokens)::bigint AS cache_creation_input_tokens,
                            sum(cache_read_input_tokens)::bigint AS cache_read_input_tokens,
                            sum(credits)::bigint AS credits,
                            sum(batch_turns)::bigint AS batch_requests,
                            sum(batch_credits)::bigint AS batch_credits
                     FROM usage_rollups
                     WHERE account_id = $1 AND hour >= $2 AND hour < $3
                     GROUP BY 1, 2 HAVING sum(turns) > 0 ORDER BY 1, 2",
                )
                .bind(account_id)
                .bind(midnight(from))
                .bind(end)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let usage = rows
            .iter()
            .map(|row| {
                Ok(UsageRow {
                    date: row.try_get("day")?,
                    model: row.try_get("model")?,
                    totals: UsageTotals {
                        requests: from_db(row.try_get("requests")?),
                        input_tokens: from_db(row.try_get("input_tokens")?),
                        output_tokens: from_db(row.try_get("output_tokens")?),
                        cache_creation_input_tokens: from_db(
                            row.try_get("cache_creation_input_tokens")?,
                        ),
                        cache_read_input_tokens: from_db(row.try_get("cache_read_input_tokens")?),
                        credits: from_db(row.try_get("credits")?),
                        batch_requests: from_db(row.try_get("batch_requests")?),
                        batch_credits: from_db(row.try_get("batch_credits")?),
                    },
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(DbError::Sql)?;
        Ok(usage)
    }

    async fn end_user_usage(
        &self,
        account_id: &str,
        from: Date,
        to: Date,
        end_user: Option<&str>,
    ) -> Result<Vec<EndUserUsageRow>, LedgerError> {
        let end = to.next_day().map_or(OffsetDateTime::now_utc(), midnight);
        let rows = self
            .db
            .bounded(
                // The rows, not the rollups (which keep no end user): the account's by its
                // `(account_id, created_at)` indexes, counted as `rolled_up!` counts them
                // (a served turn is one that neither failed nor was abandoned).
                sqlx::query(
                    "SELECT (created_at AT TIME ZONE 'UTC')::date AS day, model, end_user,
                            count(*) FILTER (WHERE served)::bigint AS requests,
                            coalesce(sum(input_tokens) FILTER (WHERE served), 0)::bigint
                                AS input_tokens,
                            coalesce(sum(output_tokens) FILTER (WHERE served), 0)::bigint
                                AS output_tokens,
                            coalesce(sum(cache_creation_input_tokens) FILTER (WHERE served),
                                0)::bigint AS cache_creation_input_tokens,
                            coalesce(sum(cache_read_input_tokens) FILTER (WHERE served),
                                0)::bigint AS cache_read_input_tokens,
                            coalesce(sum(billed), 0)::bigint AS credits,
                            count(*) FILTER (WHERE served AND batch_id IS NOT NULL)::bigint
                                AS batch_requests,
                            coalesce(sum(billed) FILTER (WHERE batch_id IS NOT NULL), 0)::bigint
                                AS batch_credits
                     FROM (SELECT *, status NOT IN ('failed', 'abandoned') AS served
                           FROM message_rows
                           WHERE account_id = $1 AND created_at >= $2 AND created_at < $3
                               AND status <> 'reserved'
                               AND ($4::text IS NULL OR end_user = $4)) r
                     GROUP BY 1, 2, 3 HAVING count(*) FILTER (WHERE served) > 0
                     ORDER BY 1, 2, 3",
                )
                .bind(account_id)
                .bind(midnight(from))
                .bind(end)
                .bind(end_user)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let usage = rows
            .iter()
            .map(|row| {
                Ok(EndUserUsageRow {
                    end_user: row.try_get("end_user")?,
                    usage: UsageRow {
                        date: row.try_get("day")?,
                        model: row.try_get("model")?,
                        totals: UsageTotals {
                            requests: from_db(row.try_get("requests")?),
                            input_tokens: from_db(row.try_get("input_tokens")?),
                            output_tokens: from_db(row.try_get("output_tokens")?),
                            cache_creation_input_tokens: from_db(
                                row.try_get("cache_creation_input_tokens")?,
                            ),
                            cache_read_input_tokens: from_db(
                                row.try_get("cache_read_input_tokens")?,
                            ),
                            credits: from_db(row.try_get("credits")?),
                            batch_requests: from_db(row.try_get("batch_requests")?),
                            batch_credits: from_db(row.try_get("batch_credits")?),
                        },
                    },
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(DbError::Sql)?;
        Ok(usage)
    }

    async fn recent_messages(
        &self,
        account_id: &str,
        limit: usize,
    ) -> Result<Vec<MessageRecord>, LedgerError> {
        // The last week's partitions first (an index range in each of a few); every day's
        // only when the account has fewer turns than that (each partition's index then).
        let mut rows = Vec::new();
        for since in [Some(OffsetDateTime::now_utc() - RECENT), None] {
            rows = self
                .db
                .bounded(
                    // The account's last turns by the `(account_id, created_at)` index
                    // (and the few in flight, and those of closed days by their `(account,
                    // created_at)`), then each one's row with its names: ordering
                    // `message_rows` itself would join the names to every row of the account
                    // before it sorts them (`OFFSET 0` keeps Postgres from folding the lookup
                    // into such a join).
                    sqlx::query(
                        "SELECT row.* FROM (
                             (SELECT id, created_at FROM messages
                              WHERE account_id = $1
                                  AND created_at >= coalesce($3::timestamptz, '-infinity')
                              ORDER BY created_at DESC LIMIT $2)
                             UNION ALL
                             (SELECT id, created_at FROM reservations
                              WHERE account_id = $1
                                  AND created_at >= coalesce($3::timestamptz, '-infinity')
                              ORDER BY created_at DESC LIMIT $2)
                             UNION ALL
                             (SELECT message_id(id_prefix, created_at, id_random), created_at
                              FROM closed_messages
                              WHERE account = (SELECT a.id FROM message_accounts a
                                               WHERE a.account_id = $1)
                                  AND created_at >= coalesce($3::timestamptz, '-infinity')
                              ORDER BY created_at DESC LIMIT $2)
                             ORDER BY created_at DESC LIMIT $2
                         ) recent
                         CROSS JOIN LATERAL (
                             SELECT * FROM message_rows r
                             WHERE r.id = recent.id AND r.created_at = recent.created_at
                             OFFSET 0
                         ) row
                         ORDER BY row.created_at DESC",
                    )
                    .bind(account_id)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .bind(since)
                    .persistent(false)
                    .fetch_all(self.db.pool()),
                )
                .await?;
            if rows.len() >= limit {
                break;
            }
        }
        Ok(rows
            .iter()
            .map(message_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DbError::Sql)?)
    }

    async fn key_spend(&self, key_id: &str) -> Result<KeySpend, LedgerError> {
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT CASE WHEN spend_month = utc_month() THEN month_spent ELSE 0 END
                                AS spent,
                            month_reserved AS reserved
                     FROM api_keys WHERE id = $1",
                )
                .bind(key_id)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        let spend = |row: &PgRow| -> Result<KeySpend, sqlx::Error> {
            Ok(KeySpend {
                spent: from_db(row.try_get("spent")?),
                reserved: from_db(row.try_get("reserved")?),
            })
        };
        Ok(row
            .as_ref()
            .map(spend)
            .transpose()
            .map_err(DbError::Sql)?
            .unwrap_or_default())
    }

    async fn top_ups(&self, account_id: &str) -> Result<Vec<TopUp>, LedgerError> {
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT reference, account_id, usd_cents, credits, status,
                            coalesce(confirmed_at, created_at) AS confirmed_at
                     FROM top_ups WHERE account_id = $1
                     ORDER BY coalesce(confirmed_at, created_at) DESC",
                )
                .bind(account_id)
                .fetch_all(self.db.pool()),
            )
            .await?;
        Ok(rows
            .iter()
            .map(top_up_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DbError::Sql)?)
    }
}
