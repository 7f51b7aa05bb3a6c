//! Payment providers: the dashboard's billing page starts a checkout through one; the account
//! is credited only when the provider's signed webhook confirms the payment. Chosen once at
//! start-up: Stripe when it is configured; otherwise the built-in test provider in standalone
//! mode, and none (checkouts refused with a clear message) in cluster mode.

use async_trait::async_trait;
use http::{HeaderMap, HeaderValue};
use serde_json::json;
use thiserror::Error;
use time::OffsetDateTime;

use super::webhook::{receive, SIGNATURE_HEADER};
use super::{signature, Books, PaymentError};
use store::accounts::StoreError;

#[derive(Debug, Error)]
pub enum CheckoutError {
    #[error("top-ups are not available on this gateway yet: no payment provider is configured")]
    NoProvider,
    #[error("the payment provider's confirmation was refused: {0}")]
    Confirmation(PaymentError),
    /// The provider refused or could not be reached; its own words stay in the log.
    #[error(transparent)]
    Provider(Box<dyn std::error::Error + Send + Sync>),
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
    async fn checkout(&self, books: &Books, order: &Order) -> Result<Started, CheckoutError>;
}

/// The test provider of standalone mode: every checkout is paid at once, and confirmed the
/// way a real provider would, by a `top_up.succeeded` event signed with the webhook secret
/// (`--payment-webhook-secret`; none: checkouts are refused) and received as the webhook
/// receives it.
pub struct TestPayments {
    pub webhook_secret: Option<String>,
}

#[async_trait]
impl PaymentProvider for TestPayments {
    async fn checkout(&self, books: &Books, order: &Order) -> Result<Started, CheckoutError> {
        let secret = self
            .webhook_secret
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
        let value = HeaderValue::from_str(&header).map_err(|_| {
            CheckoutError::Confirmation(PaymentError::Invalid("unsendable signature".into()))
        })?;
        headers.insert(SIGNATURE_HEADER, value);
        receive(books, secret, &headers, body.as_bytes(), None)
            .await
            .map(|_| Started::Paid)
            .map_err(CheckoutError::Confirmation)
    }
}

/// No provider: checkouts are refused, nothing is charged.
pub struct NoPayments;

#[async_trait]
impl PaymentProvider for NoPayments {
    async fn checkout(&self, _: &Books, _: &Order) -> Result<Started, CheckoutError> {
        Err(CheckoutError::NoProvider)
    }
}
