//! Allotments: credits a gateway process holds for an account, so that the turns of a busy
//! account reserve in memory instead of waiting for a Postgres commit on the request path.
//!
//! An allotment is a row of `allotments` whose credits Postgres has moved into the account's
//! `reserved`, exactly as it does for one turn: no other process can spend them, so however
//! many processes hold allotments the balance is never overdrawn. A turn takes its most from
//! its process' allotment with no round trip; when it ends it is billed at most that, the rest
//! goes back to the allotment, and its ledger row is written before its bill is told,
//! debiting the bill from the allotment and the balance in one statement.
//!
//! The policy, for an account's last credits and for failures:
//! - A refill takes at most a quarter of what the account has available, and none when that
//!   quarter would not cover half an allotment: an account running low is served turn by turn
//!   (each reserved in Postgres), and the allotments it had serve what they hold and are
//!   returned as soon as their turns are written, so they do not keep its last credits from
//!   other processes for long.
//! - An allotment unused for [`IDLE`] is returned; so are all of them when the process stops.
//! - A process uses its allotments only while its heartbeat is fresh (half the reaper's stale
//!   time): one cut off from Postgres stops spending them before the reaper can release them.
//!   After a silence of the stale time, or once its lease was taken, it drops them all.
//! - Allotments belong to a lease (the process and its epoch): the reaper returns those of a
//!   lease it took, and a refill or a write under a lease that is gone bills nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Row;

use super::super::{MessageRecord, NewReservation, Settlement};
use crate::db::{from_db, to_db, Database, DbError};
use crate::ids;

/// An allotment unused this long goes back to its account.
pub const IDLE: Duration = Duration::from_secs(2);

/// An allotment that needs another refill this soon after its last one serves a busy account:
/// it doubles the turns it aims to hold, up to [`MAX_GROWTH`] times the configured count. With
/// a fixed size, an account at 1,000 turns/s emptied a 32-turn allotment every 32 ms, so its
/// turns waited for the refill whenever a refill took longer than the 16 ms left when it was
/// asked for (the reservation's p99 was 21 ms), and the refills' commits were 30 a second.
const REFILL_SOON: Duration = Duration::from_secs(1);
const MAX_GROWTH: u64 = 32;

/// The allotments of this process, and the turns running on them.
pub struct Pools {
    /// A new allotment aims to hold this many turns like the one that asked for it.
    turns: u64,
    /// How long a heartbeat keeps the allotments usable; twice it (the reaper's stale time)
    /// without one, and they may have been returned: they are dropped.
    fresh_for: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Half the stale time after the send of the last heartbeat Postgres recorded.
    fresh_until: Option<Instant>,
    /// When the last heartbeat Postgres recorded was sent.
    last_beat: Option<Instant>,
    /// The lease epoch new allotments are filled under.
    epoch: i64,
    /// Every allotment, by id.
    pools: HashMap<String, Pool>,
    /// The allotment new turns of an account take from, by account.
    current: HashMap<String, String>,
    /// Turns that took from an allotment and are not settled yet, by message id.
    taken: HashMap<String, Taken>,
}

struct Pool {
    account_id: String,
    /// The lease it is filled under.
    epoch: i64,
    /// Credits held and not taken by any turn.
    free: u64,
    /// Turns that took from it whose rows are not written yet.
    open: usize,
    /// How many turns like the one asking it aims to hold (see [`REFILL_SOON`]).
    turns: u64,
    /// When its last refill landed.
    refilled_at: Option<Instant>,
    last_used: Instant,
    growing: bool,
    /// A refill was refused (the account runs low): no more refills; it serves what it has left
    /// and is returned once `open` is 0.
    retiring: bool,
}

struct Taken {
    pool: String,
    amount: u64,
    record: MessageRecord,
}

/// A refill to ask Postgres for.
pub struct Grow {
    pub pool: String,
    pub account_id: String,
    /// The lease epoch the allotment belongs to: a refill under any other is refused.
    pub epoch: i64,
    pub want: u64,
    pub need: u64,
}

