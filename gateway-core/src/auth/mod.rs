//! Who is calling: a key secret looked up by its hash ([`KeyHash`]), the config's grants applied,
//! and what the caller may use; minting keys. The secret itself is never stored or logged. The
//! HTTP side (which header carries the key, the middleware) is `edge::auth`.

use crds::config::Limits;
use subtle::ConstantTimeEq;
use thiserror::Error;
use time::OffsetDateTime;

use crate::ids;
use crate::limits::RequestCount;
use crate::routing::Catalog;
use store::accounts::{Account, AccountStatus, Accounts, KeyHash, KeyKind, KeyRecord, StoreError};

#[derive(Debug, Error)]
pub enum AuthError {
    #[error("missing API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`")]
    Missing,
    #[error("malformed Authorization header: expected `Bearer <key>`")]
    Malformed,
    #[error("invalid API key")]
    Invalid,
    #[error("this API key expired at {0}; mint a new one at /developers/keys")]
    Expired(String),
    #[error("this key is a CLI key and cannot be used on the /v1 API; mint an API key at /developers/keys")]
    CliKey,
    #[error("the account of this key is suspended")]
    Suspended,
    #[error("this key is not allowed the `{0}` scope")]
    Scope(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AuthError {
    /// The caller is not identified (no key, or not a valid one): the address brake counts it.
    pub fn unidentified(&self) -> bool {
        matches!(self, Self::Missing | Self::Malformed | Self::Invalid)
    }
}

/// An authenticated caller, with the grants of the compiled config applied.
#[derive(Clone, Debug)]
pub struct Principal {
    pub key: KeyRecord,
    pub account: Account,
    pub tier: String,
    pub limits: Limits,
    /// Effective scopes; empty allows every surface.
    pub scopes: Vec<String>,
    pub suspended: bool,
    /// The key's monthly spend cap: the ApiKey grant's, else the one it was minted with.
    pub spend_cap: Option<u64>,
    /// This request's count against the key's requests per minute, not yet taken.
    pub request_count: RequestCount,
}

/// A freshly minted key: the record to store and the secret to show once.
pub struct MintedKey {
    pub record: KeyRecord,
    pub secret: String,
}

pub struct KeySpec {
    pub id: Option<String>,
    pub account_id: String,
    pub name: String,
    pub kind: KeyKind,
    pub scopes: Vec<String>,
    pub tier: String,
    /// A given secret (the dev key, a seeded key); random when absent.
    pub secret: Option<String>,
    pub expires_at: Option<OffsetDateTime>,
    pub spend_cap: Option<u64>,
}

pub fn mint(spec: KeySpec) -> MintedKey {
    let secret = spec.secret.unwrap_or_else(ids::key_secret);
    // Never more than a third of the secret, so short hand-picked dev keys stay secret.
    let prefix: String = secret.chars().take(12.min(secret.len() / 3)).collect();
    MintedKey {
        record: KeyRecord {
            id: spec.id.unwrap_or_else(ids::key),
            account_id: spec.account_id,
            name: spec.name,
            prefix,
            kind: spec.kind,
            scopes: spec.scopes,
            tier: spec.tier,
            revoked: false,
            hash: KeyHash::of(&secret),
            created_at: OffsetDateTime::now_utc(),
            expires_at: spec.expires_at,
            spend_cap: spec.spend_cap,
            created_by: None,
        },
        secret,
    }
}

/// The key's monthly spend cap: its ApiKey grant's, else the one it was minted with.
pub fn spend_cap(catalog: &Catalog, key: &KeyRecord) -> Option<u64> {
    catalog
        .grant(&key.id)
        .and_then(|g| g.spend_cap)
        .or(key.spend_cap)
}

/// Why an expiry cannot be given to a new key: one already past would mint a dead key.
pub fn check_expiry(
    expires_at: Option<OffsetDateTime>,
    now: OffsetDateTime,
) -> Result<(), &'static str> {
    match expires_at {
        Some(at) if at <= now => Err("must be in the future"),
        _ => Ok(()),
    }
}

/// The caller a presented key secret stands for, with the config's grants applied.
pub async fn identify(
    accounts: &dyn Accounts,
    catalog: &Catalog,
    secret: &str,
) -> Result<Principal, AuthError> {
    identify_hash(accounts, catalog, &KeyHash::of(secret)).await
}

/// [`identify`] by the hash of the secret: a Message Batch runs its items as the key that
/// created it, checked again (revoked, expired, suspended) when each item runs.
pub async fn identify_hash(
    accounts: &dyn Accounts,
    catalog: &Catalog,
    hash: &KeyHash,
) -> Result<Principal, AuthError> {
    let found = accounts.key_by_hash(hash).await?;
    principal(catalog, hash, found)
}

/// [`identify`], when the account store can answer without asking the database
/// ([`Accounts::cached_key_by_hash`]); `None` when it cannot.
pub fn identify_cached(
    accounts: &dyn Accounts,
    catalog: &Catalog,
    secret: &str,
) -> Option<Result<Principal, AuthError>> {
    let hash = KeyHash::of(secret);
    let found = accounts.cached_key_by_hash(&hash)?;
    Some(principal(catalog, &hash, found))
}

/// The principal of the key found under `hash` (and its account), or why it is none.
fn principal(
    catalog: &Catalog,
    hash: &KeyHash,
    found: Option<(KeyRecord, Account)>,
) -> Result<Principal, AuthError> {
    let (key, account) = found.ok_or(AuthError::Invalid)?;
    if !bool::from(key.hash.ct_eq(hash)) || key.revoked {
        return Err(AuthError::Invalid);
    }
    if let Some(at) = key
        .expires_at
        .filter(|_| key.expired(OffsetDateTime::now_utc()))
    {
        return Err(AuthError::Expired(
            at.format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        ));
    }
    let grant = catalog.grant(&key.id);
    let suspended =
        account.status == AccountStatus::Suspended || grant.is_some_and(|g| g.suspended);
    let scopes = grant
        .and_then(|g| g.scopes.clone())
        .unwrap_or_else(|| key.scopes.clone());
    let tier = grant
        .and_then(|g| g.tier.clone())
        .unwrap_or_else(|| key.tier.clone());
    let limits = grant
        .and_then(|g| g.limits)
        .or_else(|| catalog.tier_limits(&tier))
        .or_else(|| catalog.tier_limits("free"))
        .ok_or(AuthError::Invalid)?;
    let spend_cap = spend_cap(catalog, &key);
    Ok(Principal {
        key,
        account,
        tier,
        limits,
        scopes,
        suspended,
        spend_cap,
        request_count: RequestCount::default(),
    })
}

/// Whether the caller may use the surface that needs `scope`.
pub fn permit(principal: &Principal, scope: &'static str) -> Result<(), AuthError> {
    if principal.key.kind == KeyKind::Cli {
        return Err(AuthError::CliKey);
    }
    if principal.suspended {
        return Err(AuthError::Suspended);
    }
    let scopes = &principal.scopes;
    if !scopes.is_empty() && !scopes.iter().any(|s| s == scope) {
        return Err(AuthError::Scope(scope));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_keys_show_only_a_prefix_and_store_only_a_hash() {
        let minted = mint(KeySpec {
            id: None,
            account_id: "acct_1".into(),
            name: "k".into(),
            kind: KeyKind::Api,
            scopes: vec![],
            tier: "free".into(),
            secret: None,
            expires_at: None,
            spend_cap: None,
        });
        assert!(minted.secret.starts_with("sk-svc-"));
        assert_eq!(minted.record.prefix.len(), 12);
        assert_eq!(minted.record.hash, KeyHash::of(&minted.secret));
    }
}
