//! Single sign-on's records: the email domains organizations claim (a new user signing in
//! through the provider with a verified email of the domain joins that organization), and the
//! sign-ins started at the provider, kept as the SHA-256 of their `state` until the browser
//! comes back, once. The audit rows of both stores are built here, alike.

use serde::Serialize;
use serde_json::{json, Value};
use time::{Duration, OffsetDateTime};

use super::{SignInMethod, User};
use crate::audit::{Action, Actor, AuditEntry};

/// An email domain claimed by the organization that owns `account_id`. Pending (no effect:
/// no SSO requirement, no joining by the domain) until proven; several organizations may hold
/// pending claims of one domain, at most one a proven claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainClaim {
    /// Lower-cased, as in the emails.
    pub domain: String,
    pub account_id: String,
    /// Password sign-in of the domain's emails is refused: they sign in through the provider.
    pub require_sso: bool,
    pub claimed_at: OffsetDateTime,
    /// The random part of the TXT record that proves the claim
    /// (`svc-gateway-verification=<token>`): public once published, so kept as is (the page
    /// shows it), never logged nor audited. `None` for claims made before proofs existed.
    pub txt_token: Option<String>,
    /// How the claim was proven; `None` while pending.
    pub proof: Option<DomainProof>,
    /// A TXT-proven claim's record was missing at every re-check since then.
    pub missing_since: Option<OffsetDateTime>,
    /// Where the pending claim's proof link was last mailed.
    pub mail_to: Option<String>,
}

/// How an organization proved it controls a domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DomainProof {
    /// The TXT record the dashboard showed was found at `_svc-gateway-challenge.<domain>`.
    Txt,
    /// A link mailed to an address at the domain was followed.
    Mail,
    /// Claims made before proofs existed: the claiming owner's own address at the domain,
    /// verified at sign-up (migration 0031 keeps them proven).
    SignUp,
}

impl DomainProof {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Txt => "txt",
            Self::Mail => "mail",
            Self::SignUp => "sign_up",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Txt, Self::Mail, Self::SignUp]
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

/// What proving a claim did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proving {
    Proven(DomainClaim),
    /// Another organization holds a proven claim of the domain.
    Taken,
    /// No pending claim (released, already proven, or a spent or expired link).
    NoClaim,
}

/// What a re-check of a TXT-proven claim did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recheck {
    /// The record was found (or the claim is gone or no longer TXT-proven).
    Kept,
    /// Missing, within the grace period since it was first missed.
    Missing,
    /// Missing for longer than the grace period: the claim is pending again.
    Lapsed,
}

/// Whether a claim missing its record since `since` lapses at `now` after `grace`.
pub fn lapses(since: OffsetDateTime, now: OffsetDateTime, grace: Duration) -> bool {
    now - since >= grace
}

pub(super) fn domain_proven(claim: &DomainClaim, by: &Actor) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: claim.account_id.clone(),
        action: Action::DomainProven,
        target: claim.domain.clone(),
        before: json!({ "domain": claim.domain, "proof": null }),
        after: json!({ "domain": claim.domain, "proof": claim.proof }),
    }
}

pub(super) fn domain_lapsed(claim: &DomainClaim, since: OffsetDateTime, by: &Actor) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: claim.account_id.clone(),
        action: Action::DomainLapsed,
        target: claim.domain.clone(),
        before: json!({ "domain": claim.domain, "proof": claim.proof,
                        "missing_since": since.unix_timestamp() }),
        after: json!({ "domain": claim.domain, "proof": null }),
    }
}

/// The domain of an email (the part after its last `@`), lower-cased.
pub fn domain_of(email: &str) -> Option<String> {
    email
        .rsplit_once('@')
        .map(|(_, domain)| domain.to_lowercase())
        .filter(|d| !d.is_empty())
}

pub(super) fn domain_claimed(claim: &DomainClaim, by: &Actor) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: claim.account_id.clone(),
        action: Action::DomainClaimed,
        target: claim.domain.clone(),
        before: Value::Null,
        after: json!({ "domain": claim.domain, "require_sso": claim.require_sso,
                       "proven": claim.proof.is_some() }),
    }
}

pub(super) fn domain_released(claim: &DomainClaim, by: &Actor) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: claim.account_id.clone(),
        action: Action::DomainReleased,
        target: claim.domain.clone(),
        before: json!({ "domain": claim.domain, "require_sso": claim.require_sso,
                        "proof": claim.proof }),
        after: Value::Null,
    }
}

/// A sign-in refused to `user`'s account, through the provider or because the domain requires
/// it: `after` names the method and why.
pub(super) fn sso_refused(
    user: &User,
    method: SignInMethod,
    reason: &str,
    by: &Actor,
) -> AuditEntry {
    AuditEntry {
        after: json!({ "method": method, "reason": reason }),
        ..super::sign_in_refused(user, by)
    }
}