/// What [`Pools::take`] decided for a turn.
pub struct Take {
    /// Credits taken from the allotment; `None`: reserve this turn in Postgres.
    pub amount: Option<u64>,
    /// A refill to ask for: before retrying the turn when nothing was taken, else meanwhile.
    pub grow: Option<Grow>,
}

/// A settled turn's row, to write; the pool it drew from answers for its bill.
#[derive(Clone)]
pub struct Written {
    pub pool: String,
    /// Shared with the void that may follow the write.
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

    /// This process' heartbeat, sent at `sent`, was recorded under lease `epoch`. After a new
    /// lease, or a silence of the stale time (another process may have returned the
    /// allotments meanwhile), every allotment is dropped: their turns finish, no new turn
    /// takes from them, and new ones are filled.
    pub fn beat(&self, sent: Instant, epoch: i64) {
        let mut state = self.state();
        let lapsed = state
            .last_beat
            .is_some_and(|last| sent.saturating_duration_since(last) >= self.fresh_for * 2);
        if lapsed || state.epoch != epoch {
            state.current.clear();
        }
        state.epoch = epoch;
        state.last_beat = Some(sent);
        state.fresh_until = Some(sent + self.fresh_for);
    }

    /// Stops new turns from taking from the allotment (it was refused, or its state is in
    /// doubt); it is returned once its turns are written.
    pub fn forsake(&self, pool: &str) {
        let mut state = self.state();
        state.current.retain(|_, id| id != pool);
    }

