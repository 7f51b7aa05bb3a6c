//! Allotments: credits a gateway process holds for an account, so that the turns of a busy
//! account reserve in memory instead of waiting for a Postgres commit on the request path.
//!
//! An allotment is a row of `allotments` whose credits Postgres has moved into the account's
//! `reserved`, exactly as it does for one turn: no other process can spend them, so however
//! many processes hold allotments the balance is never overdrawn. A turn takes its most from
//! its process' allotment with no round trip; when it ends it is billed at most that, the rest
//! goes back to the allotment, and its ledger row is written in the background, debiting the
//! bill from the allotment and the balance in one statement.
//!
//! The policy, for an account's last credits and for failures:
//! - A grant takes at most a quarter of what the account has available, and none when that
//!   quarter would not cover half an allotment: an account running low is served turn by turn
//!   (each reserved in Postgres), and the allotments it had serve what they hold and are
//!   returned as soon as their turns are written, so they do not keep its last credits from
//!   other processes for long.
//! - An allotment unused for [`IDLE`] is returned; so are all of them when the process stops.
//! - A process uses its allotments only while its heartbeat is fresh (half the reaper's stale
//!   time): one cut off from Postgres stops spending them before the reaper can release them.
//! - The reaper returns the allotments of a process that stopped beating. Turns it had not
//!   written yet are billed nothing, as an abandoned reservation is: never an overcharge.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Row;

use super::super::{MessageRecord, NewReservation, Settlement};
use crate::db::{from_db, to_db, Database, DbError};
use crate::ids;

/// An allotment unused this long goes back to its account.
pub const IDLE: Duration = Duration::from_secs(2);

/// The allotments of this process, and the turns running on them.
pub struct Pools {
    /// An allotment aims to hold this many turns like the one that asked for it.
    turns: u64,
    /// How long a heartbeat keeps the allotments usable.
    fresh_for: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    fresh_until: Option<Instant>,
    by_account: HashMap<String, Pool>,
    /// Turns that took from an allotment and are not settled yet, by message id.
    taken: HashMap<String, Taken>,
    /// Settled turns whose rows are being written, by message id: what this process answers
    /// for them meanwhile, so that a message is found as soon as its client has the answer.
    unwritten: HashMap<String, Arc<MessageRecord>>,
}

struct Pool {
    id: String,
    /// Credits held and not taken by any turn.
    free: u64,
    /// Turns that took from it whose rows are not written yet.
    open: usize,
    last_used: Instant,
    growing: bool,
    /// A grant was refused (the account runs low): no more grants; it serves what it has left
    /// and is returned once `open` is 0.
    retiring: bool,
}

struct Taken {
    pool: String,
    amount: u64,
    record: MessageRecord,
}

/// A grant to ask Postgres for.
pub struct Grow {
    pub pool: String,
    pub account_id: String,
    pub want: u64,
    pub need: u64,
}

/// What [`Pools::take`] decided for a turn.
pub struct Take {
    /// Credits taken from the allotment; `None`: reserve this turn in Postgres.
    pub amount: Option<u64>,
    /// A grant to ask for: before retrying the turn when nothing was taken, else meanwhile.
    pub grow: Option<Grow>,
}

/// A settled turn's row, to write; the pool it drew from answers for its bill.
#[derive(Clone)]
pub struct Written {
    pub pool: String,
    /// Shared with the answer this process gives for it until it is written.
    pub record: Arc<MessageRecord>,
}

/// An allotment to return to its account.
pub struct Release {
    pub pool: String,
    pub account_id: String,
}

