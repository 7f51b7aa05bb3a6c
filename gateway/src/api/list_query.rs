//! The query string of a `/v1` endpoint that takes one: read from the URI so that a bad query
//! is the envelope's 400 (axum's own rejection is plain text), and a list's `limit` checked
//! against the endpoint's bounds.

use axum::extract::Query;
use axum::http::Uri;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// The request's query as `Q`; 400 in the envelope when it does not parse.
pub fn parse<Q: DeserializeOwned>(uri: &Uri) -> Result<Q, ApiError> {
    Query::<Q>::try_from_uri(uri)
        .map(|Query(query)| query)
        .map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))
}

/// A list's page size: `default` when absent, 400 outside 1 to `max`.
pub fn limit(limit: Option<u32>, default: u32, max: u32) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::invalid(format!(
            "limit: must be between 1 and {max}"
        )))
    }
}