    /// Takes the turn's most from its account's allotment. `may_grow`: whether to ask for a
    /// refill when the allotment cannot cover it (once per turn).
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
        let id = state
            .current
            .entry(account_id.clone())
            .or_insert_with(ids::allotment)
            .clone();
        let epoch = state.epoch;
        let pool = state.pools.entry(id.clone()).or_insert_with(|| Pool {
            account_id: account_id.clone(),
            epoch,
            free: 0,
            open: 0,
            turns: self.turns,
            refilled_at: None,
            last_used: now,
            growing: false,
            retiring: false,
        });
        let want = r.max.saturating_mul(pool.turns);
        // What an account must have to spare is judged at the configured size, however much a
        // busy allotment has grown: an account with enough for ordinary allotments gets what
        // it can spare (a quarter of what is available) instead of being served turn by turn.
        let ordinary = r.max.saturating_mul(self.turns);
        let grow = |pool: &mut Pool| {
            if pool.retiring {
                return None;
            }
            pool.growing = true;
            Some(Grow {
                pool: id.clone(),
                account_id: account_id.clone(),
                epoch: pool.epoch,
                want: want.saturating_sub(pool.free),
                need: (ordinary.saturating_sub(pool.free) / 2).max(r.max),
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
                pool: id.clone(),
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

    /// Postgres added `credits` to the allotment (0: refused, the account runs low or the
    /// lease is gone; `None`: the refill failed, nothing known).
    pub fn refilled(&self, g: &Grow, credits: Option<u64>) {
        let mut state = self.state();
        let Some(p) = state.pools.get_mut(&g.pool) else {
            return;
        };
        p.growing = false;
        match credits {
            Some(0) => p.retiring = true,
            Some(credits) => {
                let now = Instant::now();
                if p.refilled_at
                    .is_some_and(|at| now.duration_since(at) < REFILL_SOON)
                {
                    p.turns = (p.turns * 2).min(self.turns * MAX_GROWTH);
                }
                p.refilled_at = Some(now);
                p.free += credits;
            }
            None => {}
        }
    }

    /// Settles a turn that took from an allotment: its row to write, billed at most what it
    /// took (nothing when it failed), or `None` for a turn reserved in Postgres. What it did
    /// not cost goes back to the allotment.
    pub fn settle(&self, s: &Settlement) -> Option<Written> {
        let mut guard = self.state();
        let state = &mut *guard;
        let taken = state.taken.remove(&s.message_id)?;
        let billed = s.billed(taken.amount);
        if let Some(pool) = state.pools.get_mut(&taken.pool) {
            pool.free += taken.amount - billed;
        }
        let mut record = taken.record;
        record.reserved = taken.amount;
        s.complete(&mut record, billed);
        Some(Written {
            pool: taken.pool,
            record: Arc::new(record),
        })
    }

    /// A turn's row is written (or voided): its allotment may be returned once idle.
    pub fn written(&self, w: &Written) {
        let mut state = self.state();
        if let Some(p) = state.pools.get_mut(&w.pool) {
            p.open = p.open.saturating_sub(1);
            p.last_used = Instant::now();
        }
    }

    /// The allotments to return now: those with no turn in flight that were unused for `idle`
    /// (all of them with `Duration::ZERO`, or when the heartbeat is no longer fresh), that
    /// retire or that were dropped. Their accounts' next turns start new ones.
    pub fn idle(&self, idle: Duration) -> Vec<Release> {
        let now = Instant::now();
        let mut guard = self.state();
        let state = &mut *guard;
        let stale = state.fresh_until.is_none_or(|until| until < now);
        let current = &state.current;
        let done: Vec<String> = state
            .pools
            .iter()
            .filter(|(id, p)| {
                let dropped = current.get(&p.account_id) != Some(*id);
                p.open == 0
                    && !p.growing
                    && (stale || dropped || p.retiring || now.duration_since(p.last_used) >= idle)
            })
            .map(|(id, _)| id.clone())
            .collect();
        done.into_iter()
            .filter_map(|id| {
                let p = state.pools.remove(&id)?;
                if state.current.get(&p.account_id) == Some(&id) {
                    state.current.remove(&p.account_id);
                }
                Some(Release {
                    pool: id,
                    account_id: p.account_id,
                })
            })
            .collect()
    }
}

/// Asks for up to `want` credits for the allotment, taking at most a quarter of what the
/// account has available and nothing unless that covers `need` (half of `want`: an account
/// with less than twice an allotment's worth available is served turn by turn, exactly).
/// Nothing either unless the allotment's lease is this process' current one: the lease row is
/// locked (the reaper deletes it) while credits move, so a refill cannot land on, or
/// re-create, an allotment the reaper has returned. Returns the credits refilled.
pub async fn grow(db: &Database, instance: &str, g: &Grow) -> Result<u64, DbError> {
    let row = db
        .bounded(
            sqlx::query(
                "WITH lease AS (
                     SELECT id FROM gateway_instances WHERE id = $2 AND epoch = $6
                     FOR KEY SHARE
                 ), account AS (
                     SELECT id, (balance - reserved) / 4 AS share FROM accounts
                     WHERE id = $3 AND EXISTS (SELECT 1 FROM lease) FOR NO KEY UPDATE
                 ), refilled AS (
                     SELECT id, least($4, share) AS credits FROM account WHERE share >= $5
                 ), held AS (
                     UPDATE accounts a SET reserved = a.reserved + g.credits
                     FROM refilled g WHERE a.id = g.id
                 ), pool AS (
                     INSERT INTO allotments (id, instance_id, account_id, credits, epoch)
                     SELECT $1, $2, id, credits, $6 FROM refilled
                     ON CONFLICT (id) DO UPDATE SET credits = allotments.credits + EXCLUDED.credits
                 )
                 SELECT coalesce((SELECT credits FROM refilled), 0)::bigint AS credits",
            )
            .bind(&g.pool)
            .bind(instance)
            .bind(&g.account_id)
            .bind(to_db(g.want))
            .bind(to_db(g.need))
            .bind(g.epoch)
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

/// Returns the allotments whose lease is gone (the reaper deleted it, or its process
/// stopped without returning them). Returns how many.
pub async fn reap(db: &Database) -> Result<u64, DbError> {
    let row = db
        .bounded(
            sqlx::query(
                "WITH dead AS (
                     SELECT al.id, al.account_id FROM allotments al
                     WHERE NOT EXISTS (
                         SELECT 1 FROM gateway_instances g
                         WHERE g.id = al.instance_id AND g.epoch = al.epoch)
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
            .fetch_one(db.pool()),
        )
        .await?;
    Ok(from_db(row.try_get("reaped").map_err(DbError::Sql)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::turn_record;
    use crate::ledger::MessageStatus;
    use crate::usage::TokenUsage;

    const MAX: u64 = 100;

    fn turn(id: &str) -> NewReservation {
        NewReservation {
            spend_cap: None,
            record: turn_record(id, "acct", "key"),
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

    /// Pools of 4 turns, beaten, with `credits` put in the account's allotment.
    fn refilled(credits: u64) -> Pools {
        let pools = Pools::new(4, Duration::from_secs(60));
        pools.beat(Instant::now(), 1);
        let grow = pools
            .take(&turn("first"), true)
            .grow
            .expect("a refill to ask for");
        assert_eq!((grow.want, grow.need), (4 * MAX, 2 * MAX));
        pools.refilled(&grow, Some(credits));
        pools
    }

    #[test]
    fn without_a_fresh_heartbeat_every_turn_is_reserved_in_postgres() {
        let pools = Pools::new(4, Duration::from_secs(60));
        let take = pools.take(&turn("a"), true);
        assert!(take.amount.is_none() && take.grow.is_none());

        pools.beat(Instant::now() - Duration::from_secs(61), 1);
        let take = pools.take(&turn("a"), true);
        assert!(take.amount.is_none() && take.grow.is_none());
    }

    #[test]
    fn a_turn_takes_its_most_from_the_allotment_and_gets_back_what_it_did_not_cost() {
        let pools = refilled(4 * MAX);
        assert_eq!(pools.take(&turn("a"), false).amount, Some(MAX));
        let written = pools
            .settle(&settlement("a", MessageStatus::Completed, 30))
            .expect("an allotted turn");
        assert_eq!((written.record.reserved, written.record.billed), (MAX, 30));
        // 400 refilled, 30 billed: 370 free, three turns and some.
        for id in ["b", "c", "d"] {
            assert_eq!(pools.take(&turn(id), false).amount, Some(MAX), "{id}");
        }
        assert!(pools.take(&turn("e"), false).amount.is_none());
    }

    #[test]
    fn a_turn_billed_above_what_it_took_is_billed_what_it_took_and_a_failed_one_nothing() {
        let pools = refilled(4 * MAX);
        pools.take(&turn("a"), false);
        pools.take(&turn("b"), false);
        let over = pools.settle(&settlement("a", MessageStatus::Completed, 5 * MAX));
        assert_eq!(over.map(|w| w.record.billed), Some(MAX));
        let failed = pools.settle(&settlement("b", MessageStatus::Failed, 50));
        assert_eq!(failed.map(|w| w.record.billed), Some(0));
        assert!(
            pools
                .settle(&settlement("b", MessageStatus::Failed, 50))
                .is_none(),
            "settled twice"
        );
    }

    #[test]
    fn the_allotment_asks_for_more_once_it_falls_below_half_and_only_once_at_a_time() {
        let pools = refilled(4 * MAX);
        assert!(pools.take(&turn("a"), false).grow.is_none());
        assert!(pools.take(&turn("b"), false).grow.is_none());
        let grow = pools.take(&turn("c"), false).grow.expect("below half");
        assert_eq!(grow.want, 3 * MAX);
        assert!(
            pools.take(&turn("d"), false).grow.is_none(),
            "a second refill"
        );
        pools.refilled(&grow, Some(3 * MAX));
        assert_eq!(pools.take(&turn("e"), false).amount, Some(MAX));
    }

    #[test]
    fn an_allotment_refilled_within_a_second_doubles_what_it_aims_to_hold_up_to_32_times() {
        let pools = refilled(4 * MAX);
        let mut wants = Vec::new();
        for round in 0..8 {
            // Take until the allotment asks for more, then refill what it asked for at once.
            let grow = (0..)
                .find_map(|i| pools.take(&turn(&format!("{round}-{i}")), false).grow)
                .expect("a refill to ask for");
            wants.push(grow.want / MAX);
            pools.refilled(&grow, Some(grow.want));
        }
        // Asked one turn below half of what it aims to hold: the aim less what is left. The
        // aim doubles from the second refill on (4, 8, 16, ... turns) and stops at 32 times 4.
        assert_eq!(
            wants,
            [
                4 - 1,
                8 - 3,
                16 - 7,
                32 - 15,
                64 - 31,
                128 - 63,
                128 - 63,
                128 - 63
            ]
        );
        // What it needs at least stays that of an ordinary allotment (half of 4 turns less
        // what it holds, at least one turn), so an account that can spare that is not made
        // to go turn by turn because its allotment grew.
        let grow = (0..)
            .find_map(|i| pools.take(&turn(&format!("last-{i}")), false).grow)
            .expect("a refill to ask for");
        assert_eq!(grow.need, MAX);
    }

    #[test]
    fn a_refused_refill_retires_the_allotment_it_serves_what_is_left_then_goes() {
        let pools = refilled(2 * MAX);
        let take = pools.take(&turn("a"), false);
        assert_eq!(take.amount, Some(MAX));
        pools.refilled(
            &take.grow.expect("below half: a refill to ask for"),
            Some(0),
        );
        let take = pools.take(&turn("b"), true);
        assert_eq!(take.amount, Some(MAX), "what was left not served");
        assert!(take.grow.is_none(), "a retiring allotment asked for more");
        let take = pools.take(&turn("c"), true);
        assert!(take.amount.is_none() && take.grow.is_none());
        assert!(pools.idle(IDLE).is_empty(), "returned with turns unwritten");

        let b = pools
            .settle(&settlement("b", MessageStatus::Completed, 10))
            .expect("allotted");
        pools.written(&b);
        let written = pools
            .settle(&settlement("a", MessageStatus::Completed, 10))
            .expect("allotted");
        assert!(
            pools.idle(IDLE).is_empty(),
            "returned before the row was written"
        );
        pools.written(&written);
        let released = pools.idle(IDLE);
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].pool, written.pool);
    }

    #[test]
    fn an_unused_allotment_is_returned_after_the_idle_time_and_all_of_them_at_close() {
        let pools = refilled(4 * MAX);
        assert!(pools.idle(IDLE).is_empty(), "returned while fresh");
        assert_eq!(pools.idle(Duration::ZERO).len(), 1);
        assert!(pools.idle(Duration::ZERO).is_empty(), "returned twice");
    }

    #[test]
    fn after_a_silence_of_the_stale_time_or_a_new_lease_no_turn_takes_from_the_old_allotments() {
        let pools = refilled(4 * MAX);
        let old = pools.take(&turn("a"), false);
        assert_eq!(old.amount, Some(MAX));
        // Beaten again two stale times later: the allotment may have been returned meanwhile.
        pools.beat(Instant::now() + Duration::from_secs(121), 1);
        let take = pools.take(&turn("b"), true);
        assert!(take.amount.is_none(), "took from a dropped allotment");
        let grow = take.grow.expect("a refill for a new allotment");
        let a = pools
            .settle(&settlement("a", MessageStatus::Completed, 10))
            .expect("the turn on the dropped allotment still settles");
        assert_ne!(grow.pool, a.pool, "a refill for the dropped allotment");
        assert!(
            pools.idle(IDLE).is_empty(),
            "returned with its turn unwritten"
        );
        pools.written(&a);
        let released = pools.idle(IDLE);
        assert_eq!(released.len(), 1, "the dropped allotment was not returned");
        assert_eq!(released[0].pool, a.pool);

        pools.refilled(&grow, Some(4 * MAX));
        assert_eq!(pools.take(&turn("c"), false).amount, Some(MAX));
        pools.beat(Instant::now(), 2);
        let take = pools.take(&turn("d"), true);
        assert!(
            take.amount.is_none(),
            "took from an allotment of the old lease"
        );
        assert_eq!(take.grow.map(|g| g.epoch), Some(2));
    }
}
