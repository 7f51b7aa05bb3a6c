//! The money movements of a turn, each one statement over a batch of turns (see
//! [`Coalescer`](crate::ledger::coalesce::Coalescer)): all of a batch commits or none of it.
//! A turn reserved in Postgres is held in `reservations`, then settled: its row is written
//! then ([`reserved`]); a turn served from an allotment ([`super::allotment`]) is written once,
//! after it ended.
//!
//! Account rows are locked in id order before they are written, so two batches (of this
//! process or another) sharing accounts queue on each other instead of deadlocking. A batch
//! may hold many turns of one account (one busy key is the common case); their reservations
//! are decided in the order they arrived, as if each ran alone.
//!
//! A statement Postgres refuses (a constraint) fails its whole batch; the batch then runs
//! again turn by turn, so that only the turn at fault is refused ([`isolating`]).

/// The end of a settle statement, after its `settled` rows (`id`, `account_id`, `key_id`,
/// `reserved`, `billed`, and what the rollups read): locks their accounts in id order, releases
/// what the turns held and debits their bills, from the accounts and their keys' month, rolls
/// them up, and answers each row's `id` and `billed`.
macro_rules! after_settled {
    () => {
        concat!(
            "per_account AS (
             SELECT account_id, sum(reserved)::bigint AS reserved, sum(billed)::bigint AS billed
             FROM settled GROUP BY account_id
         ), account AS (
             SELECT id FROM accounts WHERE id IN (SELECT account_id FROM per_account)
             ORDER BY id FOR NO KEY UPDATE
         ), debited AS (
             UPDATE accounts a
             SET reserved = a.reserved - p.reserved, balance = a.balance - p.billed
             FROM per_account p JOIN account ON account.id = p.account_id
             WHERE a.id = p.account_id
         ), per_key AS (
             SELECT key_id, account_id, sum(reserved)::bigint AS reserved,
                 sum(billed)::bigint AS billed
             FROM settled GROUP BY key_id, account_id
         ), key_debited AS (
             UPDATE api_keys k
             SET month_reserved = greatest(k.month_reserved - p.reserved, 0),
                 month_spent = p.billed + CASE WHEN k.spend_month = utc_month()
                     THEN k.month_spent ELSE 0 END,
                 spend_month = utc_month()
             FROM per_key p JOIN account ON account.id = p.account_id
             WHERE k.id = p.key_id
         ), ",
            rolled_up!(
                "SELECT s.*, 1 AS sign FROM settled s JOIN account ON account.id = s.account_id"
            ),
            "
             SELECT id, billed FROM settled"
        )
    };
}

mod reserved;

use std::collections::HashMap;

use futures::future::BoxFuture;

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;
use sqlx::Row;
use time::OffsetDateTime;

use super::super::{LedgerError, MessageRecord, NewReservation, Settlement};
use super::allotment::Written;
use super::lease::Lease;
use super::name_keys::NameKeys;
use crate::db::{from_db, name_of, to_db, Database, DbError};
use crate::ledger::message_id;
use crate::metrics;
use crate::usage::{StopReason, TokenUsage};

/// Holds, per turn, what its account's available credits allow between `min` and `max`, in
/// `reservations`; a turn whose account has less than `min` holds nothing and is answered with
/// what was available.
pub async fn reserve(
    db: &Database,
    lease: &Lease,
    names: &NameKeys,
    turns: Vec<NewReservation>,
) -> Vec<Result<u64, LedgerError>> {
    metrics::ledger_batch("reserve", turns.len());
    let mut answers: HashMap<&str, Result<u64, LedgerError>> = HashMap::new();
    let mut pending: Vec<&NewReservation> = turns.iter().collect();
    // Each statement decides at least the first pending turn of every account, so this ends;
    // a second round only happens when an account ran short within the batch.
    while !pending.is_empty() {
        match reserve_once(db, lease, names, &pending).await {
            Ok(decided) => {
                pending.retain(|t| {
                    let answer = decided
                        .get(t.record.id.as_str())
                        .map(|&decided| decided.map_err(|refusal| refusal.error(t.max)));
                    match answer {
                        Some(answer) => {
                            answers.insert(&t.record.id, answer);
                            false
                        }
                        None => true,
                    }
                });
            }
            // The account's check (`reserved <= balance`) refused the statement: credits other
            // statements took meanwhile. What the statement reserves never passes what it
            // read as available, so this is the account running out under concurrency, the
            // client's 402, not an outage's 503.
            Err(e) if e.constraint().is_some() => {
                tracing::warn!(error = %e, "reservation refused by the account's check; answered as too few credits");
                for t in pending.drain(..) {
                    let refusal = LedgerError::InsufficientCredits {
                        needed: t.max,
                        available: 0,
                    };
                    answers.insert(&t.record.id, Err(refusal));
                }
            }
            Err(e) => {
                let e = LedgerError::from(e);
                for t in pending.drain(..) {
                    answers.insert(&t.record.id, Err(same(&e)));
                }
            }
        }
    }
    turns
        .iter()
        .map(|t| {
            answers
                .remove(t.record.id.as_str())
                .unwrap_or_else(|| Err(LedgerError::Unavailable("reservation not answered".into())))
        })
        .collect()
}

