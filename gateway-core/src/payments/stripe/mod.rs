//! Stripe as the payment provider: a top-up is a Checkout Session the browser is sent to, and
//! the account is credited only when Stripe's signed webhook (`POST /webhooks/stripe`, see
//! [`webhook`]) says the session is paid. Refunds and disputes come through the same webhook.
//!
//! Configured by the API key and the webhook endpoint's signing secret, both or neither
//! ([`StripeSettings::from_args`]); the API base URL can point at a mock for tests.

mod api;
mod events;
pub mod reloads;
pub mod webhook;

use async_trait::async_trait;
use thiserror::Error;

pub use api::StripeError;

use super::provider::{CheckoutError, Order, PaymentProvider, Started};
use super::reload::{Due, Outcome};
use super::Books;
use api::{Api, CheckoutSession, PaymentIntent};

/// The name the line item carries on Stripe's payment page and the payer's receipt.
const LINE_ITEM: &str = "apiCredits top-up";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum StripeSettingsError {
    #[error("Stripe is half-configured: --stripe-api-key (GATEWAY_STRIPE_API_KEY) and --stripe-webhook-secret (GATEWAY_STRIPE_WEBHOOK_SECRET) go together; {0} is missing")]
    HalfConfigured(&'static str),
    #[error(
        "--stripe-webhook-secret must be the endpoint's signing secret, starting with `whsec_`"
    )]
    WebhookSecret,
    #[error("--stripe-api-base `{0}` is not an http(s) URL")]
    ApiBase(String),
    #[error("the Stripe API client could not be built: {0}")]
    Client(String),
}

pub struct StripeSettings<'a> {
    pub api_key: Option<&'a str>,
    pub webhook_secret: Option<&'a str>,
    pub api_base: &'a str,
}

pub struct Stripe {
    api: Api,
    webhook_secret: String,
}

impl StripeSettings<'_> {
    /// Stripe when both secrets are given, nothing when neither is; an error otherwise, so a
    /// gateway never starts taking payments it cannot confirm (or the reverse).
    pub fn build(&self) -> Result<Option<Stripe>, StripeSettingsError> {
        let (key, secret) = match (self.api_key, self.webhook_secret) {
            (None, None) => return Ok(None),
            (Some(_), None) => {
                return Err(StripeSettingsError::HalfConfigured("the webhook secret"))
            }
            (None, Some(_)) => return Err(StripeSettingsError::HalfConfigured("the API key")),
            (Some(key), Some(secret)) => (key, secret),
        };
        if !secret.starts_with("whsec_") {
            return Err(StripeSettingsError::WebhookSecret);
        }
        if !(self.api_base.starts_with("https://") || self.api_base.starts_with("http://")) {
            return Err(StripeSettingsError::ApiBase(self.api_base.to_owned()));
        }
        let api =
            Api::new(self.api_base, key).map_err(|e| StripeSettingsError::Client(e.to_string()))?;
        Ok(Some(Stripe {
            api,
            webhook_secret: secret.to_owned(),
        }))
    }
}

