//! The in-process ledger of standalone mode. Each account's balance sits in its own map
//! entry, so reserve and settle are atomic per account with no global lock. Settled message
//! rows are kept for lookups up to a bound (oldest dropped first); usage rollups are kept.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use crossbeam_queue::ArrayQueue;
use dashmap::DashMap;
use time::{Date, OffsetDateTime};

use super::reversal::{
    dispute_step, give, kept_cents, moved_lifetime, share, take, DisputeStatus, Movement,
};
use crate::audit::{Actor, MemoryAuditLog};

use super::{
    audited, month_of, Balance, Confirmation, DisputeStage, EndUserUsageRow, KeySpend, Ledger,
    LedgerError, MessageRecord, MessageStatus, NewReservation, NewTopUp, Reversal, ReversalKind,
    Settlement, TopUp, UsageRow, UsageTotals,
};

/// Settled rows kept for lookups (the dashboard's recent messages, a message by id). A row is
/// about 1 KiB resident (eight names and the id, each its own allocation), so this bounds
/// the rows to about 10 MiB: a standalone pod stays under 64 MiB resident however many turns
/// it serves (docs/benchmarks.md, "Standalone memory after a million turns"). Usage totals are
/// kept whole, apart from the rows.
const KEPT_MESSAGES: usize = 10_000;

pub struct MemoryLedger {
    balances: DashMap<String, Balance>,
    messages: DashMap<String, MessageRecord>,
    settled_order: ArrayQueue<String>,
    top_ups: DashMap<String, TopUp>,
    /// Top-up reference by the provider's payment id.
    payments: DashMap<String, String>,
    /// Refunded total by top-up reference.
    refunded: DashMap<String, u64>,
    /// `None` only while a dispute's first stage is being applied.
    disputes: DashMap<String, Option<DisputeStatus>>,
    reversals: DashMap<String, Reversal>,
    /// The usage rollups of the served turns, as Postgres keeps them (per account, hour, key
    /// and model; see `usage_rollups`), updated at settle under the account's balance entry.
    /// Failed turns are not counted: nothing reads an error count in process.
    usage: DashMap<RollupKey, UsageTotals>,
    /// Per key: the month its spend counts, and that spend. Locked after its account's
    /// balance entry, as the Postgres statements lock the rows.
    keys: DashMap<String, (Date, KeySpend)>,
    /// The references under which credits were added once.
    credit_references: DashMap<String, ()>,
    /// Where this ledger's changes, and the in-process stores' built on it, are audited.
    audit: Arc<MemoryAuditLog>,
}

/// A usage rollup's account, UTC hour of its turns' creation, key and model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RollupKey {
    account_id: String,
    hour: OffsetDateTime,
    key_id: String,
    model: String,
    /// Kept apart per end user, so that usage can be told by end user as Postgres tells it
    /// from the rows.
    end_user: Option<String>,
}

impl RollupKey {
    fn of(record: &MessageRecord) -> Self {
        let created = record.created_at.to_offset(time::UtcOffset::UTC);
        Self {
            account_id: record.account_id.clone(),
            hour: created.replace_time(time::Time::MIDNIGHT)
                + time::Duration::hours(created.hour().into()),
            key_id: record.key_id.clone(),
            model: record.model.clone(),
            end_user: record.end_user.clone(),
        }
    }
}

impl Default for MemoryLedger {
    fn default() -> Self {
        Self {
            balances: DashMap::new(),
            messages: DashMap::new(),
            settled_order: ArrayQueue::new(KEPT_MESSAGES),
            top_ups: DashMap::new(),
            payments: DashMap::new(),
            refunded: DashMap::new(),
            disputes: DashMap::new(),
            reversals: DashMap::new(),
            usage: DashMap::new(),
            keys: DashMap::new(),
            credit_references: DashMap::new(),
            audit: Arc::default(),
        }
    }
}