/// Why a reserve statement held nothing for a turn.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    Credits { available: u64 },
    SpendCap { cap: u64, used: u64 },
}

impl Refusal {
    fn error(self, needed: u64) -> LedgerError {
        match self {
            Self::Credits { available } => LedgerError::InsufficientCredits { needed, available },
            Self::SpendCap { cap, used } => LedgerError::SpendCapReached { cap, used, needed },
        }
    }
}

/// One reserve statement. A turn is decided when every turn of its account before it in the
/// batch held its `max`: what is left for it is then exact. The others (their account ran
/// short earlier in the batch) change nothing and are not in the answer: the amount held, or
/// why it was refused, by message id.
async fn reserve_once(
    db: &Database,
    lease: &Lease,
    names: &NameKeys,
    turns: &[&NewReservation],
) -> Result<HashMap<String, Result<u64, Refusal>>, DbError> {
    let c = ReserveColumns::of(turns.iter().copied());
    let keys = c.row.keys(db, names).await?;
    let rows = db
        .bounded(
            sqlx::query(
                "WITH turn AS (
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[],
                         $5::integer[], $6::bool[], $7::timestamptz[],
                         $8::bigint[], $9::bigint[], $12::bigint[], $13::text[], $14::text[])
                     WITH ORDINALITY
                     AS t(id, account_id, key_id, route_id, upstream_id, stream, created_at, min,
                          max, cap, batch_id, end_user, ord)
                 ), account AS (
                     SELECT id, balance - reserved AS available FROM accounts
                     WHERE id IN (SELECT account_id FROM turn)
                     ORDER BY id FOR NO KEY UPDATE
                 ), capped_key AS (
                     -- Locked after their accounts (the join), as every statement does, and
                     -- read as last committed: what the key spent and holds this month.
                     SELECT k.id, k.month_reserved
                         + CASE WHEN k.spend_month = utc_month() THEN k.month_spent ELSE 0 END
                         AS used
                     FROM api_keys k JOIN account ON account.id = k.account_id
                     WHERE k.id IN (SELECT key_id FROM turn WHERE cap IS NOT NULL)
                     ORDER BY k.id FOR NO KEY UPDATE OF k
                 ), queued AS (
                     -- What the account (and a capped key) has left for each turn once the
                     -- turns before it in this batch took their most (an unknown account has
                     -- nothing).
                     SELECT t.id, t.account_id, t.ord, t.min, t.max, t.cap,
                         account.id IS NOT NULL AS known,
                         coalesce(account.available, 0) - coalesce(sum(t.max) OVER (
                             PARTITION BY t.account_id ORDER BY t.ord
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::bigint
                             AS account_left,
                         coalesce(k.used, 0) AS used,
                         t.cap - coalesce(k.used, 0) - coalesce(sum(t.max) OVER (
                             PARTITION BY t.key_id ORDER BY t.ord
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::bigint
                             AS key_left
                     FROM turn t LEFT JOIN account ON account.id = t.account_id
                     LEFT JOIN capped_key k ON k.id = t.key_id AND t.cap IS NOT NULL
                 ), sized AS (
                     SELECT *, least(account_left, coalesce(key_left, account_left)) AS left_for
                     FROM queued
                 ), exact AS (
                     -- Decided only when every turn before it of its account held its most,
                     -- so that what is left for it is exact; the others wait for a second
                     -- statement.
                     SELECT *, coalesce(bool_and(left_for >= max) OVER (
                         PARTITION BY account_id ORDER BY ord
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS decidable
                     FROM sized
                 ), decided AS (
                     SELECT id, greatest(account_left, 0) AS left_for, cap, used,
                         known AND account_left >= min AND key_left < min AS over_cap,
                         CASE WHEN known AND left_for >= min THEN least(max, left_for) END AS amount
                     FROM exact WHERE decidable
                 ), held AS (
                     UPDATE accounts a SET reserved = a.reserved + h.amount
                     FROM (SELECT t.account_id, sum(d.amount)::bigint AS amount
                           FROM decided d JOIN turn t ON t.id = d.id
                           WHERE d.amount IS NOT NULL GROUP BY t.account_id) h
                     WHERE a.id = h.account_id
                 ), key_held AS (
                     UPDATE api_keys k SET month_reserved = k.month_reserved + h.amount
                     FROM (SELECT t.key_id, sum(d.amount)::bigint AS amount
                           FROM decided d JOIN turn t ON t.id = d.id
                           WHERE d.amount IS NOT NULL GROUP BY t.key_id) h
                     WHERE k.id = h.key_id
                 ), held_turn AS (
                     -- Its row is written when it ends (migration 0026).
                     INSERT INTO reservations (id, account_id, key_id, route_id, upstream_id,
                         stream, reserved, instance_id, instance_epoch, created_at, batch_id,
                         end_user)
                     SELECT t.id, t.account_id, t.key_id, t.route_id, t.upstream_id, t.stream,
                         d.amount, $10, $11, t.created_at, t.batch_id, t.end_user
                     FROM turn t JOIN decided d ON d.id = t.id
                     WHERE d.amount IS NOT NULL
                 )
                 SELECT id, amount, left_for, over_cap, cap, used FROM decided",
            )
            .bind_row(c.row, keys)
            .bind(c.min)
            .bind(c.max)
            .bind(&lease.id)
            .bind(lease.epoch())
            .bind(c.cap)
            .bind(c.batch_id)
            .bind(c.end_user)
            .fetch_all(db.pool()),
        )
        .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get("id")?;
            let amount: Option<i64> = row.try_get("amount")?;
            let left: i64 = row.try_get("left_for")?;
            let over_cap: Option<bool> = row.try_get("over_cap")?;
            let cap: Option<i64> = row.try_get("cap")?;
            let used: i64 = row.try_get("used")?;
            let refusal = match (over_cap, cap) {
                (Some(true), Some(cap)) => Refusal::SpendCap {
                    cap: from_db(cap),
                    used: from_db(used),
                },
                _ => Refusal::Credits {
                    available: from_db(left),
                },
            };
            Ok((id, amount.map(from_db).ok_or(refusal)))
        })
        .collect::<Result<HashMap<_, _>, sqlx::Error>>()
        .map_err(DbError::Sql)
}

/// Ends each turn held in `reservations`: writes its row with its usage, bills at most what
/// it reserved (nothing when it failed), and debits the accounts. `None` for a turn held
/// nowhere (already settled, or reaped): it changes nothing.
pub async fn settle(
    db: &Database,
    names: &NameKeys,
    turns: &[Settlement],
) -> Vec<Result<Option<u64>, LedgerError>> {
    let turns: Vec<&Settlement> = turns.iter().collect();
    let mut answers = isolating("settle", &turns, |turns| {
        Box::pin(reserved::settle(db, names, turns))
    })
    .await;
    // Not in `reservations`: reserved in `messages` by a process of before 0026 (at the time
    // its id carries, then, for an id of before 0020, by id alone in every partition), or
    // settled already (a replay).
    for lookup in [Lookup::ByTime, Lookup::ById] {
        let missed: Vec<usize> = (0..turns.len())
            .filter(|&i| matches!(answers[i], Ok(None)))
            .filter(|&i| lookup == Lookup::ByTime || by_time(&turns[i].message_id))
            .collect();
        if missed.is_empty() {
            break;
        }
        let again: Vec<&Settlement> = missed.iter().map(|&i| turns[i]).collect();
        let found = isolating("settle", &again, |turns| {
            Box::pin(settle_rows(db, names, turns, lookup))
        })
        .await;
        for (i, answer) in missed.into_iter().zip(found) {
            answers[i] = answer;
        }
    }
    answers
}

/// How a statement finds a turn's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lookup {
    /// At the time its id carries (when it carries one): one partition.
    ByTime,
    /// By id alone, in every partition: for ids minted before 0020.
    ById,
}

impl Lookup {
    /// The `created_at` a statement looks for `id`'s row at (`None`: any).
    fn created_at(self, id: &str) -> Option<OffsetDateTime> {
        match self {
            Self::ByTime => message_id::created_at(id),
            Self::ById => None,
        }
    }
}

/// [`settle`] of turns reserved in `messages` (by a process of before 0026), found by
/// `lookup`.
async fn settle_rows(
    db: &Database,
    names: &NameKeys,
    turns: &[&Settlement],
    lookup: Lookup,
) -> Vec<Result<Option<u64>, LedgerError>> {
    let n = turns.len();
    let mut c = SettleColumns::of(turns.iter().copied());
    let upstream_id = match c.upstream_keys(db, names).await {
        Ok(keys) => keys,
        Err(e) => return answer_billed(Err(e), std::iter::empty(), n),
    };
    c.created_at = turns
        .iter()
        .map(|t| lookup.created_at(&t.message_id))
        .collect();
    let (from, to) = days_of(&c.created_at);
    let rows = db
        .bounded(
            sqlx::query(concat!(
                "WITH turn AS (
                     SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[],
                         $5::bigint[], $6::bigint[], $7::bigint[], $8::text[], $9::bigint[],
                         $10::integer[], $11::timestamptz[])
                     AS t(id, status, cost, input_tokens, output_tokens,
                          cache_creation_input_tokens, cache_read_input_tokens, stop_reason,
                          latency_ms, upstream_id, created_at)
                 ), settled AS (
                     UPDATE messages m SET status = t.status,
                         billed = CASE WHEN t.status = 'failed' THEN 0 ELSE least(t.cost, m.reserved) END,
                         input_tokens = t.input_tokens, output_tokens = t.output_tokens,
                         cache_creation_input_tokens = t.cache_creation_input_tokens,
                         cache_read_input_tokens = t.cache_read_input_tokens,
                         stop_reason = t.stop_reason, latency_ms = t.latency_ms,
                         settled_at = now(),
                         -- The upstream that served it, when fallback moved it on; a row of
                         -- before 0025 then names it by key too (never both ways).
                         upstream_id = coalesce(t.upstream_id, m.upstream_id),
                         provider = CASE WHEN t.upstream_id IS NULL THEN m.provider END,
                         upstream = CASE WHEN t.upstream_id IS NULL THEN m.upstream END,
                         upstream_model = CASE WHEN t.upstream_id IS NULL THEN m.upstream_model END
                     FROM turn t WHERE m.id = t.id AND m.status = 'reserved'
                         -- The row at the time its id carries; the batch's bounds leave
                         -- out, when the statement is planned, every partition but its days'.
                         AND m.created_at = coalesce(t.created_at, m.created_at)
                         AND m.created_at >= coalesce($12::timestamptz, '-infinity')
                         AND m.created_at <= coalesce($13::timestamptz, 'infinity')
                     RETURNING m.id, m.account_id, m.key_id, m.reserved, m.billed,
                         message_model(m.route_id, m.model) AS model,
                         m.created_at, m.batch_id, m.status, m.input_tokens, m.output_tokens,
                         m.cache_creation_input_tokens, m.cache_read_input_tokens
                 ), ",
                after_settled!()
            ))
            .bind(c.id)
            .bind(c.status)
            .bind(c.cost)
            .bind_usage(c.usage)
            .bind(upstream_id)
            .bind(c.created_at)
            .bind(from)
            .bind(to)
            // Unnamed, so planned with its bounds each time: a cached generic plan locks every
            // partition at each run (Postgres locks a generic plan's partitions before it
            // prunes them): 4 locks a day, 1,600 for a year, past the lock table's size.
            .persistent(false)
            .fetch_all(db.pool()),
        )
        .await;
    answer_billed(rows, turns.iter().map(|t| t.message_id.as_str()), n)
}

