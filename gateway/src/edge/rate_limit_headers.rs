//! The X-RateLimit-* headers on every authenticated `/v1` response, errors included.
//!
//! The spec's four (tier and the request window) plus, for the dimensions whose headers it
//! leaves open: `X-RateLimit-{Limit,Remaining,Reset}-Tokens` for input tokens per minute and
//! `X-RateLimit-{Limit,Remaining}-Streams` for concurrent streams. When the limiter cannot be
//! read (Redis away under fail-closed) the answer goes without them rather than with guesses.
//!
//! An answer without a valid key (401, or 429 from the address brake) carries the spec's four
//! for the limit it was counted against: the client address's, under the tier
//! [`UNAUTHENTICATED_TIER`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use crds::config::Limits;

use crate::state::Gate;
use gateway_core::auth::Principal;
use gateway_core::limits::{AddressLimit, Snapshot};

pub async fn layer(State(state): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let Some(principal) = response.extensions().get::<Arc<Principal>>().cloned() else {
        return response;
    };
    let snapshot = match response.extensions().get::<Snapshot>() {
        Some(s) => *s,
        None => match state.limiter.snapshot(&principal.key.id).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "no rate-limit snapshot for headers");
                return response;
            }
        },
    };
    let limits = state.limiter.effective(&principal.limits);
    write(response.headers_mut(), &principal.tier, &limits, &snapshot);
    response
}

/// The X-RateLimit-Tier of answers counted against the client address, not a key.
pub const UNAUTHENTICATED_TIER: &str = "unauthenticated";

/// The headers of an answer counted against the client address's limit.
pub fn write_address(headers: &mut HeaderMap, standing: &AddressLimit) {
    write_requests(
        headers,
        UNAUTHENTICATED_TIER,
        standing.per_minute,
        &standing.snapshot,
    );
}

/// The spec's four: the tier and its request window.
fn write_requests(headers: &mut HeaderMap, tier: &str, per_minute: u32, s: &Snapshot) {
    let mut set = |name: &'static str, value: HeaderValue| {
        headers.insert(HeaderName::from_static(name), value);
    };
    if let Ok(tier) = HeaderValue::from_str(tier) {
        set("x-ratelimit-tier", tier);
    }
    set("x-ratelimit-limit-requests", per_minute.into());
    set(
        "x-ratelimit-remaining-requests",
        per_minute.saturating_sub(s.requests).into(),
    );
    set("x-ratelimit-reset-requests", s.reset_secs.into());
}

fn write(headers: &mut HeaderMap, tier: &str, limits: &Limits, s: &Snapshot) {
    write_requests(headers, tier, limits.requests_per_minute, s);
    let mut set = |name: &'static str, value: HeaderValue| {
        headers.insert(HeaderName::from_static(name), value);
    };
    set(
        "x-ratelimit-limit-tokens",
        limits.input_tokens_per_minute.into(),
    );
    set(
        "x-ratelimit-remaining-tokens",
        limits
            .input_tokens_per_minute
            .saturating_sub(s.input_tokens)
            .into(),
    );
    set("x-ratelimit-reset-tokens", s.reset_secs.into());
    set(
        "x-ratelimit-limit-streams",
        limits.concurrent_streams.into(),
    );
    set(
        "x-ratelimit-remaining-streams",
        limits.concurrent_streams.saturating_sub(s.streams).into(),
    );
}
