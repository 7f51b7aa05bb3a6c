//! `POST /webhooks/payments`: the payment provider confirms a top-up. No API key: the
//! signature over the raw body is the authentication. Body:
//! `{"type": "top_up.succeeded", "reference": "...", "account_id": "acct_...", "usd_cents": N}`
//! (other fields are ignored). A reference already confirmed is refused with 409 and changes
//! nothing, so a replayed delivery can never credit twice.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::signature;
use super::{confirm, PaymentError, TopUpRequest};
use crate::api::body::RawBody;
use crate::error::ApiError;
use crate::state::AppState;

pub const SIGNATURE_HEADER: &str = "payment-signature";

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    reference: String,
    account_id: String,
    usd_cents: u64,
}

pub async fn webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<Value>, ApiError> {
    let Some(secret) = state.payment_webhook_secret.as_deref() else {
        return Err(ApiError::not_found("no such path"));
    };
    signature::verify_delivery(secret, &headers, SIGNATURE_HEADER, &body)
        .map_err(PaymentError::from)?;
    let event: Event =
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("body: {e}")))?;
    if event.kind != "top_up.succeeded" {
        return Err(ApiError::invalid(format!(
            "type: unsupported event `{}`; expected top_up.succeeded",
            event.kind
        )));
    }
    let request = TopUpRequest {
        account_id: &event.account_id,
        reference: &event.reference,
        usd_cents: event.usd_cents,
        payment_id: None,
    };
    let confirmation = confirm(
        state.accounts.as_ref(),
        state.ledger.as_ref(),
        state.credits_per_usd,
        request,
    )
    .await?;
    if !confirmation.first {
        return Err(PaymentError::Duplicate(event.reference).into());
    }
    let top_up = confirmation.top_up;
    Ok(Json(json!({
        "received": true,
        "reference": top_up.reference,
        "account_id": top_up.account_id,
        "usd_cents": top_up.usd_cents,
        "credits": top_up.credits,
        "status": top_up.status,
    })))
}