/// The first and last times of a batch's rows; `None` for an open end, when a row is looked
/// for at any time.
fn days_of(
    created_at: &[Option<OffsetDateTime>],
) -> (Option<OffsetDateTime>, Option<OffsetDateTime>) {
    let times: Option<Vec<OffsetDateTime>> = created_at.iter().copied().collect();
    let times = times.unwrap_or_default();
    (times.iter().min().copied(), times.iter().max().copied())
}

/// Writes the rows of turns that took from allotments, settled, and debits each bill from its
/// allotment and its account's balance. A turn is billed only from an allotment of this
/// process' current lease (the lease row is locked, so the reaper cannot return the allotment
/// meanwhile) that holds what the batch's turns of it bill; otherwise (the reaper returned it:
/// this process was taken for dead) it is written `unbilled`, billed nothing. A row already
/// written changes nothing. Answers, per turn, what it was billed, or `None` when it was
/// already written.
pub async fn write(
    db: &Database,
    instance: &str,
    names: &NameKeys,
    turns: &[Written],
) -> Vec<Result<Option<u64>, LedgerError>> {
    isolating("write", turns, |turns| {
        Box::pin(async move {
            let n = turns.len();
            match write_rows(db, instance, names, turns).await {
                Ok(rows) => answer_billed(Ok(rows), turns.iter().map(|t| t.record.id.as_str()), n),
                Err(e) => answer_billed(Err(e), std::iter::empty(), n),
            }
        })
    })
    .await
}