impl MemoryLedger {
    /// The audit log of this ledger and of the in-process stores built on it.
    pub fn audit_log(&self) -> &Arc<MemoryAuditLog> {
        &self.audit
    }

    pub fn lifetime_top_up_cents(&self, account_id: &str) -> u64 {
        self.balances
            .get(account_id)
            .map_or(0, |b| b.lifetime_top_up_cents)
    }

    fn top_up_of_payment(&self, payment_id: &str) -> Result<TopUp, LedgerError> {
        self.payments
            .get(payment_id)
            .and_then(|reference| self.top_ups.get(reference.as_str()).map(|t| t.clone()))
            .ok_or_else(|| LedgerError::UnknownPayment(payment_id.to_owned()))
    }

    /// Moves `usd_cents` of `top_up` off the account (or back onto it), once under `id`.
    /// Callers hold the lock of the payment's refund or dispute entry.
    fn reverse(
        &self,
        id: String,
        top_up: &TopUp,
        kind: ReversalKind,
        usd_cents: u64,
    ) -> Result<Reversal, LedgerError> {
        let credits = share(top_up.credits, usd_cents, top_up.usd_cents);
        let earlier: Vec<(ReversalKind, u64)> = self
            .reversals
            .iter()
            .filter(|r| r.reference == top_up.reference)
            .map(|r| (r.kind, r.usd_cents))
            .collect();
        let kept_before = kept_cents(top_up.usd_cents, earlier.iter().copied());
        let kept_after = kept_cents(
            top_up.usd_cents,
            earlier.into_iter().chain([(kind, usd_cents)]),
        );
        let mut balance = self
            .balances
            .get_mut(&top_up.account_id)
            .ok_or(LedgerError::UnknownAccount)?;
        let (moved, owed) = match kind {
            ReversalKind::DisputeWon => {
                let (cleared, given) = give(balance.owed, credits);
                balance.owed -= cleared;
                balance.balance += given;
                (given, cleared)
            }
            ReversalKind::Refund | ReversalKind::Dispute => {
                let (taken, owed) = take(balance.balance.saturating_sub(balance.reserved), credits);
                balance.balance -= taken;
                balance.owed += owed;
                (taken, owed)
            }
        };
        balance.lifetime_top_up_cents =
            moved_lifetime(balance.lifetime_top_up_cents, kept_before, kept_after);
        drop(balance);
        let reversal = Reversal {
            id: id.clone(),
            account_id: top_up.account_id.clone(),
            reference: top_up.reference.clone(),
            kind,
            usd_cents,
            credits: moved,
            owed,
            created_at: OffsetDateTime::now_utc(),
        };
        self.reversals.insert(id, reversal.clone());
        Ok(reversal)
    }

    /// The key's spend this month (an older month's spend counts as nothing).
    fn key_entry(
        &self,
        key_id: &str,
    ) -> dashmap::mapref::one::RefMut<'_, String, (Date, KeySpend)> {
        let month = month_of(OffsetDateTime::now_utc());
        let mut entry = self
            .keys
            .entry(key_id.to_owned())
            .or_insert((month, KeySpend::default()));
        if entry.0 != month {
            *entry = (
                month,
                KeySpend {
                    spent: 0,
                    reserved: entry.1.reserved,
                },
            );
        }
        entry
    }

    fn remember_settled(&self, id: String) {
        if let Some(oldest) = self.settled_order.force_push(id) {
            self.messages.remove(&oldest);
        }
    }
}

#[async_trait]
impl Ledger for MemoryLedger {
    async fn add_credits(
        &self,
        account_id: &str,
        credits: u64,
        by: &Actor,
    ) -> Result<Balance, LedgerError> {
        let mut balance = self.balances.entry(account_id.to_owned()).or_default();
        balance.balance += credits;
        if credits > 0 {
            self.audit
                .append(audited::credits_added(account_id, credits, None, by));
        }
        Ok(*balance)
    }

