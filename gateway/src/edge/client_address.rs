//! The client address as an extractor: the peer of the connection, or what trusted proxies
//! say it is ([`TrustedProxies`](crate::client_address::TrustedProxies)).

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::client_address::ClientAddress;
use crate::state::AppState;

impl FromRequestParts<AppState> for ClientAddress {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self::of(
            &state.settings.trusted_proxies,
            &parts.extensions,
            &parts.headers,
        ))
    }
}