/// One write statement: the `(id, billed)` rows it wrote.
///
/// Its commit is asynchronous (`synchronous_commit` off for this transaction alone): the
/// answer waits for Postgres to have applied the rows, not for the WAL flush, which kept an
/// fsync (6 ms p50, 25 ms p99 on the benchmark's disk) on every answer's path. Only a crash
/// of the Postgres server itself can lose such a commit (the last `wal_writer_delay` × 3,
/// 0.6 s by default), and what it loses is the rows and their debits together: those turns
/// are under-billed, never billed twice or above what they were told. Reservations, refills,
/// top-ups and voids keep synchronous commits.
pub async fn write_rows(
    db: &Database,
    instance: &str,
    names: &NameKeys,
    turns: &[Written],
) -> Result<Vec<sqlx::postgres::PgRow>, DbError> {
    metrics::ledger_batch("write", turns.len());
    let c = WrittenColumns::of(turns);
    let keys = c.row.keys(db, names).await?;
    db.bounded(
        sqlx::query(concat!(
            "WITH turn AS (
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[],
                         $5::integer[], $6::bool[], $7::timestamptz[],
                         $8::text[], $9::text[], $10::bigint[], $11::bigint[], $12::bigint[],
                         $13::bigint[], $14::bigint[], $15::bigint[], $16::text[], $17::bigint[],
                         $19::text[], $20::text[])
                     AS t(id, account_id, key_id, route_id, upstream_id, stream, created_at,
                          pool_id, status, reserved, billed, input_tokens, output_tokens,
                          cache_creation_input_tokens, cache_read_input_tokens, stop_reason,
                          latency_ms, batch_id, end_user)
                 ), unflushed AS (
                     -- This statement's commit does not wait for the WAL to reach the disk
                     -- (see the function's doc); it is read, so it runs, before the commit.
                     SELECT set_config('synchronous_commit', 'off', true) AS setting
                 ), lease AS (
                     -- Locked first, as the reaper's delete of it and the refills lock it.
                     SELECT id, epoch FROM gateway_instances WHERE id = $18 FOR KEY SHARE
                 ), account AS (
                     SELECT id FROM accounts WHERE id IN (SELECT account_id FROM turn)
                     AND EXISTS (SELECT 1 FROM lease)
                     ORDER BY id FOR NO KEY UPDATE
                 ), held AS (
                     SELECT al.id, al.credits FROM allotments al
                     JOIN account ON account.id = al.account_id
                     JOIN lease ON lease.id = al.instance_id AND lease.epoch = al.epoch
                     WHERE al.id IN (SELECT pool_id FROM turn)
                     FOR UPDATE OF al
                 ), pool AS (
                     -- An allotment bills the batch's turns only if it holds all they bill.
                     SELECT held.id FROM held JOIN turn t ON t.pool_id = held.id
                     GROUP BY held.id, held.credits HAVING held.credits >= sum(t.billed)
                 ), written AS (
                     INSERT INTO messages (id, account_id, key_id, route_id, upstream_id, stream,
                         status, reserved, billed, input_tokens, output_tokens,
                         cache_creation_input_tokens, cache_read_input_tokens, stop_reason,
                         latency_ms, instance_id, created_at, settled_at, batch_id, end_user)
                     SELECT t.id, t.account_id, t.key_id, t.route_id, t.upstream_id, t.stream,
                         CASE WHEN pool.id IS NULL THEN 'unbilled' ELSE t.status END,
                         t.reserved, CASE WHEN pool.id IS NULL THEN 0 ELSE t.billed END,
                         t.input_tokens, t.output_tokens, t.cache_creation_input_tokens,
                         t.cache_read_input_tokens, t.stop_reason, t.latency_ms, $18,
                         t.created_at, now(), t.batch_id, t.end_user
                     FROM turn t LEFT JOIN pool ON pool.id = t.pool_id
                     ON CONFLICT (id, created_at) DO NOTHING
                     RETURNING id, billed, account_id, key_id,
                         message_model(route_id, model) AS model, created_at, batch_id,
                         status, input_tokens, output_tokens, cache_creation_input_tokens,
                         cache_read_input_tokens
                 ), per_pool AS (
                     SELECT t.pool_id, t.account_id, sum(w.billed)::bigint AS billed
                     FROM written w JOIN turn t ON t.id = w.id
                     GROUP BY t.pool_id, t.account_id
                 ), drawn AS (
                     UPDATE allotments al SET credits = al.credits - p.billed
                     FROM per_pool p WHERE al.id = p.pool_id AND p.billed > 0
                 ), per_account AS (
                     SELECT account_id, sum(billed)::bigint AS billed
                     FROM per_pool GROUP BY account_id
                 ), debited AS (
                     UPDATE accounts a
                     SET reserved = a.reserved - p.billed, balance = a.balance - p.billed
                     FROM per_account p WHERE a.id = p.account_id AND p.billed > 0
                 ), per_key AS (
                     SELECT t.key_id, t.account_id, sum(w.billed)::bigint AS billed
                     FROM written w JOIN turn t ON t.id = w.id
                     GROUP BY t.key_id, t.account_id
                 ), key_debited AS (
                     UPDATE api_keys k
                     SET month_spent = p.billed + CASE WHEN k.spend_month = utc_month()
                             THEN k.month_spent ELSE 0 END,
                         spend_month = utc_month()
                     FROM per_key p JOIN account ON account.id = p.account_id
                     WHERE k.id = p.key_id AND p.billed > 0
                 ), ",
            // Not joined to the locked accounts: a row written `unbilled` (its lease
            // gone) locks none, and is rolled up all the same; such a statement locks
            // nothing after its rollup rows, so it cannot close a cycle.
            rolled_up!("SELECT w.*, 1 AS sign FROM written w"),
            "
                 SELECT id, billed FROM written, unflushed"
        ))
        .bind_row(c.row, keys)
        .bind(c.pool_id)
        .bind(c.status)
        .bind(c.reserved)
        .bind(c.billed)
        .bind_usage(c.usage)
        .bind(instance)
        .bind(c.batch_id)
        .bind(c.end_user)
        .fetch_all(db.pool()),
    )
    .await
}

