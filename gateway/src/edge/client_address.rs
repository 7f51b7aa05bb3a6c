//! The client address as an extractor: the peer of the connection, or what trusted proxies
//! say it is ([`TrustedProxies`](crate::client_address::TrustedProxies)).

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;

use crate::client_address::{ClientAddress, TrustedProxies};

impl<S> FromRequestParts<S> for ClientAddress
where
    S: Send + Sync,
    Arc<TrustedProxies>: FromRef<S>,
{
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self::of(
            &Arc::<TrustedProxies>::from_ref(state),
            &parts.extensions,
            &parts.headers,
        ))
    }
}
