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
//! Each process registers itself in `gateway_instances` and renews a heartbeat; the reaper
//! releases reservations and allotments whose process stopped beating (see
//! [`PostgresLedger::reap`]).

mod allotment;
mod turns;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;
use time::{Date, OffsetDateTime, Time};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::allotment::{Grow, Pools, Release, Written, IDLE};
use super::coalesce::Coalescer;
use super::{
    Balance, Confirmation, Ledger, LedgerError, MessageRecord, MessageStatus, NewReservation,
    Settlement, TopUp, UsageRow, UsageTotals,
};
use crate::db::{from_db, parse_name, to_db, Database, DbError};
use crate::ids;
use crate::wire::anthropic::{StopReason, TokenUsage};

const STATUSES: [MessageStatus; 6] = [
    MessageStatus::Reserved,
    MessageStatus::Completed,
    MessageStatus::ClientDisconnected,
    MessageStatus::Interrupted,
    MessageStatus::Failed,
    MessageStatus::Abandoned,
];

const STOP_REASONS: [StopReason; 4] = [
    StopReason::EndTurn,
    StopReason::MaxTokens,
    StopReason::StopSequence,
    StopReason::ToolUse,
];

const ENDPOINTS: [&str; 3] = ["messages", "chat_completions", "responses"];

/// The most turns one reserve or settle statement carries.
const MAX_BATCH: usize = 128;

/// Reserve (and settle) statements in flight at once per process. One is the fastest measured
/// (docs/benchmarks.md): more lanes mean smaller batches, so more commits and more Postgres
/// backends competing for the cores, which costs more than the wait for the lane saves (1
/// lane: 6,400 turns/s, and p99 2.9 ms at 2,000 turns/s; 2 lanes: 3,800 and 6 ms; 8 lanes:
/// 2,100 and 18 ms).
/// Each lane holds one pooled connection while it runs, the rest of the pool serves reads.
const LANES: usize = 1;

/// How long a stopping process waits for the rows of its last allotted turns to be written.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct PostgresLedger {
    db: Database,
    /// This process, as recorded on the reservations it holds.
    instance: String,
    reserves: Coalescer<NewReservation, Result<u64, LedgerError>>,
    settles: Coalescer<Settlement, Result<Option<u64>, LedgerError>>,
    allotting: Option<Arc<Allotting>>,
}

/// The allotments of this process, and the background writing of their turns' rows.
struct Allotting {
    pools: Pools,
    writes: Coalescer<Written, Result<Option<u64>, LedgerError>>,
    writing: TaskTracker,
    stop: CancellationToken,
}

impl PostgresLedger {
    /// Starts the batching of reserves and settles (needs a Tokio runtime).
    pub fn new(db: Database) -> Self {
        let instance = ids::instance();
        let reserves = coalescer(
            &db,
            &instance,
            |r: &NewReservation| r.record.id.as_str(),
            |db, instance, batch| async move { turns::reserve(&db, &instance, batch).await },
        );
        let settles = coalescer(
            &db,
            &instance,
            |s: &Settlement| s.message_id.as_str(),
            |db, _, batch| async move { turns::settle(&db, batch).await },
        );
        Self {
            db,
            instance,
            reserves,
            settles,
            allotting: None,
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
            &self.instance,
            |w: &Written| w.record.id.as_str(),
            |db, instance, batch| async move { turns::write(&db, &instance, batch).await },
        );
        self.allotting = Some(Arc::new(Allotting {
            pools: Pools::new(turns, fresh_for),
            writes,
            writing: TaskTracker::new(),
            stop: CancellationToken::new(),
        }));
        tokio::spawn(self.clone().return_idle_allotments());
        self
    }