/// Makes a message billed nothing, for good: a `reserved` row releases what it holds; a row
/// billed by a statement whose answer was lost gets its bill back (into its allotment, when
/// `pool` still holds it, as the write took it from there). Rows already billed nothing
/// (failed, abandoned, unbilled) are left as they are; either way it ends billed 0.
pub async fn void(db: &Database, message_id: &str, pool: Option<&str>) -> Result<(), DbError> {
    if reserved::void(db, message_id).await? {
        return Ok(());
    }
    if !void_row(db, message_id, pool, Lookup::ByTime).await? && by_time(message_id) {
        void_row(db, message_id, pool, Lookup::ById).await?;
    }
    Ok(())
}

/// Whether an id carries a time its row may not have (an id of before 0020): a statement
/// that found nothing at that time looks again by id alone.
fn by_time(message_id: &str) -> bool {
    message_id::created_at(message_id).is_some()
}

/// [`void`] of the row in `messages` found by `lookup`; whether there was one.
async fn void_row(
    db: &Database,
    message_id: &str,
    pool: Option<&str>,
    lookup: Lookup,
) -> Result<bool, DbError> {
    let found: i64 = db
        .bounded(
            sqlx::query_scalar(concat!(
                "WITH old AS (
                 SELECT id, account_id, key_id, status, reserved, billed, created_at
                 FROM messages
                 WHERE id = $1 AND created_at >= coalesce($3::timestamptz, '-infinity')
                     AND created_at <= coalesce($3::timestamptz, 'infinity')
                 FOR UPDATE
             ), account AS (
                 SELECT id FROM accounts WHERE id IN (SELECT account_id FROM old)
                 FOR NO KEY UPDATE
             ), pool AS (
                 SELECT al.id FROM allotments al JOIN account ON account.id = al.account_id
                 WHERE al.id = $2 FOR UPDATE OF al
             ), voided AS (
                 UPDATE messages m
                 SET status = 'unbilled', billed = 0, settled_at = coalesce(m.settled_at, now())
                 FROM old JOIN account ON account.id = old.account_id
                 WHERE m.id = old.id AND m.created_at = old.created_at
                     AND m.created_at >= coalesce($3::timestamptz, '-infinity')
                     AND m.created_at <= coalesce($3::timestamptz, 'infinity')
                     AND old.status NOT IN ('failed', 'abandoned', 'unbilled')
                 RETURNING old.account_id, old.key_id, old.status = 'reserved' AS held,
                     old.reserved, old.billed, old.status,
                     message_model(m.route_id, m.model) AS model, m.created_at, m.batch_id,
                     m.input_tokens, m.output_tokens, m.cache_creation_input_tokens,
                     m.cache_read_input_tokens
             ), key_voided AS (
                 UPDATE api_keys k
                 SET month_reserved = CASE WHEN v.held
                         THEN greatest(k.month_reserved - v.reserved, 0) ELSE k.month_reserved END,
                     month_spent = CASE WHEN NOT v.held AND k.spend_month = utc_month()
                         THEN greatest(k.month_spent - v.billed, 0) ELSE k.month_spent END
                 FROM voided v WHERE k.id = v.key_id
             ), refilled AS (
                 UPDATE allotments al SET credits = al.credits + v.billed
                 FROM voided v, pool WHERE al.id = pool.id AND NOT v.held
                 RETURNING v.billed
             ), debited AS (
                 UPDATE accounts a
                 SET reserved = a.reserved - CASE WHEN v.held THEN v.reserved ELSE 0 END
                         + coalesce((SELECT sum(billed) FROM refilled), 0),
                     balance = a.balance + CASE WHEN v.held THEN 0 ELSE v.billed END
                 FROM voided v WHERE a.id = v.account_id
             ), ",
                // The row ends `unbilled`, billed nothing; a bill it had is taken out again.
                rolled_up!(
                    "SELECT account_id, key_id, model, created_at, batch_id, 'unbilled' AS status,
                     0 AS billed, input_tokens, output_tokens, cache_creation_input_tokens,
                     cache_read_input_tokens, 1 AS sign
                 FROM voided
                 UNION ALL
                 SELECT account_id, key_id, model, created_at, batch_id, status, billed,
                     input_tokens, output_tokens, cache_creation_input_tokens,
                     cache_read_input_tokens, -1
                 FROM voided WHERE NOT held"
                ),
                "
             SELECT count(*) FROM old"
            ))
            .bind(message_id)
            .bind(pool)
            .bind(lookup.created_at(message_id))
            .persistent(false)
            .fetch_one(db.pool()),
        )
        .await?;
    Ok(found > 0)
}