    async fn add_credits_once(
        &self,
        account_id: &str,
        credits: u64,
        reference: &str,
        by: &Actor,
    ) -> Result<bool, LedgerError> {
        // The reference's entry stays locked while the balance is credited, so a concurrent
        // call waits and then finds it taken.
        match self.credit_references.entry(reference.to_owned()) {
            dashmap::Entry::Occupied(_) => Ok(false),
            dashmap::Entry::Vacant(vacant) => {
                self.balances
                    .entry(account_id.to_owned())
                    .or_default()
                    .balance += credits;
                if credits > 0 {
                    let entry = audited::credits_added(account_id, credits, Some(reference), by);
                    self.audit.append(entry);
                }
                vacant.insert(());
                Ok(true)
            }
        }
    }

    async fn balance(&self, account_id: &str) -> Result<Balance, LedgerError> {
        Ok(self
            .balances
            .get(account_id)
            .map(|b| *b)
            .unwrap_or_default())
    }

    async fn top_up(&self, t: NewTopUp<'_>) -> Result<Confirmation, LedgerError> {
        let entry = self.top_ups.entry(t.reference.to_owned());
        let top_up = match entry {
            dashmap::Entry::Occupied(existing) => {
                let existing = existing.get().clone();
                if existing.account_id != t.account_id {
                    return Err(LedgerError::ReferenceConflict);
                }
                if existing.usd_cents != t.usd_cents {
                    return Err(LedgerError::TopUpMismatch);
                }
                return Ok(Confirmation {
                    top_up: existing,
                    first: false,
                });
            }
            dashmap::Entry::Vacant(slot) => slot
                .insert(TopUp {
                    reference: t.reference.to_owned(),
                    account_id: t.account_id.to_owned(),
                    usd_cents: t.usd_cents,
                    credits: t.credits,
                    status: "confirmed",
                    confirmed_at: OffsetDateTime::now_utc(),
                })
                .clone(),
        };
        if let Some(payment_id) = t.payment_id {
            self.payments
                .insert(payment_id.to_owned(), t.reference.to_owned());
        }
        let mut balance = self.balances.entry(t.account_id.to_owned()).or_default();
        let (cleared, credited) = give(balance.owed, t.credits);
        balance.owed -= cleared;
        balance.balance += credited;
        balance.lifetime_top_up_cents += t.usd_cents;
        self.audit
            .append(audited::top_up(&top_up, t.payment_id, t.by));
        Ok(Confirmation {
            top_up,
            first: true,
        })
    }

    async fn refund(
        &self,
        payment_id: &str,
        refunded_cents: u64,
        by: &Actor,
    ) -> Result<Option<Reversal>, LedgerError> {
        let top_up = self.top_up_of_payment(payment_id)?;
        let mut refunded = self.refunded.entry(top_up.reference.clone()).or_default();
        let total = refunded_cents.min(top_up.usd_cents);
        if total <= *refunded {
            return Ok(None);
        }
        let id = format!("{payment_id}:refunded:{total}");
        let reversal = self.reverse(id, &top_up, ReversalKind::Refund, total - *refunded)?;
        self.audit
            .append(audited::refund(&reversal, payment_id, *refunded, by));
        *refunded = total;
        Ok(Some(reversal))
    }

    async fn dispute(
        &self,
        dispute_id: &str,
        payment_id: &str,
        usd_cents: u64,
        stage: DisputeStage,
        by: &Actor,
    ) -> Result<Option<Reversal>, LedgerError> {
        let top_up = self.top_up_of_payment(payment_id)?;
        let mut known = self.disputes.entry(dispute_id.to_owned()).or_default();
        let Some((status, movement)) = dispute_step(*known, stage) else {
            return Ok(None);
        };
        let reversal = match movement {
            None => None,
            Some(movement) => {
                let (kind, suffix) = match movement {
                    Movement::TakeBack => (ReversalKind::Dispute, "taken"),
                    Movement::GiveBack => (ReversalKind::DisputeWon, "returned"),
                };
                let id = format!("{dispute_id}:{suffix}");
                let cents = usd_cents.min(top_up.usd_cents);
                Some(self.reverse(id, &top_up, kind, cents)?)
            }
        };
        self.audit.append(audited::dispute(
            dispute_id,
            &top_up.account_id,
            *known,
            status,
            reversal.as_ref(),
            by,
        ));
        *known = Some(status);
        Ok(reversal)
    }

