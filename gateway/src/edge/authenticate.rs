//! The `/v1` authentication layer (the key lookup itself is `gateway_core::auth`): the API key
//! from `Authorization: Bearer` (the spec) or `x-api-key` (what the Anthropic SDKs send), the
//! client address's key-guessing brake for requests without a valid key, and the
//! [`Principal`] handed to the handlers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::client_address::ClientAddress;
use crate::edge::budget::BudgetOwner;
use crate::edge::rate_limit_headers;
use crate::error::ApiError;
use crate::state::Gate;
use gateway_core::auth::{identify, identify_cached, permit, AuthError, Principal};
use gateway_core::limits::AddressBucket;
use gateway_core::limits::{standing_of, AddressLimit, LimitError};

/// Tower middleware for `/v1/*`: identifies the key (401), checks it may use this surface
/// (403), and hands the [`Principal`] to the handlers. The principal also rides on the
/// response, so the rate-limit headers reach every authenticated answer, refusals included.
///
/// Each request that fails to authenticate is counted against its client address (the
/// key-guessing brake), and its 401 carries that limit's headers; once the address is over
/// the limit, requests from it without a valid key are refused (429) until the window ends.
/// A valid key is served whatever its address's count: the address may be a proxy or a NAT
/// that other clients share, and one client's wrong keys must not lock the others out.
pub async fn layer(State(state): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    let client = ClientAddress::of(&state.trusted_proxies, req.extensions(), req.headers())
        .0
        .map(AddressBucket::of);
    let refusal = client.and_then(|c| state.unauthenticated.refused(c));
    let identified = match (presented_key(req.headers()), client) {
        (Err(e), _) => Err(e),
        (Ok(secret), Some(client)) if refusal.is_some() => {
            identify_braked(&state, client, secret).await
        }
        (Ok(secret), _) => identify(state.accounts.as_ref(), &state.catalog(), secret).await,
    };
    let principal = match identified {
        Ok(principal) => Arc::new(principal),
        Err(e) if e.unidentified() => {
            return match refusal {
                Some(refusal) => address_refusal(refusal),
                None => unidentified(&state, client, e).await,
            };
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut response = match permit(&principal, scope_of(req.uri().path())) {
        Ok(()) => {
            req.extensions_mut().insert(principal.clone());
            let owner = BudgetOwner(Arc::from(principal.account.id.as_str()));
            req.extensions_mut().insert(owner);
            next.run(req).await
        }
        Err(e) => ApiError::from(e).into_response(),
    };
    response.extensions_mut().insert(principal);
    response
}

/// The key of a braked address, identified as cheaply as the store allows: from its cache
/// when it knows the key, else by a lookup while the address has any left
/// ([`AddressBrake::take_lookup`](gateway_core::limits::AddressBrake::take_lookup)). A key neither
/// cached nor looked up is taken for invalid, so the address is refused as for a wrong key,
/// without the store being asked.
async fn identify_braked(
    state: &Gate,
    client: AddressBucket,
    secret: &str,
) -> Result<Principal, AuthError> {
    let catalog = state.catalog();
    if let Some(identified) = identify_cached(state.accounts.as_ref(), &catalog, secret) {
        return identified;
    }
    if !state.unauthenticated.take_lookup(client) {
        return Err(AuthError::Invalid);
    }
    identify(state.accounts.as_ref(), &catalog, secret).await
}

/// The 401 of a request without a valid key, counted against its address: 429 instead once
/// the address is over its limit. While the brake's store cannot be read the 401 goes out
/// without headers, as authenticated answers do then.
async fn unidentified(state: &Gate, client: Option<AddressBucket>, e: AuthError) -> Response {
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
    rate_limit_headers::write_address(response.headers_mut(), standing);
    response
}

fn presented_key(headers: &HeaderMap) -> Result<&str, AuthError> {
    if let Some(value) = headers.get(http::header::AUTHORIZATION) {
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
    // OpenAI's Batch API and its files run Chat Completions; embeddings are OpenAI's format
    // too, and a key scoped to it has them, as OpenAI's own "model capabilities" permission
    // covers both.
    if ["/chat", "/batches", "/files", "/embeddings"]
        .iter()
        .any(|p| path.starts_with(p))
    {
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
        assert_eq!(scope_of("/v1/batches/batch_1/cancel"), "chat");
        assert_eq!(scope_of("/v1/files"), "chat");
        assert_eq!(scope_of("/v1/embeddings"), "chat");
        assert_eq!(scope_of("/v1/responses/resp_1/input_items"), "responses");
        assert_eq!(scope_of("/v1/models/svc/opus"), "models");
        assert_eq!(scope_of("/v1/usage"), "account");
    }
}