/// Marks a turn whose release Postgres refuses (its account's books break a constraint) as
/// billed nothing, moving no money: the row says what its client was told, and what it holds
/// stays held for an operator to look at.
pub async fn mark_unbilled(db: &Database, message_id: &str) -> Result<(), DbError> {
    if reserved::mark_unbilled(db, message_id).await? {
        return Ok(());
    }
    if !mark_row_unbilled(db, message_id, Lookup::ByTime).await? && by_time(message_id) {
        mark_row_unbilled(db, message_id, Lookup::ById).await?;
    }
    Ok(())
}

/// [`mark_unbilled`] of a row reserved in `messages` (by a process of before 0026), found by
/// `lookup`; whether it was marked.
async fn mark_row_unbilled(
    db: &Database,
    message_id: &str,
    lookup: Lookup,
) -> Result<bool, DbError> {
    let marked: i64 = db
        .bounded(
            sqlx::query_scalar(concat!(
                "WITH marked AS (
                     UPDATE messages SET status = 'unbilled', billed = 0, settled_at = now()
                     WHERE id = $1 AND status = 'reserved'
                         AND created_at >= coalesce($2::timestamptz, '-infinity')
                         AND created_at <= coalesce($2::timestamptz, 'infinity')
                     RETURNING account_id, key_id, message_model(route_id, model) AS model,
                         created_at, batch_id, status, billed, input_tokens, output_tokens,
                         cache_creation_input_tokens, cache_read_input_tokens
                 ), ",
                rolled_up!("SELECT *, 1 AS sign FROM marked"),
                "
                 SELECT count(*) FROM marked"
            ))
            .bind(message_id)
            .bind(lookup.created_at(message_id))
            .persistent(false)
            .fetch_one(db.pool()),
        )
        .await?;
    Ok(marked > 0)
}

