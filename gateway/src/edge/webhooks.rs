//! The payment webhooks: `POST /webhooks/payments` (the generic provider's `top_up.succeeded`)
//! and `POST /webhooks/stripe`. No API key: the signature over the raw body is the
//! authentication (`payments::signature`). A path whose provider is not configured is 404.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::body::RawBody;
use crate::error::ApiError;
use crate::payments::{stripe, webhook};
use crate::state::Webhooks;

pub async fn payments(
    State(state): State<Arc<Webhooks>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<Value>, ApiError> {
    let Some(secret) = state.payment_webhook_secret.as_deref() else {
        return Err(ApiError::not_found("no such path"));
    };
    let top_up = webhook::receive(&state.books, secret, &headers, &body).await?;
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
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<Value>, ApiError> {
    let Some(stripe) = state.payments.stripe.as_deref() else {
        return Err(ApiError::not_found("no such path"));
    };
    let (event, outcome) = stripe::webhook::receive(&state.books, stripe, &headers, &body).await?;
    Ok(Json(json!({
        "received": true,
        "id": event.id,
        "outcome": outcome,
    })))
}