    async fn reversals(&self, account_id: &str) -> Result<Vec<Reversal>, LedgerError> {
        let mut reversals: Vec<Reversal> = self
            .reversals
            .iter()
            .filter(|r| r.account_id == account_id)
            .map(|r| r.clone())
            .collect();
        reversals.sort_by_key(|x| std::cmp::Reverse(x.created_at));
        Ok(reversals)
    }

    async fn reserve(&self, r: NewReservation) -> Result<u64, LedgerError> {
        let mut balance = self.balances.get_mut(&r.record.account_id).ok_or(
            LedgerError::InsufficientCredits {
                needed: r.max,
                available: 0,
            },
        )?;
        let available = balance.balance.saturating_sub(balance.reserved);
        if available < r.min {
            return Err(LedgerError::InsufficientCredits {
                needed: r.max,
                available,
            });
        }
        let mut key = self.key_entry(&r.record.key_id);
        let mut left = available;
        if let Some(cap) = r.spend_cap {
            let used = key.1.spent + key.1.reserved;
            let key_left = cap.saturating_sub(used);
            if key_left < r.min {
                return Err(LedgerError::SpendCapReached {
                    cap,
                    used,
                    needed: r.max,
                });
            }
            left = left.min(key_left);
        }
        let amount = r.max.min(left);
        balance.reserved += amount;
        key.1.reserved += amount;
        drop(key);
        drop(balance);
        let mut record = r.record;
        record.reserved = amount;
        record.status = MessageStatus::Reserved;
        self.messages.insert(record.id.clone(), record);
        Ok(amount)
    }

    async fn settle(&self, s: Settlement) -> Result<u64, LedgerError> {
        let mut record = self
            .messages
            .get_mut(&s.message_id)
            .ok_or(LedgerError::UnknownMessage)?;
        if record.status != MessageStatus::Reserved {
            return Ok(record.billed);
        }
        let billed = s.billed(record.reserved);
        {
            let mut balance = self
                .balances
                .get_mut(&record.account_id)
                .ok_or(LedgerError::UnknownAccount)?;
            balance.reserved = balance.reserved.saturating_sub(record.reserved);
            balance.balance = balance.balance.saturating_sub(billed);
            let mut key = self.key_entry(&record.key_id);
            key.1.reserved = key.1.reserved.saturating_sub(record.reserved);
            key.1.spent += billed;
            drop(key);
            // Under the account's entry, as Postgres locks a rollup row after its account.
            if s.status != MessageStatus::Failed {
                self.usage
                    .entry(RollupKey::of(&record))
                    .or_default()
                    .add(&UsageTotals::of_turn(
                        &s.usage,
                        billed,
                        record.batch_id.is_some(),
                    ));
            }
        }
        s.complete(&mut record, billed);
        drop(record);
        self.remember_settled(s.message_id);
        Ok(billed)
    }

    async fn message(&self, id: &str) -> Result<Option<MessageRecord>, LedgerError> {
        Ok(self.messages.get(id).map(|m| m.clone()))
    }

