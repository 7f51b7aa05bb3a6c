//! `POST /webhooks/payments`: the payment provider confirms a top-up. No API key: the
//! signature over the raw body is the authentication. Body:
//! `{"type": "top_up.succeeded", "reference": "...", "account_id": "acct_...", "usd_cents": N}`
//! (other fields are ignored). A reference already confirmed is refused with 409 and changes
//! nothing, so a replayed delivery can never credit twice.

use std::net::IpAddr;

use http::HeaderMap;
use serde::Deserialize;

use super::signature;
use super::{confirm, Books, PaymentError, TopUpRequest};
use store::audit::{Actor, ActorKind};
use store::ledger::TopUp;

pub const SIGNATURE_HEADER: &str = "payment-signature";

/// The actor id of this webhook's audit rows (a payment webhook, though not Stripe's).
const TEST_PROVIDER: &str = "payment_webhook";

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    reference: String,
    account_id: String,
    usd_cents: u64,
}

/// Verifies a delivery signed with `secret` and confirms the top-up it announces: the top-up,
/// or [`PaymentError::Duplicate`] when its reference was confirmed already. `client` is the
/// sender's address, for the audit log.
pub async fn receive(
    books: &Books,
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    client: Option<IpAddr>,
) -> Result<TopUp, PaymentError> {
    signature::verify_delivery(secret, headers, SIGNATURE_HEADER, body)?;
    let event: Event =
        serde_json::from_slice(body).map_err(|e| PaymentError::Invalid(format!("body: {e}")))?;
    if event.kind != "top_up.succeeded" {
        return Err(PaymentError::Invalid(format!(
            "type: unsupported event `{}`; expected top_up.succeeded",
            event.kind
        )));
    }
    let request = TopUpRequest {
        account_id: &event.account_id,
        reference: &event.reference,
        usd_cents: event.usd_cents,
        payment_id: None,
        by: &Actor::new(
            ActorKind::StripeWebhook,
            TEST_PROVIDER,
            client.map(|ip| ip.to_string()),
        ),
    };
    let confirmation = confirm(
        books.accounts.as_ref(),
        books.ledger.as_ref(),
        books.credits_per_usd,
        request,
    )
    .await?;
    if !confirmation.first {
        return Err(PaymentError::Duplicate(event.reference));
    }
    Ok(confirmation.top_up)
}