impl Pools {
    pub fn new(turns: u64, fresh_for: Duration) -> Self {
        Self {
            turns: turns.max(1),
            fresh_for,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the books half-changed: every change
        // under it is a few plain assignments.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This process' heartbeat, sent at `sent`, was recorded.
    pub fn beat(&self, sent: Instant) {
        self.state().fresh_until = Some(sent + self.fresh_for);
    }

    /// Takes the turn's most from its account's allotment. `may_grow`: whether to ask for a
    /// grant when the allotment cannot cover it (once per turn).
    pub fn take(&self, r: &NewReservation, may_grow: bool) -> Take {
        let now = Instant::now();
        let mut guard = self.state();
        let state = &mut *guard;
        let exact = Take {
            amount: None,
            grow: None,
        };
        if state.fresh_until.is_none_or(|until| until < now) || r.max == 0 {
            return exact;
        }
        let account_id = &r.record.account_id;
        let want = r.max.saturating_mul(self.turns);
        let pool = state
            .by_account
            .entry(account_id.clone())
            .or_insert_with(|| Pool {
                id: ids::allotment(),
                free: 0,
                open: 0,
                last_used: now,
                growing: false,
                retiring: false,
            });
        let grow = |pool: &mut Pool| {
            if pool.retiring {
                return None;
            }
            pool.growing = true;
            let want = want.saturating_sub(pool.free);
            Some(Grow {
                pool: pool.id.clone(),
                account_id: account_id.clone(),
                want,
                need: (want / 2).max(r.max),
            })
        };
        if pool.free >= r.max {
            pool.free -= r.max;
            pool.open += 1;
            pool.last_used = now;
            let grow = (!pool.growing && pool.free < want / 2)
                .then(|| grow(pool))
                .flatten();
            let taken = Taken {
                pool: pool.id.clone(),
                amount: r.max,
                record: r.record.clone(),
            };
            state.taken.insert(r.record.id.clone(), taken);
            return Take {
                amount: Some(r.max),
                grow,
            };
        }
        if pool.growing || pool.retiring || !may_grow {
            return exact;
        }
        Take {
            amount: None,
            grow: grow(pool),
        }
    }

    /// Postgres granted `credits` to the allotment (0: refused, the account runs low; `None`:
    /// the grant failed, nothing known).
    pub fn granted(&self, g: &Grow, credits: Option<u64>) {
        let mut state = self.state();
        let Some(p) = state
            .by_account
            .get_mut(&g.account_id)
            .filter(|p| p.id == g.pool)
        else {
            return;
        };
        p.growing = false;
        match credits {
            Some(0) => p.retiring = true,
            Some(credits) => p.free += credits,
            None => {}
        }
    }

    /// Settles a turn that took from an allotment: what it is billed (at most what it took;
    /// nothing when it failed) and its row to write, or `None` for a turn reserved in Postgres.
    pub fn settle(&self, s: &Settlement) -> Option<(u64, Written)> {
        let mut guard = self.state();
        let state = &mut *guard;
        let taken = state.taken.remove(&s.message_id)?;
        let billed = s.billed(taken.amount);
        if let Some(pool) = state
            .by_account
            .get_mut(&taken.record.account_id)
            .filter(|p| p.id == taken.pool)
        {
            pool.free += taken.amount - billed;
        }
        let mut record = taken.record;
        record.reserved = taken.amount;
        s.complete(&mut record, billed);
        let record = Arc::new(record);
        state.unwritten.insert(record.id.clone(), record.clone());
        Some((
            billed,
            Written {
                pool: taken.pool,
                record,
            },
        ))
    }

    /// A settled turn whose row is not written yet.
    pub fn unwritten(&self, message_id: &str) -> Option<MessageRecord> {
        let state = self.state();
        state
            .unwritten
            .get(message_id)
            .map(|r| MessageRecord::clone(r))
    }

    /// A turn's row is written.
    pub fn written(&self, w: &Written) {
        let (account_id, pool) = (&w.record.account_id, &w.pool);
        let mut state = self.state();
        state.unwritten.remove(&w.record.id);
        if let Some(p) = state
            .by_account
            .get_mut(account_id)
            .filter(|p| p.id == *pool)
        {
            p.open = p.open.saturating_sub(1);
            p.last_used = Instant::now();
        }
    }

    /// The allotments to return now: those with no turn in flight that were unused for `idle`
    /// (all of them with `Duration::ZERO`, or when the heartbeat is no longer fresh) or that
    /// retire. Their accounts' next turns start new ones.
    pub fn idle(&self, idle: Duration) -> Vec<Release> {
        let now = Instant::now();
        let mut state = self.state();
        let stale = state.fresh_until.is_none_or(|until| until < now);
        let done: Vec<String> = state
            .by_account
            .iter()
            .filter(|(_, p)| {
                p.open == 0
                    && !p.growing
                    && (stale || p.retiring || now.duration_since(p.last_used) >= idle)
            })
            .map(|(account, _)| account.clone())
            .collect();
        done.into_iter()
            .filter_map(|account_id| {
                let p = state.by_account.remove(&account_id)?;
                Some(Release {
                    pool: p.id,
                    account_id,
                })
            })
            .collect()
    }
}

/// Asks for up to `want` credits for the allotment, taking at most a quarter of what the
/// account has available and nothing unless that covers `need` (half of `want`: an account
/// with less than twice an allotment's worth available is served turn by turn, exactly).
/// Returns the credits granted.
pub async fn grow(db: &Database, instance: &str, g: &Grow) -> Result<u64, DbError> {
    let row = db
        .bounded(
            sqlx::query(
                "WITH account AS (
                     SELECT id, (balance - reserved) / 4 AS share FROM accounts
                     WHERE id = $3 FOR NO KEY UPDATE
                 ), granted AS (
                     SELECT id, least($4, share) AS credits FROM account WHERE share >= $5
                 ), held AS (
                     UPDATE accounts a SET reserved = a.reserved + g.credits
                     FROM granted g WHERE a.id = g.id
                 ), pool AS (
                     INSERT INTO allotments (id, instance_id, account_id, credits)
                     SELECT $1, $2, id, credits FROM granted
                     ON CONFLICT (id) DO UPDATE SET credits = allotments.credits + EXCLUDED.credits
                 )
                 SELECT coalesce((SELECT credits FROM granted), 0)::bigint AS credits",
            )
            .bind(&g.pool)
            .bind(instance)
            .bind(&g.account_id)
            .bind(to_db(g.want))
            .bind(to_db(g.need))
            .fetch_one(db.pool()),
        )
        .await?;
    Ok(from_db(row.try_get("credits").map_err(DbError::Sql)?))
}

/// Returns an allotment's credits to its account and deletes it. Only called once none of
/// its turns is left unwritten, so all it holds is free.
pub async fn release(db: &Database, r: &Release) -> Result<(), DbError> {
    db.bounded(
        sqlx::query(
            "WITH account AS (
                 SELECT id FROM accounts WHERE id = $2 FOR NO KEY UPDATE
             ), pool AS (
                 DELETE FROM allotments al USING account
                 WHERE al.id = $1 AND al.account_id = account.id
                 RETURNING al.account_id, al.credits
             )
             UPDATE accounts a SET reserved = a.reserved - p.credits
             FROM pool p WHERE a.id = p.account_id",
        )
        .bind(&r.pool)
        .bind(&r.account_id)
        .execute(db.pool()),
    )
    .await?;
    Ok(())
}