/// The form of `POST /v1/checkout/sessions` for `order`: one line item of the order's amount,
/// our reference as `client_reference_id` and in the metadata of the session and of its
/// PaymentIntent (with the account), and the billing page to come back to. Until the account
/// has a saved card, Stripe is asked to save this one for off-session charges (auto-reload).
fn session_form(order: &Order, save_card: bool) -> Vec<(String, String)> {
    let back = &order.return_url;
    let reference = &order.reference;
    let fields = [
        ("mode", "payment".to_owned()),
        ("client_reference_id", reference.clone()),
        ("success_url", format!("{back}?paid={reference}")),
        ("cancel_url", format!("{back}?cancelled={reference}")),
        ("line_items[0][quantity]", "1".to_owned()),
        ("line_items[0][price_data][currency]", "usd".to_owned()),
        (
            "line_items[0][price_data][unit_amount]",
            order.usd_cents.to_string(),
        ),
        (
            "line_items[0][price_data][product_data][name]",
            LINE_ITEM.to_owned(),
        ),
        ("metadata[account_id]", order.account_id.clone()),
        ("metadata[reference]", reference.clone()),
        (
            "payment_intent_data[metadata][account_id]",
            order.account_id.clone(),
        ),
        (
            "payment_intent_data[metadata][reference]",
            reference.clone(),
        ),
    ];
    let saving = [
        ("customer_creation", "always".to_owned()),
        (
            "payment_intent_data[setup_future_usage]",
            "off_session".to_owned(),
        ),
    ];
    let saving = if save_card { &saving[..] } else { &[] };
    fields
        .into_iter()
        .chain(saving.iter().cloned())
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// The form of the off-session `POST /v1/payment_intents` of an auto-reload.
fn reload_form(due: &Due) -> Vec<(String, String)> {
    [
        ("amount", due.usd_cents.to_string()),
        ("currency", "usd".to_owned()),
        ("customer", due.customer_id.clone()),
        ("payment_method", due.payment_method_id.clone()),
        ("off_session", "true".to_owned()),
        ("confirm", "true".to_owned()),
        ("metadata[account_id]", due.account_id.clone()),
        ("metadata[reference]", due.reference()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

impl Stripe {
    /// Charges an auto-reload to the saved card; the webhook's `payment_intent.succeeded`
    /// credits it. What the user is shown of a failure is ours, never Stripe's text.
    pub async fn charge(&self, due: &Due) -> Outcome {
        let charged: Result<PaymentIntent, StripeError> = self
            .api
            .post("payment_intents", &due.reference(), &reload_form(due))
            .await;
        match charged {
            Ok(intent) => {
                tracing::info!(payment_intent = %intent.id, "auto-reload charged");
                Outcome::Charged
            }
            Err(e @ StripeError::Refused { status, .. }) if status < 500 && status != 429 => {
                tracing::warn!(error = %e, "auto-reload charge refused");
                Outcome::Declined(format!(
                    "The saved card was declined ({}).",
                    e.code().unwrap_or("refused")
                ))
            }
            Err(e) => {
                tracing::warn!(error = %e, "auto-reload charge did not reach Stripe");
                Outcome::Unreachable(
                    "The payment provider could not be reached; the reload is retried.".to_owned(),
                )
            }
        }
    }
}

#[async_trait]
impl PaymentProvider for Stripe {
    async fn checkout(&self, books: &Books, order: &Order) -> Result<Started, CheckoutError> {
        let saved = books
            .auto_reloads
            .settings(&order.account_id)
            .await
            .map_err(CheckoutError::Store)?
            .card_saved;
        let session: CheckoutSession = self
            .api
            .post(
                "checkout/sessions",
                &order.reference,
                &session_form(order, !saved),
            )
            .await
            .map_err(|e| CheckoutError::Provider(Box::new(e)))?;
        Ok(Started::Redirect(session.url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config<'a>(key: Option<&'a str>, secret: Option<&'a str>) -> StripeSettings<'a> {
        StripeSettings {
            api_key: key,
            webhook_secret: secret,
            api_base: "https://api.stripe.com",
        }
    }

    #[test]
    fn stripe_needs_both_the_api_key_and_the_webhook_secret_or_neither() {
        assert!(matches!(config(None, None).build(), Ok(None)));
        assert!(matches!(
            config(Some("sk_test_1"), Some("whsec_1")).build(),
            Ok(Some(_))
        ));
        for half in [
            config(Some("sk_test_1"), None),
            config(None, Some("whsec_1")),
        ] {
            let error = half
                .build()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains("half-configured"), "{error}");
        }
        assert_eq!(
            config(Some("sk_test_1"), Some("not-a-whsec")).build().err(),
            Some(StripeSettingsError::WebhookSecret)
        );
    }

    #[test]
    fn a_session_names_the_amount_the_account_and_the_reference_and_comes_back_to_billing() {
        let form = session_form(
            &Order {
                reference: "pay_1".to_owned(),
                account_id: "acct_1".to_owned(),
                usd_cents: 2_500,
                return_url: "https://gw.example/developers/billing".to_owned(),
            },
            true,
        );
        let get = |k: &str| {
            form.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("line_items[0][price_data][unit_amount]"), Some("2500"));
        assert_eq!(get("metadata[account_id]"), Some("acct_1"));
        assert_eq!(get("client_reference_id"), Some("pay_1"));
        assert_eq!(
            get("payment_intent_data[setup_future_usage]"),
            Some("off_session")
        );
        assert_eq!(
            get("success_url"),
            Some("https://gw.example/developers/billing?paid=pay_1")
        );
    }
}
