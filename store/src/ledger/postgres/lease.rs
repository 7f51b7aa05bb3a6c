//! The process lease: this process' row in `gateway_instances`, renewed by its heartbeat,
//! announced as draining when it stops and given up once it closed; and the reaper, which
//! takes silent processes for dead and releases what their leases held. The money
//! statements are the parent module's.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::Row;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::{allotment, PostgresLedger};
use crate::db::{from_db, DbError};
use crate::ledger::LedgerError;

/// This process' lease: its row in `gateway_instances`, under an epoch that changes each time
/// it registers again after the reaper took it for dead.
pub(super) struct Lease {
    /// This process, as recorded on the reservations and allotments it holds.
    pub id: String,
    /// 0 until registered.
    epoch: AtomicI64,
    /// When the first of the unbroken run of heartbeats up to now was sent.
    healthy_since: Mutex<Option<Instant>>,
    /// Set when this process gives its lease up: no heartbeat registers it again.
    given_up: AtomicBool,
    /// Cancelled once this process wrote its last row and gave its lease up.
    closed: CancellationToken,
}

impl Lease {
    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn healthy_since(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.healthy_since.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Lease {
    /// A lease for the process `id`, not registered yet (epoch 0).
    pub(super) fn new(id: String) -> Self {
        Self {
            id,
            epoch: AtomicI64::new(0),
            healthy_since: Mutex::new(None),
            given_up: AtomicBool::new(false),
            closed: CancellationToken::new(),
        }
    }
}

impl PostgresLedger {
    /// Renews this process' lease; registers it (under the next epoch) when there is none
    /// yet, or when the reaper took this process for dead and deleted it. Allotments are
    /// usable for half the stale time after the *send* of a heartbeat that succeeded, so
    /// their use ends before any reaper (counting the stale time on Postgres' clock from when
    /// the heartbeat landed) can return them.
    pub async fn heartbeat(&self) -> Result<(), LedgerError> {
        let sent = Instant::now();
        let result = self.renew_or_register().await;
        let mut healthy_since = self.lease.healthy_since();
        let (epoch, renewed) = match result {
            Ok(lease) => lease,
            Err(e) => {
                *healthy_since = None;
                return Err(e.into());
            }
        };
        if !renewed {
            *healthy_since = None;
        }
        healthy_since.get_or_insert(sent);
        self.lease.epoch.store(epoch, Ordering::Release);
        if let Some(a) = &self.allotting {
            a.pools.beat(sent, epoch);
        }
        Ok(())
    }

    /// (the lease's epoch, whether the lease was renewed rather than registered).
    async fn renew_or_register(&self) -> Result<(i64, bool), DbError> {
        let epoch = self.lease.epoch();
        if epoch > 0 {
            let renewed = self
                .db
                .bounded(
                    sqlx::query(
                        "UPDATE gateway_instances SET heartbeat_at = now()
                         WHERE id = $1 AND epoch = $2 RETURNING epoch",
                    )
                    .bind(&self.lease.id)
                    .bind(epoch)
                    .fetch_optional(self.db.pool()),
                )
                .await?;
            if renewed.is_some() || self.lease.given_up.load(Ordering::Acquire) {
                return Ok((epoch, true));
            }
            tracing::error!(
                epoch,
                "this process' lease was taken by another pod's reaper; registering again, with new allotments"
            );
        }
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "INSERT INTO gateway_instances (id, heartbeat_at, epoch) VALUES ($1, now(), $2)
                     ON CONFLICT (id) DO UPDATE
                     SET heartbeat_at = now(), draining_until = NULL,
                         epoch = greatest(gateway_instances.epoch, EXCLUDED.epoch - 1) + 1
                     RETURNING epoch",
                )
                .bind(&self.lease.id)
                .bind(epoch + 1)
                .fetch_one(self.db.pool()),
            )
            .await?;
        Ok((row.try_get("epoch").map_err(DbError::Sql)?, false))
    }

