//! `POST /webhooks/stripe`: Stripe's signed events. No API key: the `Stripe-Signature` header
//! (`t=...,v1=...`, several `v1` while the endpoint's secret is rolled) over the raw body is
//! the authentication, and a timestamp outside the tolerance is a replay.
//!
//! Every event is applied at most once whatever Stripe does (it retries, duplicates and
//! reorders deliveries, and two pods may get the same event at once), because what each one
//! does is keyed by what it is about, not by the delivery:
//! - a paid session credits its top-up reference once (`checkout.session.completed` with
//!   `payment_status: paid`, `checkout.session.async_payment_succeeded` or its PaymentIntent's
//!   `payment_intent.succeeded`, whichever comes first; the others find the reference
//!   credited); an auto-reload's `payment_intent.succeeded` credits its own reference;
//! - a refund carries the charge's refunded total, which only grows;
//! - a dispute moves money once per stage it reaches (see `ledger::DisputeStage`).
//!
//! A replay answers 200 (`"outcome": "already_applied"`), so Stripe stops retrying it. A
//! refund or dispute of a payment not credited yet answers 409, so Stripe delivers it again
//! later, after the payment.

use std::collections::HashMap;
use std::net::IpAddr;

use http::HeaderMap;

use super::events::{self, Charge, Dispute, Event, PaymentIntent, Session};
use super::Stripe;
use crate::payments::{confirm, signature, Books, PaymentError, TopUpRequest};
use store::audit::{Actor, ActorKind};
use store::developers::CheckoutStatus;
use store::ledger::DisputeStage;

pub const SIGNATURE_HEADER: &str = "stripe-signature";

/// Verifies a delivery with the endpoint's secret and applies its event: the event and what
/// became of it (`credited`, `already_applied`, `ignored`, ...). `client` is the sender's
/// address, for the audit log.
pub async fn receive(
    books: &Books,
    stripe: &Stripe,
    headers: &HeaderMap,
    body: &[u8],
    client: Option<IpAddr>,
) -> Result<(Event, &'static str), PaymentError> {
    signature::verify_delivery(&stripe.webhook_secret, headers, SIGNATURE_HEADER, body)?;
    let event: Event =
        serde_json::from_slice(body).map_err(|e| PaymentError::Invalid(format!("body: {e}")))?;
    let by = Actor::new(
        ActorKind::StripeWebhook,
        &event.id,
        client.map(|ip| ip.to_string()),
    );
    let outcome = apply(books, &event, &by).await?;
    tracing::info!(event = %event.id, kind = %event.kind, outcome, "stripe event");
    Ok((event, outcome))
}

async fn apply(state: &Books, event: &Event, by: &Actor) -> Result<&'static str, PaymentError> {
    match event.kind.as_str() {
        "checkout.session.completed" | "checkout.session.async_payment_succeeded" => {
            let session: Session = events::object(event).map_err(PaymentError::Invalid)?;
            // Paid later (bank debits): `async_payment_succeeded` follows.
            if session.payment_status != "paid" {
                return Ok("awaiting_payment");
            }
            credit(state, &session, by).await
        }
        "payment_intent.succeeded" => {
            let intent: PaymentIntent = events::object(event).map_err(PaymentError::Invalid)?;
            paid_intent(state, &intent, by).await
        }
        "checkout.session.async_payment_failed" | "checkout.session.expired" => {
            let session: Session = events::object(event).map_err(PaymentError::Invalid)?;
            let reference = field(&session.metadata, "reference")?;
            state
                .checkouts
                .set_checkout_status(reference, CheckoutStatus::Failed)
                .await?;
            Ok("checkout_failed")
        }
        "charge.refunded" => {
            let charge: Charge = events::object(event).map_err(PaymentError::Invalid)?;
            let payment = payment_intent(charge.payment_intent.as_deref())?;
            let reversal = state
                .ledger
                .refund(payment, charge.amount_refunded, by)
                .await?;
            Ok(reversal.map_or("already_applied", |_| "refunded"))
        }
        "charge.dispute.created" | "charge.dispute.closed" => {
            let dispute: Dispute = events::object(event).map_err(PaymentError::Invalid)?;
            let stage = match (event.kind.as_str(), dispute.status.as_str()) {
                ("charge.dispute.created", _) => DisputeStage::Opened,
                (_, "won" | "warning_closed") => DisputeStage::Won,
                (_, "lost") => DisputeStage::Lost,
                _ => return Ok("ignored"),
            };
            let payment = payment_intent(dispute.payment_intent.as_deref())?;
            let reversal = state
                .ledger
                .dispute(&dispute.id, payment, dispute.amount, stage, by)
                .await?;
            Ok(reversal.map_or("already_applied", |_| "disputed"))
        }
        // Stripe sends whatever the endpoint subscribes to; the rest is acknowledged.
        _ => Ok("ignored"),
    }
}