    async fn usage(
        &self,
        account_id: &str,
        from: Date,
        to: Date,
    ) -> Result<Vec<UsageRow>, LedgerError> {
        let mut by_day: BTreeMap<(Date, String), UsageTotals> = BTreeMap::new();
        for e in self.usage.iter() {
            let (key, rollup) = (e.key(), e.value());
            let day = key.hour.date();
            let counted = key.account_id == account_id && (from..=to).contains(&day);
            if counted {
                by_day
                    .entry((day, key.model.clone()))
                    .or_default()
                    .add(rollup);
            }
        }
        Ok(by_day
            .into_iter()
            .map(|((date, model), totals)| UsageRow {
                date,
                model,
                totals,
            })
            .collect())
    }

    async fn end_user_usage(
        &self,
        account_id: &str,
        from: Date,
        to: Date,
        end_user: Option<&str>,
    ) -> Result<Vec<EndUserUsageRow>, LedgerError> {
        type Group = (Date, String, Option<String>);
        let mut groups: BTreeMap<Group, UsageTotals> = BTreeMap::new();
        for e in self.usage.iter() {
            let (key, rollup) = (e.key(), e.value());
            let day = key.hour.date();
            let counted = key.account_id == account_id
                && (from..=to).contains(&day)
                && end_user.is_none_or(|u| key.end_user.as_deref() == Some(u));
            if counted {
                groups
                    .entry((day, key.model.clone(), key.end_user.clone()))
                    .or_default()
                    .add(rollup);
            }
        }
        Ok(groups
            .into_iter()
            .map(|((date, model, end_user), totals)| EndUserUsageRow {
                end_user,
                usage: UsageRow {
                    date,
                    model,
                    totals,
                },
            })
            .collect())
    }

    async fn recent_messages(
        &self,
        account_id: &str,
        limit: usize,
    ) -> Result<Vec<MessageRecord>, LedgerError> {
        let mut messages: Vec<MessageRecord> = self
            .messages
            .iter()
            .filter(|m| m.account_id == account_id)
            .map(|m| m.clone())
            .collect();
        messages.sort_by_key(|x| std::cmp::Reverse(x.created_at));
        messages.truncate(limit);
        Ok(messages)
    }

    async fn key_spend(&self, key_id: &str) -> Result<KeySpend, LedgerError> {
        Ok(self.key_entry(key_id).1)
    }

    async fn top_ups(&self, account_id: &str) -> Result<Vec<TopUp>, LedgerError> {
        let mut top_ups: Vec<TopUp> = self
            .top_ups
            .iter()
            .filter(|t| t.account_id == account_id)
            .map(|t| t.clone())
            .collect();
        top_ups.sort_by_key(|x| std::cmp::Reverse(x.confirmed_at));
        Ok(top_ups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Actor, ActorKind};
    use crate::ledger::fixtures::turn_record;
    use crate::usage::TokenUsage;

    #[tokio::test]
    async fn settled_rows_are_kept_up_to_the_bound_oldest_dropped_first() {
        let ledger = MemoryLedger::default();
        ledger
            .add_credits("acct", 1_000_000, &Actor::new(ActorKind::Cli, "test", None))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let turns = KEPT_MESSAGES + 1;
        for n in 0..turns {
            let id = format!("msg_{n}");
            ledger
                .reserve(NewReservation {
                    record: turn_record(&id, "acct", "key"),
                    spend_cap: None,
                    min: 1,
                    max: 1,
                })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            ledger
                .settle(Settlement {
                    message_id: id,
                    served_by: None,
                    status: MessageStatus::Completed,
                    cost: 1,
                    usage: TokenUsage::default(),
                    stop_reason: None,
                    latency_ms: 1,
                })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let kept = |id: &str| ledger.messages.contains_key(id);
        assert!(!kept("msg_0"), "the oldest row is dropped");
        assert!(kept("msg_1") && kept(&format!("msg_{KEPT_MESSAGES}")));
        assert_eq!(ledger.messages.len(), KEPT_MESSAGES);
        let balance = ledger
            .balance("acct")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            balance.balance,
            1_000_000 - turns as u64,
            "every turn billed"
        );
    }
}
