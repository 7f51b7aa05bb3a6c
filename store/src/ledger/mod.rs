//! Credits and the message ledger: the apiCredits balance of each account, reservations held
//! while a turn runs, what each message was billed, top-ups, and usage by day and model.
//! A trait with an in-process implementation (standalone) and a Postgres one (cluster).

mod coalesce;
pub mod export;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
mod memory;
pub mod message_id;
pub mod partitions;
mod postgres;
mod reversal;

use async_trait::async_trait;
use serde::Serialize;
use thiserror::Error;
use time::{Date, OffsetDateTime};

pub use memory::MemoryLedger;
pub use postgres::{PostgresLedger, CLOSE_WAIT, MESSAGE_BY_TIMED_ID};
pub use reversal::{DisputeStage, Reversal, ReversalKind};

use crate::audit::Actor;
use crate::usage::{StopReason, TokenUsage};

/// What went wrong, in the ledger's terms; what a client reads (and where to go about it) is
/// the gateway's edge's wording.
#[derive(Debug, Error)]
pub enum LedgerError {
    #[error(
        "balance too low: the turn may cost up to {needed} credits and {available} are available"
    )]
    InsufficientCredits { needed: u64, available: u64 },
    #[error("the key's monthly spend cap of {cap} credits is reached: {used} are spent or held this month and the turn may cost up to {needed}")]
    SpendCapReached { cap: u64, used: u64, needed: u64 },
    #[error("unknown account")]
    UnknownAccount,
    #[error("unknown message")]
    UnknownMessage,
    #[error("payment reference is already used by another account")]
    ReferenceConflict,
    #[error("payment reference is already used by a top-up of another amount")]
    TopUpMismatch,
    /// A refund or dispute of a payment no top-up was credited for (yet).
    #[error("no top-up was credited for payment `{0}`")]
    UnknownPayment(String),
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// Postgres refused the statement (a constraint): retrying cannot make it land.
    #[error("ledger refused the write ({0})")]
    Refused(String),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Balance {
    /// Credits owned, reservations included.
    pub balance: u64,
    /// Credits held by turns in flight.
    pub reserved: u64,
    /// Net of refunds and disputes: what drives tier promotion.
    pub lifetime_top_up_cents: u64,
    /// Credits a refund or dispute could not take back (the balance was short); the next
    /// top-ups pay them first. Non-zero flags the account.
    pub owed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Credits held; the turn is running.
    Reserved,
    Completed,
    /// The client went away; a stream is billed for what was generated, a non-streamed turn
    /// (its answer never sent) nothing.
    ClientDisconnected,
    /// Ended by the server (shutdown); billed as `ClientDisconnected`.
    Interrupted,
    /// Failed upstream or in the gateway; nothing billed.
    Failed,
    /// The process serving it died before settling; released by the reaper, nothing billed.
    Abandoned,
    /// Served, but the gateway could not bill it (its lease was lost, or the ledger could not
    /// confirm the bill): its client was told it cost nothing, and nothing was billed.
    Unbilled,
}

impl MessageStatus {
    /// The status as the ledger and the API name it (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Completed => "completed",
            Self::ClientDisconnected => "client_disconnected",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
            Self::Abandoned => "abandoned",
            Self::Unbilled => "unbilled",
        }
    }
}

/// One ledger row: everything support needs to answer "what happened to msg_...".
#[derive(Clone, Debug, Serialize)]
pub struct MessageRecord {
    pub id: String,
    pub account_id: String,
    pub key_id: String,
    /// The virtual model the client asked for.
    pub model: String,
    /// The model that served it (differs for svc/auto).
    pub served_model: String,
    pub provider: String,
    pub upstream: String,
    pub upstream_model: String,
    pub endpoint: &'static str,
    pub stream: bool,
    pub status: MessageStatus,
    pub reserved: u64,
    pub billed: u64,
    pub usage: TokenUsage,
    pub stop_reason: Option<StopReason>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    pub latency_ms: Option<u64>,
    /// The batch the turn ran for (`endpoint` is then `message_batches`,
    /// `chat_completions_batches` or `responses_batches`).
    pub batch_id: Option<String>,
    /// The end user the client named (`metadata.user_id`, Chat's and Responses' `user` or
    /// `safety_identifier`), at most [`MAX_END_USER`] bytes, for abuse investigation and
    /// per-end-user usage; only ever shown to the row's own account.
    pub end_user: Option<String>,
}

/// The longest end user a row keeps, in bytes; a longer one is refused before the turn (400
/// naming the field), as Anthropic's API refuses a `metadata.user_id` over 256.
pub const MAX_END_USER: usize = 256;

