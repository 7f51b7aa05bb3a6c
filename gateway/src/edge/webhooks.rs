//! The payment webhooks: `POST /webhooks/payments` (the generic provider's `top_up.succeeded`)
//! and `POST /webhooks/stripe`. No API key: the signature over the raw body is the
//! authentication (`payments::signature`). A path whose provider is not configured is 404.
//! The signature header is checked (present, well formed, fresh) before the body is read, and
//! the body is read under the webhooks' small cap: an unsigned sender buffers nothing.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::body_reader::UnreadBody;
use crate::client_address::ClientAddress;
use crate::error::ApiError;
use crate::state::Webhooks;
use gateway_core::payments::{signature, stripe, webhook, PaymentError};

pub async fn payments(
    State(state): State<Arc<Webhooks>>,
    client: ClientAddress,
    headers: HeaderMap,
    body: UnreadBody,
) -> Result<Json<Value>, ApiError> {
    body.check_declared()?;
    let Some(secret) = state.payment_webhook_secret.as_deref() else {
        return Err(ApiError::not_found("no such path"));
    };
    let body = signed_body(&headers, webhook::SIGNATURE_HEADER, body).await?;
    let top_up = webhook::receive(&state.books, secret, &headers, &body, client.0).await?;
    Ok(Json(json!({
        "received": true,
        "reference": top_up.reference,
        "account_id": top_up.account_id,
        "usd_cents": top_up.usd_cents,
        "credits": top_up.credits,
        "status": top_up.status,
    })))
}

pub async fn stripe(
    State(state): State<Arc<Webhooks>>,
    client: ClientAddress,
    headers: HeaderMap,
    body: UnreadBody,
) -> Result<Json<Value>, ApiError> {
    body.check_declared()?;
    let Some(stripe) = state.payments.stripe.as_deref() else {
        return Err(ApiError::not_found("no such path"));
    };
    let body = signed_body(&headers, stripe::webhook::SIGNATURE_HEADER, body).await?;
    let (event, outcome) =
        stripe::webhook::receive(&state.books, stripe, &headers, &body, client.0).await?;
    Ok(Json(json!({
        "received": true,
        "id": event.id,
        "outcome": outcome,
    })))
}

/// The body of a delivery whose signature header `name` passes what can be checked without
/// it; the signature itself is verified over the body by the provider's module.
async fn signed_body(
    headers: &HeaderMap,
    name: &str,
    body: UnreadBody,
) -> Result<Vec<u8>, ApiError> {
    signature::check_header(headers, name).map_err(PaymentError::from)?;
    Ok(body.read().await?)
}