    /// Announces that this process is stopping and may still write for `within`: no reaper
    /// takes it for dead before then, even if its heartbeat fails meanwhile.
    pub async fn drain(&self, within: Duration) -> Result<(), LedgerError> {
        let ms = i64::try_from(within.as_millis()).unwrap_or(i64::MAX);
        self.db
            .bounded(
                sqlx::query(
                    "UPDATE gateway_instances
                     SET draining_until = now() + $3 * interval '1 millisecond'
                     WHERE id = $1 AND epoch = $2",
                )
                .bind(&self.lease.id)
                .bind(self.lease.epoch())
                .bind(ms)
                .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    /// Whether this process may take others for dead: only once its own heartbeat has
    /// succeeded for `stale` without a break. A process just back from being cut off cannot
    /// tell a dead peer from one that was cut off too.
    pub fn may_reap(&self, stale: Duration) -> bool {
        self.lease
            .healthy_since()
            .is_some_and(|since| since.elapsed() >= stale)
    }

    /// Resolves once this process has written its last row and given its lease up.
    pub async fn closed(&self) {
        self.lease.closed.cancelled().await
    }

    /// Takes for dead the processes that have not beaten for `stale` (and are not draining
    /// within their announced time): deletes their leases, which fences them off. Then
    /// releases the reservations and allotments of leases that are gone: reservations older
    /// than `stale` end `abandoned`, billed nothing, since what the client received is
    /// unknown; reservations older than `max_turn` are released whatever their process (its
    /// settle and its void both failed). Taking a turn out of `reservations` (or a row out of
    /// `reserved`) and its release are one statement, so it never races a settle into a
    /// double release. Returns how many reservations and allotments it released.
    ///
    /// The turns held in `reservations` are read whole (only the turns in flight are there).
    /// With `since`, only the rows reserved in `messages` (by processes of before 0026) created
    /// since then are read: the statement is planned with that bound and reads only those
    /// days' partitions (about 6 ms of planning against 90 at 13 months of days,
    /// docs/benchmarks.md, "The reaper's statement and the number of days"); `None` reads
    /// every day's.
    pub async fn reap(
        &self,
        stale: Duration,
        max_turn: Duration,
        since: Option<OffsetDateTime>,
    ) -> Result<u64, LedgerError> {
        let stale_ms = i64::try_from(stale.as_millis()).unwrap_or(i64::MAX);
        let max_turn_ms = i64::try_from(max_turn.as_millis()).unwrap_or(i64::MAX);
        // The delete waits for the refills and writes that hold a lease (they lock its row) and
        // re-checks the heartbeat of a row renewed meanwhile, so a renewed lease is kept.
        let dead = self
            .db
            .bounded(
                sqlx::query(
                    "DELETE FROM gateway_instances
                     WHERE heartbeat_at < now() - $1 * interval '1 millisecond'
                       AND (draining_until IS NULL OR draining_until < now())
                       AND id <> $2
                     RETURNING id",
                )
                .bind(stale_ms)
                .bind(&self.lease.id)
                .fetch_all(self.db.pool()),
            )
            .await?;
        if !dead.is_empty() {
            tracing::warn!(processes = dead.len(), "took silent processes for dead");
        }
        let row = self
            .db
            .bounded(
                sqlx::query(concat!(
                    "WITH ended AS (
                         DELETE FROM reservations o
                         WHERE o.created_at < now() - $1 * interval '1 millisecond'
                           AND (o.created_at < now() - $2 * interval '1 millisecond'
                                OR NOT EXISTS (
                                   SELECT 1 FROM gateway_instances g
                                   WHERE g.id = o.instance_id AND g.epoch = o.instance_epoch)) ",
                    ended_billing_nothing!("'abandoned'"),
                    "
                     ), abandoned AS (",
                    written!(),
                    "
                     ), abandoned_in_place AS (
                         -- Reserved in `messages` by a process of before 0026.
                         UPDATE messages m SET status = 'abandoned', billed = 0, settled_at = now()
                         WHERE m.status = 'reserved'
                           AND m.created_at < now() - $1 * interval '1 millisecond'
                           AND m.created_at >= coalesce($3::timestamptz, '-infinity')
                           AND (m.created_at < now() - $2 * interval '1 millisecond'
                                OR NOT EXISTS (
                                   SELECT 1 FROM gateway_instances g
                                   WHERE g.id = m.instance_id AND g.epoch = m.instance_epoch))
                         RETURNING m.id, m.account_id, m.key_id, m.reserved, m.billed,
                             message_model(m.route_id, m.model) AS model,
                             m.created_at, m.batch_id, m.status, m.input_tokens,
                             m.output_tokens, m.cache_creation_input_tokens,
                             m.cache_read_input_tokens
                     ), orphans AS (
                         SELECT * FROM abandoned UNION ALL SELECT * FROM abandoned_in_place
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
                     ), keys_released AS (
                         UPDATE api_keys k
                         SET month_reserved = greatest(k.month_reserved - r.credits, 0)
                         FROM (SELECT key_id, account_id, sum(reserved)::bigint AS credits
                               FROM orphans GROUP BY key_id, account_id) r
                         JOIN account ON account.id = r.account_id
                         WHERE k.id = r.key_id
                     ), ",
                    rolled_up!(
                        "SELECT o.*, 1 AS sign FROM orphans o JOIN account ON account.id = o.account_id"
                    ),
                    "
                     SELECT coalesce(sum(n), 0)::bigint AS reaped FROM accounts_released"
                ))
                .bind(stale_ms)
                .bind(max_turn_ms)
                .bind(since)
                // Unnamed, so planned with `since` each time: a cached generic plan would
                // lock and read every day's partition.
                .persistent(false)
                .fetch_one(self.db.pool()),
            )
            .await?;
        let turns = from_db(row.try_get("reaped").map_err(DbError::Sql)?);
        Ok(turns + allotment::reap(&self.db).await?)
    }

    /// Gives the lease up once the last rows are written and the allotments returned.
    pub(super) async fn give_up_lease(&self) {
        // Gone, the lease takes no reaper's stale time for what it still holds (nothing,
        // unless a release above failed) to be released.
        self.lease.given_up.store(true, Ordering::Release);
        let released = self
            .db
            .bounded(
                sqlx::query("DELETE FROM gateway_instances WHERE id = $1 AND epoch = $2")
                    .bind(&self.lease.id)
                    .bind(self.lease.epoch())
                    .execute(self.db.pool()),
            )
            .await;
        if let Err(e) = released {
            tracing::warn!(error = %e, "could not give the lease up; the reaper will take it");
        }
        self.lease.closed.cancel();
    }
}