/// A turn's row as it is created, before its reservation: nothing held, billed or used yet.
/// Whoever creates a turn names it (ids, models, upstream, endpoint) and takes the rest from
/// here: `MessageRecord { id, .., ..MessageRecord::default() }`.
impl Default for MessageRecord {
    fn default() -> Self {
        Self {
            id: String::new(),
            account_id: String::new(),
            key_id: String::new(),
            model: String::new(),
            served_model: String::new(),
            provider: String::new(),
            upstream: String::new(),
            upstream_model: String::new(),
            endpoint: "",
            stream: false,
            status: MessageStatus::Reserved,
            reserved: 0,
            billed: 0,
            usage: TokenUsage::default(),
            stop_reason: None,
            created_at: OffsetDateTime::now_utc(),
            latency_ms: None,
            batch_id: None,
            end_user: None,
        }
    }
}

/// What a key's turns were billed and hold in the current UTC month: what its monthly spend
/// cap is measured against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KeySpend {
    pub spent: u64,
    pub reserved: u64,
}

/// The first day of `now`'s UTC month: when a key's monthly spend starts again from zero.
pub fn month_of(now: OffsetDateTime) -> Date {
    let day = now.to_offset(time::UtcOffset::UTC).date();
    day.replace_day(1).unwrap_or(day)
}

/// What is known of a turn when its credits are reserved.
pub struct NewReservation {
    pub record: MessageRecord,
    /// The key's monthly spend cap: the turn holds no more than the cap leaves, and below
    /// `min` the answer is 402 naming the cap.
    pub spend_cap: Option<u64>,
    /// The least the turn can run with; below it the answer is 402.
    pub min: u64,
    /// The most the turn can cost.
    pub max: u64,
}

/// The upstream that served a turn, when fallback moved it past the one recorded at
/// reservation time.
#[derive(Clone, Debug)]
pub struct ServedBy {
    pub provider: String,
    pub upstream: String,
    pub upstream_model: String,
}

pub struct Settlement {
    pub message_id: String,
    /// `None`: the upstream recorded at reservation (or none was reached).
    pub served_by: Option<ServedBy>,
    pub status: MessageStatus,
    /// What the usage costs; the ledger bills at most what was reserved.
    pub cost: u64,
    pub usage: TokenUsage,
    pub stop_reason: Option<StopReason>,
    pub latency_ms: u64,
}

impl Settlement {
    /// Ends a turn that never reached its client, billing nothing: what it held is released.
    pub fn nothing(message_id: String, status: MessageStatus) -> Self {
        Self {
            message_id,
            served_by: None,
            status,
            cost: 0,
            usage: TokenUsage::default(),
            stop_reason: None,
            latency_ms: 0,
        }
    }

    /// What a turn that held `reserved` is billed: its cost, at most what it held; nothing
    /// when it failed.
    pub fn billed(&self, reserved: u64) -> u64 {
        match self.status {
            MessageStatus::Failed => 0,
            _ => self.cost.min(reserved),
        }
    }