/// Runs `statement` over the batch; when Postgres refused it (a constraint: one turn at fault
/// fails them all), again turn by turn, so that only the turns at fault are refused, each
/// counted and reported.
async fn isolating<'a, T, R>(
    op: &'static str,
    turns: &'a [T],
    statement: impl Fn(&'a [T]) -> BoxFuture<'a, Vec<Result<R, LedgerError>>>,
) -> Vec<Result<R, LedgerError>> {
    let refused = |answers: &[Result<R, LedgerError>]| {
        answers
            .iter()
            .any(|a| matches!(a, Err(LedgerError::Refused(_))))
    };
    let answers = statement(turns).await;
    if !refused(&answers) {
        return answers;
    }
    let each = if turns.len() == 1 {
        answers
    } else {
        let mut each = Vec::with_capacity(turns.len());
        for turn in turns.chunks(1) {
            each.extend(statement(turn).await);
        }
        each
    };
    for _ in each
        .iter()
        .filter(|a| matches!(a, Err(LedgerError::Refused(_))))
    {
        metrics::ledger_refused(op);
        tracing::error!(op, "the ledger refused a turn's statement; not retried");
    }
    each
}

/// Each turn's billed amount from a statement's `(id, billed)` rows; `None` for a turn with
/// no row (it changed nothing).
fn answer_billed<'a>(
    rows: Result<Vec<sqlx::postgres::PgRow>, DbError>,
    ids: impl Iterator<Item = &'a str>,
    n: usize,
) -> Vec<Result<Option<u64>, LedgerError>> {
    let billed = rows.and_then(|rows| {
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get::<String, _>("id")?,
                    row.try_get::<i64, _>("billed")?,
                ))
            })
            .collect::<Result<HashMap<_, _>, sqlx::Error>>()
            .map_err(DbError::Sql)
    });
    match billed {
        Ok(billed) => ids
            .map(|id| Ok(billed.get(id).copied().map(from_db)))
            .collect(),
        Err(e) => {
            let e = LedgerError::from(e);
            (0..n).map(|_| Err(same(&e))).collect()
        }
    }
}

/// The same answer for another turn of a batch whose statement failed (it changed nothing).
fn same(e: &LedgerError) -> LedgerError {
    match e {
        LedgerError::Refused(c) => LedgerError::Refused(c.clone()),
        e => LedgerError::Unavailable(e.to_string()),
    }
}

/// A message row's own columns, one array parameter each: what a reserve and a write both
/// insert, bound as `$1` to `$7` by [`Columns::bind_row`] with the keys of their names.
#[derive(Default)]
struct RowColumns<'a> {
    id: Vec<&'a str>,
    account_id: Vec<&'a str>,
    key_id: Vec<&'a str>,
    /// `[model, served_model, endpoint]`: the row keeps their key.
    route: Vec<[&'a str; 3]>,
    /// `[provider, upstream, upstream_model]`: the row keeps their key.
    upstream: Vec<[&'a str; 3]>,
    stream: Vec<bool>,
    created_at: Vec<OffsetDateTime>,
}

/// The keys of a batch's route and upstream names, in the batch's order.
struct RowKeys {
    route_id: Vec<i32>,
    upstream_id: Vec<i32>,
}

impl<'a> RowColumns<'a> {
    fn push(&mut self, m: &'a MessageRecord) {
        self.id.push(&m.id);
        self.account_id.push(&m.account_id);
        self.key_id.push(&m.key_id);
        self.route.push([&m.model, &m.served_model, m.endpoint]);
        self.upstream
            .push([&m.provider, &m.upstream, &m.upstream_model]);
        self.stream.push(m.stream);
        self.created_at.push(m.created_at);
    }

    async fn keys(&self, db: &Database, names: &NameKeys) -> Result<RowKeys, DbError> {
        Ok(RowKeys {
            route_id: names.routes(db, &self.route).await?,
            upstream_id: names.upstreams(db, &self.upstream).await?,
        })
    }
}

/// What a turn used, one array parameter each: what a settle and a write both record, bound
/// (six parameters) by [`Columns::bind_usage`].
#[derive(Default)]
struct UsageColumns {
    input_tokens: Vec<i64>,
    output_tokens: Vec<i64>,
    cache_creation_input_tokens: Vec<i64>,
    cache_read_input_tokens: Vec<i64>,
    stop_reason: Vec<Option<String>>,
    latency_ms: Vec<i64>,
}

impl UsageColumns {
    fn push(&mut self, usage: &TokenUsage, stop_reason: Option<StopReason>, latency_ms: u64) {
        self.input_tokens.push(usage.input_tokens.into());
        self.output_tokens.push(usage.output_tokens.into());
        self.cache_creation_input_tokens
            .push(usage.cache_creation_input_tokens.into());
        self.cache_read_input_tokens
            .push(usage.cache_read_input_tokens.into());
        self.stop_reason.push(stop_reason.map(|r| name_of(&r)));
        self.latency_ms.push(to_db(latency_ms));
    }
}

/// A batch's turns, column by column (one array parameter each).
trait Batch<'a>: Default {
    type Turn: 'a;

    fn push(&mut self, turn: &'a Self::Turn);

    fn of(turns: impl IntoIterator<Item = &'a Self::Turn>) -> Self {
        let mut columns = Self::default();
        for turn in turns {
            columns.push(turn);
        }
        columns
    }
}

type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// Binds column groups in their order.
trait Columns<'q> {
    fn bind_row(self, row: RowColumns<'q>, keys: RowKeys) -> Self;
    fn bind_usage(self, usage: UsageColumns) -> Self;
}

impl<'q> Columns<'q> for PgQuery<'q> {
    fn bind_row(self, c: RowColumns<'q>, keys: RowKeys) -> Self {
        self.bind(c.id)
            .bind(c.account_id)
            .bind(c.key_id)
            .bind(keys.route_id)
            .bind(keys.upstream_id)
            .bind(c.stream)
            .bind(c.created_at)
    }

    fn bind_usage(self, c: UsageColumns) -> Self {
        self.bind(c.input_tokens)
            .bind(c.output_tokens)
            .bind(c.cache_creation_input_tokens)
            .bind(c.cache_read_input_tokens)
            .bind(c.stop_reason)
            .bind(c.latency_ms)
    }
}