/// Returns the allotments of processes that have not beaten for `stale_ms`. Returns how many.
pub async fn reap(db: &Database, stale_ms: i64) -> Result<u64, DbError> {
    let row = db
        .bounded(
            sqlx::query(
                "WITH dead AS (
                     SELECT al.id, al.account_id FROM allotments al
                     WHERE NOT EXISTS (
                         SELECT 1 FROM gateway_instances g
                         WHERE g.id = al.instance_id
                           AND g.heartbeat_at > now() - $1 * interval '1 millisecond')
                 ), account AS (
                     -- In id order, as every statement that moves credits locks them.
                     SELECT id FROM accounts WHERE id IN (SELECT account_id FROM dead)
                     ORDER BY id FOR NO KEY UPDATE
                 ), pool AS (
                     DELETE FROM allotments al USING dead, account
                     WHERE al.id = dead.id AND account.id = dead.account_id
                     RETURNING al.account_id, al.credits
                 ), released AS (
                     SELECT account_id, sum(credits)::bigint AS credits, count(*) AS n
                     FROM pool GROUP BY account_id
                 ), accounts_released AS (
                     UPDATE accounts a SET reserved = a.reserved - r.credits
                     FROM released r WHERE a.id = r.account_id
                     RETURNING r.n
                 )
                 SELECT coalesce(sum(n), 0)::bigint AS reaped FROM accounts_released",
            )
            .bind(stale_ms)
            .fetch_one(db.pool()),
        )
        .await?;
    Ok(from_db(row.try_get("reaped").map_err(DbError::Sql)?))
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;

    use super::*;
    use crate::ledger::MessageStatus;
    use crate::wire::anthropic::TokenUsage;

    const MAX: u64 = 100;

    fn turn(id: &str) -> NewReservation {
        NewReservation {
            record: MessageRecord {
                id: id.into(),
                account_id: "acct".into(),
                key_id: "key".into(),
                model: "svc/haiku".into(),
                served_model: "svc/haiku".into(),
                provider: "simulated".into(),
                upstream: "u".into(),
                upstream_model: "m".into(),
                endpoint: "messages",
                stream: false,
                status: MessageStatus::Reserved,
                reserved: 0,
                billed: 0,
                usage: TokenUsage::default(),
                stop_reason: None,
                created_at: OffsetDateTime::now_utc(),
                latency_ms: None,
            },
            min: MAX,
            max: MAX,
        }
    }

    fn settlement(id: &str, status: MessageStatus, cost: u64) -> Settlement {
        Settlement {
            message_id: id.into(),
            served_by: None,
            status,
            cost,
            usage: TokenUsage::default(),
            stop_reason: None,
            latency_ms: 1,
        }
    }

    /// Pools of 4 turns, beaten, with `credits` granted to the account's allotment.
    fn granted(credits: u64) -> Pools {
        let pools = Pools::new(4, Duration::from_secs(60));
        pools.beat(Instant::now());
        let grow = pools
            .take(&turn("first"), true)
            .grow
            .expect("a grant to ask for");
        assert_eq!((grow.want, grow.need), (4 * MAX, 2 * MAX));
        pools.granted(&grow, Some(credits));
        pools
    }

    #[test]
    fn without_a_fresh_heartbeat_every_turn_is_reserved_in_postgres() {
        let pools = Pools::new(4, Duration::from_secs(60));
        let take = pools.take(&turn("a"), true);
        assert!(take.amount.is_none() && take.grow.is_none());

        pools.beat(Instant::now() - Duration::from_secs(61));
        let take = pools.take(&turn("a"), true);
        assert!(take.amount.is_none() && take.grow.is_none());
    }

    #[test]
    fn a_turn_takes_its_most_from_the_allotment_and_gets_back_what_it_did_not_cost() {
        let pools = granted(4 * MAX);
        assert_eq!(pools.take(&turn("a"), false).amount, Some(MAX));
        let (billed, written) = pools
            .settle(&settlement("a", MessageStatus::Completed, 30))
            .expect("an allotted turn");
        assert_eq!(billed, 30);
        assert_eq!((written.record.reserved, written.record.billed), (MAX, 30));
        // 400 granted, 30 billed: 370 free, three turns and some.
        for id in ["b", "c", "d"] {
            assert_eq!(pools.take(&turn(id), false).amount, Some(MAX), "{id}");
        }
        assert!(pools.take(&turn("e"), false).amount.is_none());
    }

    #[test]
    fn a_turn_billed_above_what_it_took_is_billed_what_it_took_and_a_failed_one_nothing() {
        let pools = granted(4 * MAX);
        pools.take(&turn("a"), false);
        pools.take(&turn("b"), false);
        let over = pools.settle(&settlement("a", MessageStatus::Completed, 5 * MAX));
        assert_eq!(over.map(|(billed, _)| billed), Some(MAX));
        let failed = pools.settle(&settlement("b", MessageStatus::Failed, 50));
        assert_eq!(failed.map(|(billed, _)| billed), Some(0));
        assert!(
            pools
                .settle(&settlement("b", MessageStatus::Failed, 50))
                .is_none(),
            "settled twice"
        );
    }

    #[test]
    fn the_allotment_asks_for_more_once_it_falls_below_half_and_only_once_at_a_time() {
        let pools = granted(4 * MAX);
        assert!(pools.take(&turn("a"), false).grow.is_none());
        assert!(pools.take(&turn("b"), false).grow.is_none());
        let grow = pools.take(&turn("c"), false).grow.expect("below half");
        assert_eq!(grow.want, 3 * MAX);
        assert!(
            pools.take(&turn("d"), false).grow.is_none(),
            "a second grant"
        );
        pools.granted(&grow, Some(3 * MAX));
        assert_eq!(pools.take(&turn("e"), false).amount, Some(MAX));
    }

    #[test]
    fn a_refused_grant_retires_the_allotment_it_serves_what_is_left_then_goes() {
        let pools = granted(2 * MAX);
        let take = pools.take(&turn("a"), false);
        assert_eq!(take.amount, Some(MAX));
        pools.granted(&take.grow.expect("below half: a grant to ask for"), Some(0));
        let take = pools.take(&turn("b"), true);
        assert_eq!(take.amount, Some(MAX), "what was left not served");
        assert!(take.grow.is_none(), "a retiring allotment asked for more");
        let take = pools.take(&turn("c"), true);
        assert!(take.amount.is_none() && take.grow.is_none());
        assert!(pools.idle(IDLE).is_empty(), "returned with turns unwritten");

        let (_, b) = pools
            .settle(&settlement("b", MessageStatus::Completed, 10))
            .expect("allotted");
        pools.written(&b);
        let (_, written) = pools
            .settle(&settlement("a", MessageStatus::Completed, 10))
            .expect("allotted");
        assert!(
            pools.idle(IDLE).is_empty(),
            "returned before the row was written"
        );
        assert_eq!(
            pools.unwritten("a").map(|r| r.billed),
            Some(10),
            "a settled turn is found before its row is written"
        );
        pools.written(&written);
        assert!(pools.unwritten("a").is_none());
        let released = pools.idle(IDLE);
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].pool, written.pool);
    }

    #[test]
    fn an_unused_allotment_is_returned_after_the_idle_time_and_all_of_them_at_close() {
        let pools = granted(4 * MAX);
        assert!(pools.idle(IDLE).is_empty(), "returned while fresh");
        assert_eq!(pools.idle(Duration::ZERO).len(), 1);
        assert!(pools.idle(Duration::ZERO).is_empty(), "returned twice");
    }
}
