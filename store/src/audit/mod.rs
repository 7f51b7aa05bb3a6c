//! The audit log: one append-only row per change to money or access (keys created and revoked,
//! top-ups, refunds, disputes, suspensions, tier promotions, dashboard sign-ins), saying who
//! made it, from where, and what it was before and after. The stores that make a change write
//! its row themselves, in the same transaction (Postgres) or under the same lock (in process),
//! so a change is never without its row nor a row without its change. Nothing edits or deletes
//! a row: the trait has no such method, and Postgres refuses it (migration 0011). Stores of
//! other crates (gateway-core's auto-reload rules) append with [`append_in`] and
//! [`MemoryAuditLog::append`] the same way.

mod memory;
mod postgres;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;
use time::OffsetDateTime;

pub use memory::MemoryAuditLog;
pub use postgres::append_in;
pub use postgres::PostgresAuditLog;

use crate::db::DbError;

/// The log could not be read. (Its own error, not the account store's: the stores depend on
/// the log, never the other way round.)
#[derive(Debug, Error)]
pub enum AuditError {
    #[error("audit log unavailable: {0}")]
    Unavailable(#[from] DbError),
}

/// Who made a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// Signed in to the dashboard; the id is the user's email.
    DashboardUser,
    /// The admin API's bearer token; the id is `admin`.
    AdminToken,
    /// The operator's custom resources: keys and top-ups seeded from the manifests (`seed`),
    /// the grants of ApiKey resources (`ApiKey`).
    Operator,
    /// A Stripe event; the id is the event's (`payment_webhook` for the generic payment
    /// webhook's deliveries).
    StripeWebhook,
    /// The gateway's command line, run by whoever can reach its database.
    Cli,
    /// A background sweep (the tier promotion); the id names the process.
    Sweep,
}

pub const ACTOR_KINDS: [ActorKind; 6] = [
    ActorKind::DashboardUser,
    ActorKind::AdminToken,
    ActorKind::Operator,
    ActorKind::StripeWebhook,
    ActorKind::Cli,
    ActorKind::Sweep,
];

/// Who made a change, and from which client address when it came over the network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Actor {
    pub kind: ActorKind,
    /// An email, an event id, a process name: never a secret.
    pub id: String,
    pub client: Option<String>,
}

impl Actor {
    pub fn new(kind: ActorKind, id: impl Into<String>, client: Option<String>) -> Self {
        Self {
            kind,
            id: id.into(),
            client,
        }
    }
}

/// What was done: a closed set, stored by its `snake_case` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A user signed up in the dashboard (its account created with it).
    SignedUp,
    /// A user followed the link mailed at sign-up; the password it chose took effect.
    EmailVerified,
    SignIn,
    SignInFailed,
    /// A key was created; `after` carries its tier (`enterprise` when granted by hand),
    /// expiry and spend cap.
    KeyCreated,
    KeyRevoked,
    AccountSuspended,
    AccountResumed,
    TopUp,
    Refund,
    Dispute,
    TierPromoted,
    /// The auto-reload rule (on or off, threshold, amount) was changed.
    AutoReloadChanged,
    /// Credits given without a payment: an account's starting credits, a sign-up's.
    CreditsAdded,
    /// One dashboard session was ended by its user.
    SignedOut,
    /// Every dashboard session of the user was ended at once, the acting one included.
    SignedOutEverywhere,
    /// An invitation to join the account's organization was mailed; `after`: the role.
    InvitationSent,
    /// An invitation was accepted; `before`/`after`: the user's account and role.
    InvitationAccepted,
    /// A member's role was changed; `before`/`after`: the role.
    MemberRoleChanged,
    /// A member was removed from the organization; `before`: the role.
    MemberRemoved,
    /// The organization claimed an email domain for single sign-on; `after`: the domain and
    /// whether password sign-in is refused for it.
    DomainClaimed,
    /// A pending invitation was withdrawn before it was accepted; `before`: its role.
    InvitationWithdrawn,
    /// What an ApiKey resource grants the key changed (tier, limits, scopes, suspension,
    /// spend cap); `before`/`after`: the grant, `null` where the key had none.
    KeyGrantChanged,
    /// The organization released an email domain it had claimed; `before`: the claim.
    DomainReleased,
    /// A claimed email domain was proven the organization's (a DNS TXT record, or a link
    /// mailed to an address at the domain); `after`: the proof.
    DomainProven,
    /// A TXT-proven domain's record stayed missing past the grace period: the claim is pending
    /// again; `before`: the proof and since when the record was missing.
    DomainLapsed,
}

pub const ACTIONS: [Action; 26] = [
    Action::SignedUp,
    Action::EmailVerified,
    Action::SignIn,
    Action::SignInFailed,
    Action::KeyCreated,
    Action::KeyRevoked,
    Action::AccountSuspended,
    Action::AccountResumed,
    Action::TopUp,
    Action::Refund,
    Action::Dispute,
    Action::TierPromoted,
    Action::AutoReloadChanged,
    Action::CreditsAdded,
    Action::SignedOut,
    Action::SignedOutEverywhere,
    Action::InvitationSent,
    Action::InvitationAccepted,
    Action::MemberRoleChanged,
    Action::MemberRemoved,
    Action::DomainClaimed,
    Action::InvitationWithdrawn,
    Action::KeyGrantChanged,
    Action::DomainReleased,
    Action::DomainProven,
    Action::DomainLapsed,
];

impl Action {
    pub fn as_str(self) -> String {
        crate::db::name_of(&self)
    }

    pub fn parse(name: &str) -> Option<Self> {
        crate::db::parse_name(&ACTIONS, name)
    }
}

impl ActorKind {
    pub fn as_str(self) -> String {
        crate::db::name_of(&self)
    }

    pub fn parse(name: &str) -> Option<Self> {
        crate::db::parse_name(&ACTOR_KINDS, name)
    }
}

/// A change, as its store records it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditEntry {
    pub actor: Actor,
    pub account_id: String,
    pub action: Action,
    /// What was changed: a key id, a payment reference, a dispute id, an email.
    pub target: String,
    /// A few fields of the target before and after; `null` where there was nothing.
    pub before: Value,
    pub after: Value,
}

/// A row of the log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditRecord {
    /// Grows with every row: the log's order, and its pagination cursor.
    pub id: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    #[serde(flatten)]
    pub entry: AuditEntry,
}

/// Which rows to list, newest first; every filter given must match.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    pub account_id: Option<String>,
    pub action: Option<Action>,
    pub actor_kind: Option<ActorKind>,
    /// Inclusive.
    pub from: Option<OffsetDateTime>,
    /// Exclusive.
    pub to: Option<OffsetDateTime>,
    /// Only rows older than this one: the cursor of the next page.
    pub before_id: Option<i64>,
    pub limit: usize,
}

impl AuditQuery {
    fn matches(&self, record: &AuditRecord) -> bool {
        let e = &record.entry;
        self.account_id.as_ref().is_none_or(|a| *a == e.account_id)
            && self.action.is_none_or(|a| a == e.action)
            && self.actor_kind.is_none_or(|k| k == e.actor.kind)
            && self.from.is_none_or(|from| record.at >= from)
            && self.to.is_none_or(|to| record.at < to)
            && self.before_id.is_none_or(|id| record.id < id)
    }
}

/// Reads the log; rows are written by the stores whose changes they record. There is no
/// method to change or remove one.
#[async_trait]
pub trait AuditLog: Send + Sync {
    /// The rows matching `query`, newest first, at most `query.limit`.
    async fn list(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, AuditError>;
}
