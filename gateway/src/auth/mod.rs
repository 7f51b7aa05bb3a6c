//! Who is calling: the API key from `Authorization: Bearer` (the spec) or `x-api-key` (what
//! the Anthropic SDKs send), looked up by its SHA-256 hash. Keys are 238-bit random secrets,
//! so a fast hash is the right tool (a password hash would only slow every request); the stored
//! hash is compared in constant time, and the secret itself is never stored or logged.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use crds::config::Limits;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use thiserror::Error;
use time::OffsetDateTime;

use crate::accounts::{Account, AccountStatus, KeyKind, KeyRecord, StoreError};
use crate::client_address::{AddressBucket, ClientAddress};
use crate::error::ApiError;
use crate::ids;
use crate::limits::{self, standing_of, AddressLimit, LimitError};
use crate::routing::Catalog;
use crate::state::AppState;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    pub fn of(secret: &str) -> Self {
        Self(Sha256::digest(secret.as_bytes()).into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// A stored hash; `None` when it is not 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

impl ConstantTimeEq for KeyHash {
    fn ct_eq(&self, other: &Self) -> subtle::Choice {
        self.0.ct_eq(&other.0)
    }
}

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
    fn unidentified(&self) -> bool {
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

/// Tower middleware for `/v1/*`: identifies the key (401), checks it may use this surface
/// (403), and hands the [`Principal`] to the handlers. The principal also rides on the
/// response, so the rate-limit headers reach every authenticated answer, refusals included.
///
/// First of all, before the key is looked up, the client address's key-guessing brake: an
/// address that sent too many requests without a valid key this minute is refused (429)
/// whatever key it sends now, so a guess that hits cannot show. Each request that fails to
/// authenticate is counted against its address, and its 401 carries that limit's headers.
pub async fn layer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let client = ClientAddress::of(&state, req.extensions(), req.headers())
        .0
        .map(AddressBucket::of);
    if let Some(refusal) = client.and_then(|c| state.unauthenticated.refused(c)) {
        return address_refusal(refusal);
    }
    let principal = match identify(&state, req.headers()).await {
        Ok(principal) => Arc::new(principal),
        Err(e) if e.unidentified() => return unidentified(&state, client, e).await,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut response = match permit(&principal, scope_of(req.uri().path())) {
        Ok(()) => {
            req.extensions_mut().insert(principal.clone());
            next.run(req).await
        }
        Err(e) => ApiError::from(e).into_response(),
    };
    response.extensions_mut().insert(principal);
    response
}

/// The 401 of a request without a valid key, counted against its address: 429 instead once
/// the address is over its limit. While the brake's store cannot be read the 401 goes out
/// without headers, as authenticated answers do then.
async fn unidentified(state: &AppState, client: Option<AddressBucket>, e: AuthError) -> Response {
    let Some(client) = client else {
        return ApiError::from(e).into_response();
    };
    match state.unauthenticated.count(client).await {
        Ok(standing) => with_address_headers(ApiError::from(e).into_response(), &standing),
        Err(LimitError::Unavailable(detail)) => {
            tracing::debug!(error = %detail, "address brake unavailable; 401 without its headers");
            ApiError::from(e).into_response()
        }
        Err(refusal) => address_refusal(refusal),
    }
}

fn address_refusal(refusal: LimitError) -> Response {
    let standing = standing_of(&refusal);
    let response = ApiError::from(refusal).into_response();
    match standing {
        Some(standing) => with_address_headers(response, &standing),
        None => response,
    }
}

fn with_address_headers(mut response: Response, standing: &AddressLimit) -> Response {
    limits::write_address_headers(response.headers_mut(), standing);
    response
}

async fn identify(state: &AppState, headers: &HeaderMap) -> Result<Principal, AuthError> {
    let secret = presented_key(headers)?;
    let hash = KeyHash::of(secret);
    let (key, account) = state
        .accounts
        .key_by_hash(&hash)
        .await?
        .ok_or(AuthError::Invalid)?;
    if !bool::from(key.hash.ct_eq(&hash)) || key.revoked {
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
    let catalog = state.catalog();
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
    let spend_cap = spend_cap(&catalog, &key);
    Ok(Principal {
        key,
        account,
        tier,
        limits,
        scopes,
        suspended,
        spend_cap,
    })
}

fn permit(principal: &Principal, scope: &'static str) -> Result<(), AuthError> {
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

fn presented_key(headers: &HeaderMap) -> Result<&str, AuthError> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let value = value.to_str().map_err(|_| AuthError::Malformed)?;
        let (scheme, token) = value.split_once(' ').ok_or(AuthError::Malformed)?;
        let token = token.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(AuthError::Malformed);
        }
        return Ok(token);
    }
    match headers.get("x-api-key") {
        Some(value) => match value.to_str().map(str::trim) {
            Ok(token) if !token.is_empty() => Ok(token),
            _ => Err(AuthError::Malformed),
        },
        None => Err(AuthError::Missing),
    }
}

/// The scope a `/v1` path needs (see `crds::config::SCOPES`).
fn scope_of(path: &str) -> &'static str {
    let path = path.strip_prefix("/v1").unwrap_or(path);
    if path.starts_with("/chat") {
        "chat"
    } else if path.starts_with("/responses") {
        "responses"
    } else if path.starts_with("/models") {
        "models"
    } else if path.starts_with("/account") || path.starts_with("/usage") {
        "account"
    } else {
        "messages"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_the_surface() {
        assert_eq!(scope_of("/v1/messages/count_tokens"), "messages");
        assert_eq!(scope_of("/v1/chat/completions"), "chat");
        assert_eq!(scope_of("/v1/responses/resp_1/input_items"), "responses");
        assert_eq!(scope_of("/v1/models/svc/opus"), "models");
        assert_eq!(scope_of("/v1/usage"), "account");
    }

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