    /// Completes a message row with this settlement, billed `billed`.
    pub fn complete(&self, record: &mut MessageRecord, billed: u64) {
        record.status = self.status;
        record.billed = billed;
        record.usage = self.usage;
        record.stop_reason = self.stop_reason;
        record.latency_ms = Some(self.latency_ms);
        if let Some(by) = &self.served_by {
            record.provider.clone_from(&by.provider);
            record.upstream.clone_from(&by.upstream);
            record.upstream_model.clone_from(&by.upstream_model);
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TopUp {
    pub reference: String,
    pub account_id: String,
    pub usd_cents: u64,
    pub credits: u64,
    pub status: &'static str,
    #[serde(with = "time::serde::rfc3339")]
    pub confirmed_at: OffsetDateTime,
}

/// A top-up to confirm: `credits` for `usd_cents`, once per `reference`; `payment_id` names
/// the provider's payment (Stripe's PaymentIntent) so that its refunds and disputes find it.
pub struct NewTopUp<'a> {
    pub account_id: &'a str,
    pub reference: &'a str,
    pub usd_cents: u64,
    pub credits: u64,
    pub payment_id: Option<&'a str>,
    /// Whose top-up it is, for the audit log (the Stripe webhook, the admin API).
    pub by: &'a Actor,
}

/// A confirmed top-up, and whether this call confirmed it (`false`: a replay, nothing changed).
#[derive(Clone, Debug)]
pub struct Confirmation {
    pub top_up: TopUp,
    pub first: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UsageTotals {
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub credits: u64,
    /// Of `requests` and `credits`, those of Message Batch items.
    pub batch_requests: u64,
    pub batch_credits: u64,
}

impl UsageTotals {
    pub fn add(&mut self, other: &UsageTotals) {
        self.requests += other.requests;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_creation_input_tokens += other.cache_creation_input_tokens;
        self.cache_read_input_tokens += other.cache_read_input_tokens;
        self.credits += other.credits;
        self.batch_requests += other.batch_requests;
        self.batch_credits += other.batch_credits;
    }

    fn of_turn(usage: &TokenUsage, credits: u64, batch: bool) -> Self {
        Self {
            requests: 1,
            input_tokens: usage.input_tokens.into(),
            output_tokens: usage.output_tokens.into(),
            cache_creation_input_tokens: usage.cache_creation_input_tokens.into(),
            cache_read_input_tokens: usage.cache_read_input_tokens.into(),
            credits,
            batch_requests: batch.into(),
            batch_credits: if batch { credits } else { 0 },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageRow {
    pub date: Date,
    pub model: String,
    pub totals: UsageTotals,
}

/// Usage of one UTC day, model and end user (`None`: the turns that named none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndUserUsageRow {
    pub end_user: Option<String>,
    pub usage: UsageRow,
}

/// The reference under which a dashboard user's sign-up credits are added, once.
pub fn signup_credits_reference(user_id: &str) -> String {
    format!("signup:{user_id}")
}

#[async_trait]
pub trait Ledger: Send + Sync {
    /// Whether the store behind the ledger answers now (readiness); in-process ones always do.
    async fn reachable(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    /// Finishes what the ledger still does in the background, before the process exits.
    async fn close(&self) {}

    /// Gives a new account its starting credits (not a top-up: no lifetime, no tier effect),
    /// audited as `by`'s when there are any.
    async fn add_credits(
        &self,
        account_id: &str,
        credits: u64,
        by: &Actor,
    ) -> Result<Balance, LedgerError>;
    /// Adds `credits` once per `reference` (a sign-up's credits: [`signup_credits_reference`]),
    /// however often or concurrently it is asked: true when this call credited the account. A
    /// caller that may have crashed before it added them asks again. (The references are kept
    /// in the `ledger_grants` table, named before this method was.) Audited as `by`'s when it
    /// credits any.
    async fn add_credits_once(
        &self,
        account_id: &str,
        credits: u64,
        reference: &str,
        by: &Actor,
    ) -> Result<bool, LedgerError>;
    async fn balance(&self, account_id: &str) -> Result<Balance, LedgerError>;
    /// Confirms a top-up once per payment reference, crediting the account (what it owes
    /// first) and its lifetime top-up; a replay returns the first confirmation and changes
    /// nothing.
    async fn top_up(&self, top_up: NewTopUp<'_>) -> Result<Confirmation, LedgerError>;
    /// Takes back what the refunds of a payment returned: `refunded_cents` is the payment's
    /// refunded total so far, which only grows, so a replayed or late event changes nothing.
    /// `None`: nothing new to take back.
    /// A refund that takes something back is audited as `by`'s.
    async fn refund(
        &self,
        payment_id: &str,
        refunded_cents: u64,
        by: &Actor,
    ) -> Result<Option<Reversal>, LedgerError>;
    /// Moves a dispute's money once: taken back when it opens (or is lost unseen), given back
    /// when it is won after being opened; whatever order the stages arrive in. A stage that
    /// changes the dispute is audited as `by`'s.
    async fn dispute(
        &self,
        dispute_id: &str,
        payment_id: &str,
        usd_cents: u64,
        stage: DisputeStage,
        by: &Actor,
    ) -> Result<Option<Reversal>, LedgerError>;
    /// The account's refunds and disputes, newest first.
    async fn reversals(&self, account_id: &str) -> Result<Vec<Reversal>, LedgerError>;
    /// Holds between `min` and `max` credits, as much as the balance allows; returns the amount.
    async fn reserve(&self, reservation: NewReservation) -> Result<u64, LedgerError>;
    /// Bills a reserved turn and releases the rest; once only: a replay returns the first
    /// settlement's billed amount and changes nothing.
    async fn settle(&self, settlement: Settlement) -> Result<u64, LedgerError>;
    async fn message(&self, id: &str) -> Result<Option<MessageRecord>, LedgerError>;
    /// Usage of an account by UTC day and model, both dates inclusive.
    async fn usage(
        &self,
        account_id: &str,
        from: Date,
        to: Date,
    ) -> Result<Vec<UsageRow>, LedgerError>;
    /// Usage of an account by UTC day, model and end user, both dates inclusive; only the
    /// turns of `end_user` when one is given. Counted as [`Ledger::usage`] counts (served
    /// turns; failed and abandoned ones add nothing), so the two agree on every total.
    async fn end_user_usage(
        &self,
        account_id: &str,
        from: Date,
        to: Date,
        end_user: Option<&str>,
    ) -> Result<Vec<EndUserUsageRow>, LedgerError>;
    /// The account's latest messages, newest first.
    async fn recent_messages(
        &self,
        account_id: &str,
        limit: usize,
    ) -> Result<Vec<MessageRecord>, LedgerError>;
    /// What the key spent and holds this UTC month.
    async fn key_spend(&self, key_id: &str) -> Result<KeySpend, LedgerError>;
    /// The account's confirmed top-ups, newest first.
    async fn top_ups(&self, account_id: &str) -> Result<Vec<TopUp>, LedgerError>;
}

/// The audit rows of the ledger's changes, the same from both ledgers.
mod audited {
    use serde_json::{json, Value};

    use super::reversal::DisputeStatus;
    use super::{Reversal, TopUp};
    use crate::audit::{Action, Actor, AuditEntry};

    /// `credits` given to `account_id`, once under `reference` when there is one.
    pub fn credits_added(
        account_id: &str,
        credits: u64,
        reference: Option<&str>,
        by: &Actor,
    ) -> AuditEntry {
        AuditEntry {
            actor: by.clone(),
            account_id: account_id.to_owned(),
            action: Action::CreditsAdded,
            target: reference.unwrap_or(account_id).to_owned(),
            before: Value::Null,
            after: json!({ "credits": credits }),
        }
    }

    pub fn top_up(top_up: &TopUp, payment_id: Option<&str>, by: &Actor) -> AuditEntry {
        AuditEntry {
            actor: by.clone(),
            account_id: top_up.account_id.clone(),
            action: Action::TopUp,
            target: top_up.reference.clone(),
            before: Value::Null,
            after: json!({
                "usd_cents": top_up.usd_cents,
                "credits": top_up.credits,
                "payment_id": payment_id,
            }),
        }
    }

    fn moved(reversal: &Reversal) -> Value {
        json!({
            "kind": reversal.kind,
            "reference": reversal.reference,
            "usd_cents": reversal.usd_cents,
            "credits": reversal.credits,
            "owed": reversal.owed,
        })
    }

    /// `refunded_before` and `refunded` are the payment's refunded totals in cents.
    pub fn refund(
        reversal: &Reversal,
        payment_id: &str,
        refunded_before: u64,
        by: &Actor,
    ) -> AuditEntry {
        let mut after = moved(reversal);
        after["refunded_cents"] = json!(refunded_before + reversal.usd_cents);
        AuditEntry {
            actor: by.clone(),
            account_id: reversal.account_id.clone(),
            action: Action::Refund,
            target: payment_id.to_owned(),
            before: json!({ "refunded_cents": refunded_before }),
            after,
        }
    }

    pub fn dispute(
        dispute_id: &str,
        account_id: &str,
        known: Option<DisputeStatus>,
        status: DisputeStatus,
        reversal: Option<&Reversal>,
        by: &Actor,
    ) -> AuditEntry {
        let mut after = reversal.map_or_else(|| json!({}), moved);
        after["status"] = json!(status.as_str());
        AuditEntry {
            actor: by.clone(),
            account_id: account_id.to_owned(),
            action: Action::Dispute,
            target: dispute_id.to_owned(),
            before: json!({ "status": known.map(DisputeStatus::as_str) }),
            after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(status: MessageStatus, cost: u64) -> Settlement {
        Settlement {
            cost,
            ..Settlement::nothing("msg_1".into(), status)
        }
    }

    #[test]
    fn a_turn_is_billed_its_cost_but_never_more_than_it_reserved() {
        for status in [
            MessageStatus::Completed,
            MessageStatus::Interrupted,
            MessageStatus::ClientDisconnected,
        ] {
            assert_eq!(ended(status, 40).billed(100), 40, "{status:?}");
            assert_eq!(ended(status, 140).billed(100), 100, "{status:?}");
        }
    }

    #[test]
    fn a_failed_turn_is_billed_nothing_whatever_it_generated() {
        assert_eq!(ended(MessageStatus::Failed, 40).billed(100), 0);
    }
}
