//! Auto-reload rules in process (standalone), next to the in-process ledger whose balances
//! they watch. The check and the disarming of one account happen under its map entry's lock.

use std::sync::Arc;

use async_trait::async_trait;
use dashmap::DashMap;

use super::{AutoReload, AutoReloads, Due, Outcome, MAX_DECLINES};
use store::accounts::StoreError;
use store::audit::{Actor, MemoryAuditLog};
use store::ledger::Ledger;

#[derive(Default)]
struct Rule {
    shown: AutoReload,
    card: Option<(String, String)>,
    armed: bool,
    attempt: u64,
}

pub struct MemoryAutoReloads {
    ledger: Arc<dyn Ledger>,
    rules: DashMap<String, Rule>,
    /// The in-process ledger's log, where rule changes are audited.
    audit: Arc<MemoryAuditLog>,
}

impl MemoryAutoReloads {
    pub fn new(ledger: Arc<dyn Ledger>, audit: Arc<MemoryAuditLog>) -> Self {
        Self {
            ledger,
            rules: DashMap::new(),
            audit,
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

#[async_trait]
impl AutoReloads for MemoryAutoReloads {
    async fn save_card(
        &self,
        account_id: &str,
        customer_id: &str,
        payment_method_id: &str,
    ) -> Result<(), StoreError> {
        let mut rule = self
            .rules
            .entry(account_id.to_owned())
            .or_insert_with(|| Rule {
                armed: true,
                ..Rule::default()
            });
        rule.card = Some((customer_id.to_owned(), payment_method_id.to_owned()));
        rule.shown.card_saved = true;
        Ok(())
    }

    async fn settings(&self, account_id: &str) -> Result<AutoReload, StoreError> {
        Ok(self
            .rules
            .get(account_id)
            .map(|r| r.shown.clone())
            .unwrap_or_default())
    }

    async fn configure(
        &self,
        account_id: &str,
        set: super::Rule,
        by: &Actor,
    ) -> Result<bool, StoreError> {
        let Some(mut rule) = self.rules.get_mut(account_id) else {
            return Ok(false);
        };
        if rule.card.is_none() {
            return Ok(false);
        }
        let before = super::Rule {
            enabled: rule.shown.enabled,
            threshold_credits: rule.shown.threshold_credits,
            usd_cents: rule.shown.usd_cents,
        };
        if set.enabled && !rule.shown.enabled {
            rule.shown.declines = 0;
            rule.shown.last_failure = None;
        }
        rule.shown.enabled = set.enabled;
        rule.shown.threshold_credits = set.threshold_credits;
        rule.shown.usd_cents = set.usd_cents;
        rule.armed = true;
        if let Some(entry) = super::audited(account_id, before, set, by) {
            self.audit.append(entry);
        }
        Ok(true)
    }

    async fn due(&self) -> Result<Vec<Due>, StoreError> {
        let watched: Vec<String> = self
            .rules
            .iter()
            .filter(|r| r.shown.enabled)
            .map(|r| r.key().clone())
            .collect();
        let mut due = Vec::new();
        for account_id in watched {
            let balance = self
                .ledger
                .balance(&account_id)
                .await
                .map_err(unavailable)?;
            let available = balance.balance.saturating_sub(balance.reserved);
            let Some(mut rule) = self.rules.get_mut(&account_id) else {
                continue;
            };
            if available >= rule.shown.threshold_credits {
                rule.armed = true;
                continue;
            }
            let Some((customer_id, payment_method_id)) = rule.card.clone() else {
                continue;
            };
            if !(rule.armed && rule.shown.enabled) {
                continue;
            }
            rule.armed = false;
            rule.attempt += 1;
            due.push(Due {
                account_id,
                attempt: rule.attempt,
                usd_cents: rule.shown.usd_cents,
                customer_id,
                payment_method_id,
            });
        }
        Ok(due)
    }

    async fn finish(&self, due: &Due, outcome: &Outcome) -> Result<(), StoreError> {
        let Some(mut rule) = self.rules.get_mut(&due.account_id) else {
            return Ok(());
        };
        match outcome {
            Outcome::Charged => {
                rule.shown.declines = 0;
                rule.shown.last_failure = None;
            }
            Outcome::Declined(why) => {
                rule.shown.declines += 1;
                rule.shown.last_failure = Some(why.clone());
                rule.shown.enabled = rule.shown.declines < MAX_DECLINES;
                rule.armed = true;
            }
            Outcome::Unreachable(why) => {
                rule.shown.last_failure = Some(why.clone());
                rule.attempt = due.attempt.saturating_sub(1);
                rule.armed = true;
            }
        }
        Ok(())
    }
}
