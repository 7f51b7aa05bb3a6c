//! Payment providers: the dashboard's billing page starts a checkout through one; the account
//! is credited only when the provider's signed webhook confirms the payment. Chosen once at
//! start-up: Stripe when it is configured; otherwise the built-in test provider in standalone
//! mode, and none (checkouts refused with a clear message) in cluster mode.

use async_trait::async_trait;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use serde_json::json;
use thiserror::Error;
use time::OffsetDateTime;

use super::signature;
use super::stripe::{Stripe, StripeError};
use super::webhook::{webhook, SIGNATURE_HEADER};
use crate::accounts::StoreError;
use crate::api::body::RawBody;
use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Error)]
pub enum CheckoutError {
    #[error("top-ups are not available on this gateway yet: no payment provider is configured")]
    NoProvider,
    #[error("the payment provider's confirmation was refused: {}", .0.message)]
    Confirmation(ApiError),
    #[error(transparent)]
    Provider(StripeError),
    #[error(transparent)]
    Store(StoreError),
}

/// How a checkout went on.
#[derive(Debug, PartialEq, Eq)]
pub enum Started {
    /// Paid and confirmed already (the test provider).
    Paid,
    /// The payer continues on the provider's page at this URL.
    Redirect(String),
}

/// A top-up the user asked for, under a reference unique to it.
pub struct Order {
    pub reference: String,
    pub account_id: String,
    pub usd_cents: u64,
    /// The billing page's absolute URL, where the provider sends the payer back.
    pub return_url: String,
}

#[async_trait]
pub trait PaymentProvider: Send + Sync {
    /// Starts paying an order. The account is credited only by the webhook's confirmation.
    async fn checkout(&self, state: &AppState, order: &Order) -> Result<Started, CheckoutError>;

    /// The Stripe provider, whose webhook `POST /webhooks/stripe` serves.
    fn stripe(&self) -> Option<&Stripe> {
        None
    }
}

/// The test provider of standalone mode: every checkout is paid at once, and confirmed the
/// way a real provider would, by a `top_up.succeeded` event signed with the webhook secret
/// and handed to the webhook handler itself.
pub struct TestPayments;

#[async_trait]
impl PaymentProvider for TestPayments {
    async fn checkout(&self, state: &AppState, order: &Order) -> Result<Started, CheckoutError> {
        let secret = state
            .payment_webhook_secret
            .as_deref()
            .ok_or(CheckoutError::NoProvider)?;
        let body = json!({
            "type": "top_up.succeeded",
            "reference": order.reference,
            "account_id": order.account_id,
            "usd_cents": order.usd_cents,
        })
        .to_string();
        let header = signature::sign(
            secret,
            OffsetDateTime::now_utc().unix_timestamp(),
            body.as_bytes(),
        );
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&header)
            .map_err(|_| CheckoutError::Confirmation(ApiError::internal()))?;
        headers.insert(SIGNATURE_HEADER, value);
        webhook(State(state.clone()), headers, RawBody(body.into_bytes()))
            .await
            .map(|_| Started::Paid)
            .map_err(CheckoutError::Confirmation)
    }
}

/// No provider: checkouts are refused, nothing is charged.
pub struct NoPayments;

#[async_trait]
impl PaymentProvider for NoPayments {
    async fn checkout(&self, _: &AppState, _: &Order) -> Result<Started, CheckoutError> {
        Err(CheckoutError::NoProvider)
    }
}
