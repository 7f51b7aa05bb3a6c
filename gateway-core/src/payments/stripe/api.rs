//! The calls the gateway makes to Stripe's HTTP API: form-encoded bodies, the secret key as a
//! bearer token, and an `Idempotency-Key` per order, so that a retried call (a timeout, a
//! second pod) creates nothing twice. Stripe's own error text is kept for the log only.

use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StripeError {
    #[error("Stripe could not be reached: {0}")]
    Unreachable(String),
    /// Stripe answered with its error object.
    #[error("Stripe refused the call ({status}, {kind}): {message}")]
    Refused {
        status: u16,
        kind: String,
        /// e.g. `card_declined`.
        code: Option<String>,
        message: String,
    },
    #[error("Stripe's answer could not be read: {0}")]
    Malformed(String),
}

impl StripeError {
    /// Stripe's `code` of a refused call (`card_declined`, ...).
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Refused { code, .. } => code.as_deref(),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorObject,
}

#[derive(Deserialize)]
struct ErrorObject {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: String,
}

/// A Checkout Session as created: where to send the browser.
#[derive(Debug, Deserialize)]
pub struct CheckoutSession {
    pub url: String,
}

/// A PaymentIntent as created (its outcome comes by the webhook).
#[derive(Debug, Deserialize)]
pub struct PaymentIntent {
    pub id: String,
}

pub struct Api {
    http: reqwest::Client,
    base: String,
    key: String,
}

/// How long one call to Stripe may take before the checkout is reported as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

impl Api {
    pub fn new(base: &str, key: &str) -> Result<Self, StripeError> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| StripeError::Unreachable(e.to_string()))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
        })
    }

    /// `POST /v1/<path>` with `form`, once per `idempotency_key`.
    pub async fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        idempotency_key: &str,
        form: &[(String, String)],
    ) -> Result<T, StripeError> {
        let response = self
            .http
            .post(format!("{}/v1/{path}", self.base))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", idempotency_key)
            .form(form)
            .send()
            .await
            .map_err(|e| StripeError::Unreachable(e.without_url().to_string()))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| StripeError::Unreachable(e.without_url().to_string()))?;
        if !status.is_success() {
            let error = serde_json::from_slice::<ErrorEnvelope>(&body)
                .map(|e| e.error)
                .map_err(|e| StripeError::Malformed(format!("{status}: {e}")))?;
            return Err(StripeError::Refused {
                status: status.as_u16(),
                kind: error.kind,
                code: error.code,
                message: error.message,
            });
        }
        serde_json::from_slice(&body).map_err(|e| StripeError::Malformed(e.to_string()))
    }
}
