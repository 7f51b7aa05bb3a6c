//! `POST /webhooks/stripe`: Stripe's signed events. No API key: the `Stripe-Signature` header
//! (`t=...,v1=...`, several `v1` while the endpoint's secret is rolled) over the raw body is
//! the authentication, and a timestamp outside the tolerance is a replay.
//!
//! Every event is applied at most once whatever Stripe does (it retries, duplicates and
//! reorders deliveries, and two pods may get the same event at once), because what each one
//! does is keyed by what it is about, not by the delivery:
//! - a paid session credits its top-up reference once (`checkout.session.completed` with
//!   `payment_status: paid`, or `checkout.session.async_payment_succeeded`, whichever comes
//!   first; the other finds the reference credited);
//! - a refund carries the charge's refunded total, which only grows;
//! - a dispute moves money once per stage it reaches (see `ledger::DisputeStage`).
//!
//! A replay answers 200 (`"outcome": "already_applied"`), so Stripe stops retrying it. A
//! refund or dispute of a payment not credited yet answers 409, so Stripe delivers it again
//! later, after the payment.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::events::{self, Charge, Dispute, Event, Session};
use crate::api::body::RawBody;
use crate::dashboard::CheckoutStatus;
use crate::error::ApiError;
use crate::ledger::DisputeStage;
use crate::payments::{confirm, signature, PaymentError, TopUpRequest};
use crate::state::AppState;

pub const SIGNATURE_HEADER: &str = "stripe-signature";

pub async fn webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<Value>, ApiError> {
    let Some(stripe) = state.payments.stripe() else {
        return Err(ApiError::not_found("no such path"));
    };
    signature::verify_delivery(&stripe.webhook_secret, &headers, SIGNATURE_HEADER, &body)
        .map_err(PaymentError::from)?;
    let event: Event =
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("body: {e}")))?;
    let outcome = apply(&state, &event).await?;
    tracing::info!(event = %event.id, kind = %event.kind, outcome, "stripe event");
    Ok(Json(json!({
        "received": true,
        "id": event.id,
        "outcome": outcome,
    })))
}

async fn apply(state: &AppState, event: &Event) -> Result<&'static str, ApiError> {
    match event.kind.as_str() {
        "checkout.session.completed" | "checkout.session.async_payment_succeeded" => {
            let session: Session = events::object(event).map_err(ApiError::invalid)?;
            // Paid later (bank debits): `async_payment_succeeded` follows.
            if session.payment_status != "paid" {
                return Ok("awaiting_payment");
            }
            credit(state, &session).await
        }
        "checkout.session.async_payment_failed" | "checkout.session.expired" => {
            let session: Session = events::object(event).map_err(ApiError::invalid)?;
            let reference = field(&session, "reference")?;
            state
                .developers
                .set_checkout_status(reference, CheckoutStatus::Failed)
                .await?;
            Ok("checkout_failed")
        }
        "charge.refunded" => {
            let charge: Charge = events::object(event).map_err(ApiError::invalid)?;
            let payment = payment_intent(charge.payment_intent.as_deref())?;
            let reversal = state.ledger.refund(payment, charge.amount_refunded).await?;
            Ok(reversal.map_or("already_applied", |_| "refunded"))
        }
        "charge.dispute.created" | "charge.dispute.closed" => {
            let dispute: Dispute = events::object(event).map_err(ApiError::invalid)?;
            let stage = match (event.kind.as_str(), dispute.status.as_str()) {
                ("charge.dispute.created", _) => DisputeStage::Opened,
                (_, "won" | "warning_closed") => DisputeStage::Won,
                (_, "lost") => DisputeStage::Lost,
                _ => return Ok("ignored"),
            };
            let payment = payment_intent(dispute.payment_intent.as_deref())?;
            let reversal = state
                .ledger
                .dispute(&dispute.id, payment, dispute.amount, stage)
                .await?;
            Ok(reversal.map_or("already_applied", |_| "disputed"))
        }
        // Stripe sends whatever the endpoint subscribes to; the rest is acknowledged.
        _ => Ok("ignored"),
    }
}

/// Credits a paid session's top-up, once per reference.
async fn credit(state: &AppState, session: &Session) -> Result<&'static str, ApiError> {
    let currency = session.currency.as_deref().unwrap_or_default();
    if !currency.eq_ignore_ascii_case("usd") {
        return Err(ApiError::invalid(format!(
            "data.object.currency: top-ups are in usd, not `{currency}`"
        )));
    }
    let usd_cents = session
        .amount_total
        .ok_or_else(|| ApiError::invalid("data.object.amount_total: missing"))?;
    let request = TopUpRequest {
        account_id: field(session, "account_id")?,
        reference: field(session, "reference")?,
        usd_cents,
        payment_id: session.payment_intent.as_deref(),
    };
    let confirmation = confirm(
        state.accounts.as_ref(),
        state.ledger.as_ref(),
        state.credits_per_usd,
        request,
    )
    .await?;
    Ok(if confirmation.first {
        "credited"
    } else {
        "already_applied"
    })
}

/// A metadata field the gateway set when it created the session.
fn field<'a>(session: &'a Session, name: &str) -> Result<&'a str, ApiError> {
    session
        .metadata
        .get(name)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "data.object.metadata.{name}: missing; the session was not created by this gateway"
            ))
        })
}

fn payment_intent(id: Option<&str>) -> Result<&str, ApiError> {
    id.ok_or_else(|| ApiError::invalid("data.object.payment_intent: missing"))
}