/// Credits a paid session's top-up, once per reference.
async fn credit(
    state: &Books,
    session: &Session,
    by: &Actor,
) -> Result<&'static str, PaymentError> {
    let usd_cents = session
        .amount_total
        .ok_or_else(|| PaymentError::Invalid("data.object.amount_total: missing".into()))?;
    let currency = session.currency.as_deref().unwrap_or_default();
    let payment = Paid {
        metadata: &session.metadata,
        usd_cents,
        currency,
        payment_id: session.payment_intent.as_deref(),
    };
    confirm_paid(state, payment, by).await
}

/// A PaymentIntent paid: the top-up it is for (a checkout's, already credited by its
/// session, or an auto-reload's), and the card it saved for auto-reload.
async fn paid_intent(
    state: &Books,
    intent: &PaymentIntent,
    by: &Actor,
) -> Result<&'static str, PaymentError> {
    if !intent.metadata.contains_key("reference") {
        // Not one of ours (another integration on the same Stripe account).
        return Ok("ignored");
    }
    let payment = Paid {
        metadata: &intent.metadata,
        usd_cents: intent.amount_received,
        currency: &intent.currency,
        payment_id: Some(&intent.id),
    };
    let outcome = confirm_paid(state, payment, by).await?;
    let saved = (
        intent.setup_future_usage.as_deref(),
        &intent.customer,
        &intent.payment_method,
    );
    if let (Some("off_session"), Some(customer), Some(method)) = saved {
        let account_id = field(&intent.metadata, "account_id")?;
        state
            .auto_reloads
            .save_card(account_id, customer, method)
            .await?;
    }
    Ok(outcome)
}

struct Paid<'a> {
    metadata: &'a HashMap<String, String>,
    usd_cents: u64,
    currency: &'a str,
    payment_id: Option<&'a str>,
}

async fn confirm_paid(
    state: &Books,
    paid: Paid<'_>,
    by: &Actor,
) -> Result<&'static str, PaymentError> {
    if !paid.currency.eq_ignore_ascii_case("usd") {
        return Err(PaymentError::Invalid(format!(
            "data.object.currency: top-ups are in usd, not `{}`",
            paid.currency
        )));
    }
    let request = TopUpRequest {
        account_id: field(paid.metadata, "account_id")?,
        reference: field(paid.metadata, "reference")?,
        usd_cents: paid.usd_cents,
        payment_id: paid.payment_id,
        by,
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

/// A metadata field the gateway set when it created the session or the charge.
fn field<'a>(metadata: &'a HashMap<String, String>, name: &str) -> Result<&'a str, PaymentError> {
    metadata
        .get(name)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            PaymentError::Invalid(format!(
                "data.object.metadata.{name}: missing; the session was not created by this gateway"
            ))
        })
}

fn payment_intent(id: Option<&str>) -> Result<&str, PaymentError> {
    id.ok_or_else(|| PaymentError::Invalid("data.object.payment_intent: missing".into()))
}
