//! Single sign-on's records: the email domains organizations claim (a new user signing in
//! through the provider with a verified email of the domain joins that organization), and the
//! sign-ins started at the provider, kept as the SHA-256 of their `state` until the browser
//! comes back, once. The audit rows of both stores are built here, alike.

use serde_json::{json, Value};
use time::OffsetDateTime;

use super::{SignInMethod, User};
use crate::audit::{Action, Actor, AuditEntry};

/// An email domain claimed by the organization that owns `account_id`. Unique across
/// organizations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainClaim {
    /// Lower-cased, as in the emails.
    pub domain: String,
    pub account_id: String,
    /// Password sign-in of the domain's emails is refused: they sign in through the provider.
    pub require_sso: bool,
    pub claimed_at: OffsetDateTime,
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
        after: json!({ "domain": claim.domain, "require_sso": claim.require_sso }),
    }
}

pub(super) fn domain_released(claim: &DomainClaim, by: &Actor) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: claim.account_id.clone(),
        action: Action::DomainReleased,
        target: claim.domain.clone(),
        before: json!({ "domain": claim.domain, "require_sso": claim.require_sso }),
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