/// The turns of a reserve batch.
#[derive(Default)]
struct ReserveColumns<'a> {
    row: RowColumns<'a>,
    min: Vec<i64>,
    max: Vec<i64>,
    cap: Vec<Option<i64>>,
    batch_id: Vec<Option<&'a str>>,
    end_user: Vec<Option<&'a str>>,
}

impl<'a> Batch<'a> for ReserveColumns<'a> {
    type Turn = NewReservation;

    fn push(&mut self, t: &'a NewReservation) {
        self.row.push(&t.record);
        self.min.push(to_db(t.min));
        self.max.push(to_db(t.max));
        self.cap.push(t.spend_cap.map(to_db));
        self.batch_id.push(t.record.batch_id.as_deref());
        self.end_user.push(t.record.end_user.as_deref());
    }
}

/// The turns of a settle batch.
#[derive(Default)]
struct SettleColumns<'a> {
    id: Vec<&'a str>,
    status: Vec<&'static str>,
    cost: Vec<i64>,
    usage: UsageColumns,
    /// `[provider, upstream, upstream_model]` of the upstream that served it, when fallback
    /// moved it past the one reserved with.
    served_by: Vec<Option<[&'a str; 3]>>,
    /// Where each row is looked for (see [`Lookup`]).
    created_at: Vec<Option<OffsetDateTime>>,
}

impl<'a> Batch<'a> for SettleColumns<'a> {
    type Turn = Settlement;

    fn push(&mut self, t: &'a Settlement) {
        let served_by = t.served_by.as_ref();
        self.id.push(&t.message_id);
        self.status.push(t.status.as_str());
        self.cost.push(to_db(t.cost));
        self.usage.push(&t.usage, t.stop_reason, t.latency_ms);
        self.served_by
            .push(served_by.map(|b| [b.provider.as_str(), &b.upstream, &b.upstream_model]));
    }
}

impl SettleColumns<'_> {
    /// The key of each turn's serving upstream (`None`: the one it was reserved with).
    async fn upstream_keys(
        &self,
        db: &Database,
        names: &NameKeys,
    ) -> Result<Vec<Option<i32>>, DbError> {
        let served: Vec<[&str; 3]> = self.served_by.iter().flatten().copied().collect();
        let mut keys = names.upstreams(db, &served).await?.into_iter();
        Ok(self
            .served_by
            .iter()
            .map(|served_by| served_by.and_then(|_| keys.next()))
            .collect())
    }
}

/// The rows of a write batch.
#[derive(Default)]
struct WrittenColumns<'a> {
    row: RowColumns<'a>,
    pool_id: Vec<&'a str>,
    status: Vec<&'static str>,
    reserved: Vec<i64>,
    billed: Vec<i64>,
    usage: UsageColumns,
    batch_id: Vec<Option<&'a str>>,
    end_user: Vec<Option<&'a str>>,
}

impl<'a> Batch<'a> for WrittenColumns<'a> {
    type Turn = Written;

    fn push(&mut self, t: &'a Written) {
        let m = &t.record;
        self.row.push(m);
        self.pool_id.push(&t.pool);
        self.status.push(m.status.as_str());
        self.reserved.push(to_db(m.reserved));
        self.billed.push(to_db(m.billed));
        self.usage
            .push(&m.usage, m.stop_reason, m.latency_ms.unwrap_or(0));
        self.batch_id.push(m.batch_id.as_deref());
        self.end_user.push(m.end_user.as_deref());
    }
}
