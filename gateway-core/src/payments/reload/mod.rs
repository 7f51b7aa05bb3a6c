//! Auto-reload: "when the balance falls below X credits, add $Y", charged off-session to the
//! card an account saved at its first Stripe checkout and credited by the same webhook as any
//! top-up. Every pod sweeps (`stripe::reloads`, when Stripe is the provider); a reload starts in the store's one atomic step that
//! disarms it ([`AutoReloads::due`]), so one crossing is one charge whichever pods sweep. It
//! is re-armed when the balance is back at the threshold, or after a failed attempt (the next
//! sweep retries); [`MAX_DECLINES`] declines in a row turn it off.

mod memory;
mod postgres;

use async_trait::async_trait;

pub use memory::MemoryAutoReloads;
pub use postgres::PostgresAutoReloads;

use serde_json::json;
use store::accounts::StoreError;
use store::audit::{Action, Actor, AuditEntry};

/// Declines in a row after which auto-reload turns itself off.
pub const MAX_DECLINES: u32 = 3;

/// What the account sets of its auto-reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub enabled: bool,
    pub threshold_credits: u64,
    pub usd_cents: u64,
}

/// The audit row of a rule changed from `before` to `after`; `None` when nothing changed.
fn audited(account_id: &str, before: Rule, after: Rule, by: &Actor) -> Option<AuditEntry> {
    let shown = |r: Rule| {
        json!({
            "enabled": r.enabled,
            "threshold_credits": r.threshold_credits,
            "usd_cents": r.usd_cents,
        })
    };
    (before != after).then(|| AuditEntry {
        actor: by.clone(),
        account_id: account_id.to_owned(),
        action: Action::AutoReloadChanged,
        target: account_id.to_owned(),
        before: shown(before),
        after: shown(after),
    })
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AutoReload {
    pub card_saved: bool,
    pub enabled: bool,
    pub threshold_credits: u64,
    pub usd_cents: u64,
    /// Declines in a row.
    pub declines: u32,
    /// What went wrong last, as shown to the user.
    pub last_failure: Option<String>,
}

/// A reload a pod has started: the only one for this crossing.
#[derive(Clone, Debug)]
pub struct Due {
    pub account_id: String,
    /// Numbers the account's charges; the same after a network error, so a retry is the same
    /// charge (it is in the idempotency key).
    pub attempt: u64,
    pub usd_cents: u64,
    pub customer_id: String,
    pub payment_method_id: String,
}

impl Due {
    /// The top-up reference, and the charge's idempotency key.
    pub fn reference(&self) -> String {
        format!("reload_{}_{}", self.account_id, self.attempt)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Charged; the webhook credits it.
    Charged,
    /// The card was refused; counts towards [`MAX_DECLINES`].
    Declined(String),
    /// Nothing known to be charged; retried under the same attempt.
    Unreachable(String),
}

#[async_trait]
pub trait AutoReloads: Send + Sync {
    /// Keeps the card a checkout saved (the latest one wins).
    async fn save_card(
        &self,
        account_id: &str,
        customer_id: &str,
        payment_method_id: &str,
    ) -> Result<(), StoreError>;
    async fn settings(&self, account_id: &str) -> Result<AutoReload, StoreError>;
    /// Sets the rule; `false` when the account has no saved card. Turning it on clears the
    /// declines. A change is audited as `by`'s, with the change.
    async fn configure(&self, account_id: &str, rule: Rule, by: &Actor)
        -> Result<bool, StoreError>;
    /// Re-arms the reloads whose balance is back at the threshold, then disarms and returns
    /// those whose available balance is below it.
    async fn due(&self) -> Result<Vec<Due>, StoreError>;
    /// Records how a started reload went.
    async fn finish(&self, due: &Due, outcome: &Outcome) -> Result<(), StoreError>;
}