    /// Takes the turn's credits from its account's allotment, growing it first when it falls
    /// short (once). `None`: reserve the turn in Postgres.
    async fn take(&self, a: &Allotting, r: &NewReservation) -> Result<Option<u64>, LedgerError> {
        let mut take = a.pools.take(r, true);
        if let (None, Some(grow)) = (take.amount, &take.grow) {
            self.grow(grow).await?;
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
        let granted = allotment::grow(&self.db, &self.instance, g).await;
        if let Some(a) = &self.allotting {
            a.pools.granted(g, granted.as_ref().ok().copied());
        }
        granted.map(drop).map_err(LedgerError::from)
    }

    /// Writes an allotted turn's row, retrying until it lands (or the process stops).
    async fn write(&self, a: &Allotting, w: Written) {
        let mut pause = Duration::from_millis(100);
        while let Err(e) = self.batched(&a.writes, w.clone()).await {
            tracing::warn!(error = %e, message_id = %w.record.id, "could not write a settled turn; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
        a.pools.written(&w);
    }

    /// Returns idle and retiring allotments to their accounts, retrying those it could not.
    async fn return_idle_allotments(self) {
        let Some(a) = self.allotting.clone() else {
            return;
        };
        let mut ticks = tokio::time::interval(IDLE / 4);
        let mut failed: Vec<Release> = Vec::new();
        loop {
            tokio::select! {
                _ = a.stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let due: Vec<Release> = failed.drain(..).chain(a.pools.idle(IDLE)).collect();
            for r in due {
                if let Err(e) = allotment::release(&self.db, &r).await {
                    tracing::warn!(error = %e, "could not return an allotment; retrying");
                    failed.push(r);
                }
            }
        }
    }

    /// Records that this process is alive; reservations of processes that stop doing so are
    /// released by [`reap`](Self::reap).
    pub async fn heartbeat(&self) -> Result<(), LedgerError> {
        let sent = Instant::now();
        self.db
            .bounded(
                sqlx::query(
                    "INSERT INTO gateway_instances (id, heartbeat_at) VALUES ($1, now())
                     ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()",
                )
                .bind(&self.instance)
                .execute(self.db.pool()),
            )
            .await?;
        if let Some(a) = &self.allotting {
            a.pools.beat(sent);
        }
        Ok(())
    }

    /// Releases orphaned reservations: those older than `stale` whose process has not sent a
    /// heartbeat for `stale` (it died), and those older than `max_turn` whatever their process
    /// (its settle failed, e.g. during a database outage). They end `abandoned` and billed
    /// nothing, since what the client received is unknown; the status change and the release
    /// are one statement that only touches rows still `reserved`, so it never races a settle
    /// into a double release. It also returns the allotments of processes that stopped beating.
    /// Returns how many reservations and allotments it released.
    pub async fn reap(&self, stale: Duration, max_turn: Duration) -> Result<u64, LedgerError> {
        let stale_ms = i64::try_from(stale.as_millis()).unwrap_or(i64::MAX);
        let max_turn_ms = i64::try_from(max_turn.as_millis()).unwrap_or(i64::MAX);
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "WITH orphans AS (
                         UPDATE messages m SET status = 'abandoned', billed = 0, settled_at = now()
                         WHERE m.status = 'reserved'
                           AND m.created_at < now() - $1 * interval '1 millisecond'
                           AND (m.created_at < now() - $2 * interval '1 millisecond'
                                OR NOT EXISTS (
                                   SELECT 1 FROM gateway_instances g
                                   WHERE g.id = m.instance_id
                                     AND g.heartbeat_at > now() - $1 * interval '1 millisecond'))
                         RETURNING m.account_id, m.reserved
                     ), released AS (
                         SELECT account_id, sum(reserved)::bigint AS credits, count(*) AS n
                         FROM orphans GROUP BY account_id
                     ), account AS (
                         -- In id order, as the batched settles lock them: no deadlock.
                         SELECT id FROM accounts WHERE id IN (SELECT account_id FROM released)
                         ORDER BY id FOR NO KEY UPDATE
                     ), accounts_released AS (
                         UPDATE accounts a SET reserved = a.reserved - r.credits
                         FROM released r JOIN account ON account.id = r.account_id
                         WHERE a.id = r.account_id
                         RETURNING r.n
                     )
                     SELECT coalesce(sum(n), 0)::bigint AS reaped FROM accounts_released",
                )
                .bind(stale_ms)
                .bind(max_turn_ms)
                .fetch_one(self.db.pool()),
            )
            .await?;
        let turns = from_db(row.try_get("reaped").map_err(DbError::Sql)?);
        Ok(turns + allotment::reap(&self.db, stale_ms).await?)
    }

    /// After a reserve timed out here, the statement may still commit on the server, holding
    /// credits for a turn that was refused. Once the server's statement_timeout has passed it
    /// has either committed or been cancelled; this then releases it, billing nothing (a
    /// message that never got written is simply not found).
    fn release_late(&self, message_id: String) {
        let ledger = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ledger.db.timeout() * 2).await;
            let release = Settlement {
                message_id,
                served_by: None,
                status: MessageStatus::Failed,
                cost: 0,
                usage: TokenUsage::default(),
                stop_reason: None,
                latency_ms: 0,
            };
            match ledger.settle(release).await {
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

/// A coalescer whose batches run `statement` against this process' database, as `instance`.
fn coalescer<T, R, F, Fut>(
    db: &Database,
    instance: &str,
    key: fn(&T) -> &str,
    statement: F,
) -> Coalescer<T, R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Database, Arc<str>, Vec<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<R>> + Send + 'static,
{
    let (db, instance): (Database, Arc<str>) = (db.clone(), instance.into());
    Coalescer::spawn(LANES, MAX_BATCH, key, move |batch| {
        statement(db.clone(), instance.clone(), batch)
    })
}

impl From<DbError> for LedgerError {
    fn from(e: DbError) -> Self {
        Self::Unavailable(e.to_string())
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
        },
        stop_reason: stop_reason.and_then(|s| parse_name(&STOP_REASONS, &s)),
        created_at: row.try_get("created_at")?,
        latency_ms: row.try_get::<Option<i64>, _>("latency_ms")?.map(from_db),
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

    async fn grant(&self, account_id: &str, credits: u64) -> Result<Balance, LedgerError> {
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "UPDATE accounts SET balance = balance + $2 WHERE id = $1
                     RETURNING balance, reserved, lifetime_top_up_cents",
                )
                .bind(account_id)
                .bind(to_db(credits))
                .fetch_optional(self.db.pool()),
            )
            .await?
            .ok_or(LedgerError::UnknownAccount)?;
        Ok(balance_of(&row).map_err(DbError::Sql)?)
    }

    async fn balance(&self, account_id: &str) -> Result<Balance, LedgerError> {
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT balance, reserved, lifetime_top_up_cents FROM accounts WHERE id = $1",
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

    async fn top_up(
        &self,
        account_id: &str,
        reference: &str,
        usd_cents: u64,
        credits: u64,
    ) -> Result<Confirmation, LedgerError> {
        // Inserts the top-up confirmed, or confirms a pending one of the same account and
        // amount, and credits the account, in one statement; anything else changes nothing.
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "WITH confirmed AS (
                         INSERT INTO top_ups (reference, account_id, usd_cents, credits, status, confirmed_at)
                         VALUES ($1, $2, $3, $4, 'confirmed', now())
                         ON CONFLICT (reference) DO UPDATE SET status = 'confirmed', confirmed_at = now()
                         WHERE top_ups.status = 'pending'
                           AND top_ups.account_id = EXCLUDED.account_id
                           AND top_ups.usd_cents = EXCLUDED.usd_cents
                         RETURNING reference, account_id, usd_cents, credits, status, confirmed_at
                     ), credited AS (
                         UPDATE accounts a
                         SET balance = a.balance + c.credits,
                             lifetime_top_up_cents = a.lifetime_top_up_cents + c.usd_cents
                         FROM confirmed c WHERE a.id = c.account_id
                         RETURNING a.id
                     )
                     SELECT c.* FROM confirmed c JOIN credited ON credited.id = c.account_id",
                )
                .bind(reference)
                .bind(account_id)
                .bind(to_db(usd_cents))
                .bind(to_db(credits))
                .fetch_optional(self.db.pool()),
            )
            .await;
        let row = match row {
            Ok(row) => row,
            // The account does not exist (foreign key).
            Err(e) if e.constraint().is_some() => return Err(LedgerError::UnknownAccount),
            Err(e) => return Err(e.into()),
        };
        if let Some(row) = row {
            return Ok(Confirmation {
                top_up: top_up_of(&row).map_err(DbError::Sql)?,
                first: true,
            });
        }
        let existing = self
            .top_up_by_reference(reference)
            .await?
            .ok_or(LedgerError::UnknownAccount)?;
        if existing.account_id != account_id {
            return Err(LedgerError::ReferenceConflict);
        }
        if existing.status != "confirmed" || existing.usd_cents != usd_cents {
            return Err(LedgerError::TopUpMismatch);
        }
        Ok(Confirmation {
            top_up: existing,
            first: false,
        })
    }

    async fn reserve(&self, r: NewReservation) -> Result<u64, LedgerError> {
        if let Some(a) = &self.allotting {
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

    async fn settle(&self, s: Settlement) -> Result<u64, LedgerError> {
        if let Some(a) = &self.allotting {
            if let Some((billed, written)) = a.pools.settle(&s) {
                let (ledger, a) = (self.clone(), a.clone());
                a.writing
                    .clone()
                    .spawn(async move { ledger.write(&a, written).await });
                return Ok(billed);
            }
        }
        let message_id = s.message_id.clone();
        match self.batched(&self.settles, s).await? {
            Some(billed) => Ok(billed),
            // Already settled (a replay) or reaped: report what it was billed, change nothing.
            None => self
                .message(&message_id)
                .await?
                .map(|m| m.billed)
                .ok_or(LedgerError::UnknownMessage),
        }
    }

    async fn close(&self) {
        let Some(a) = &self.allotting else {
            return;
        };
        a.writing.close();
        if tokio::time::timeout(CLOSE_WAIT, a.writing.wait())
            .await
            .is_err()
        {
            tracing::error!("stopping with settled turns not written; the reaper returns their allotments and they stay unbilled");
        }
        a.stop.cancel();
        for r in a.pools.idle(Duration::ZERO) {
            if let Err(e) = allotment::release(&self.db, &r).await {
                tracing::warn!(error = %e, "could not return an allotment; the reaper will");
            }
        }
    }

    async fn message(&self, id: &str) -> Result<Option<MessageRecord>, LedgerError> {
        if let Some(record) = self.allotting.as_ref().and_then(|a| a.pools.unwritten(id)) {
            return Ok(Some(record));
        }
        let row = self
            .db
            .bounded(
                sqlx::query("SELECT * FROM messages WHERE id = $1")
                    .bind(id)
                    .fetch_optional(self.db.pool()),
            )
            .await?;
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
                    "SELECT (created_at AT TIME ZONE 'UTC')::date AS day, model,
                            count(*)::bigint AS requests,
                            sum(input_tokens)::bigint AS input_tokens,
                            sum(output_tokens)::bigint AS output_tokens,
                            sum(cache_creation_input_tokens)::bigint AS cache_creation_input_tokens,
                            sum(cache_read_input_tokens)::bigint AS cache_read_input_tokens,
                            sum(billed)::bigint AS credits
                     FROM messages
                     WHERE account_id = $1 AND created_at >= $2 AND created_at < $3
                       AND status NOT IN ('reserved', 'failed', 'abandoned')
                     GROUP BY 1, 2 ORDER BY 1, 2",
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
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT * FROM messages WHERE account_id = $1
                     ORDER BY created_at DESC LIMIT $2",
                )
                .bind(account_id)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(self.db.pool()),
            )
            .await?;
        Ok(rows
            .iter()
            .map(message_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DbError::Sql)?)
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
