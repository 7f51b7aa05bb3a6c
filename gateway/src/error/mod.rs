//! The error envelope of the spec, and the one place where every typed error of the gateway
//! becomes a status, an `error.type` and a message. Internal detail (store errors, upstream
//! bodies) is logged here and never put in a response.
//!
//! The `From` conversions only say what an error is; what is recorded of it (the log line, the
//! 429 counter) happens once, when the response or stream event that carries it is made
//! ([`ApiError::record`]), so a conversion whose result is not sent records nothing.

use axum::extract::rejection::PathRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::api::files::error::FileError;
use crate::api::message_batches::error::BatchError;
use crate::api::storage::error::StorageError;
use crate::dashboard::error::DashboardError;
use crate::edge::body_reader::BodyError;
use crate::edge::budget::BudgetError;
use gateway_core::auth::AuthError;
use gateway_core::cpu::JobFailed;
use gateway_core::limits::{LimitError, Snapshot};
use gateway_core::payments::{CheckoutError, PaymentError};
use gateway_core::providers::ProviderError;
use gateway_core::responses_store::ResponseStoreError;
use gateway_core::telemetry::metrics;
use gateway_core::tokens::TokenError;
use gateway_core::turn::TurnError;
use gateway_core::usage_report::UsageError;
use gateway_core::validate;
use store::accounts::StoreError;
use store::ledger::LedgerError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    InvalidRequestError,
    AuthenticationError,
    InsufficientQuota,
    PermissionError,
    NotFoundError,
    RequestTooLarge,
    RateLimitError,
    ApiError,
    OverloadedError,
}

/// An error as the client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: ErrorType,
    pub message: String,
    pub retry_after_secs: Option<u64>,
    /// The limiter's counts that refused a 429, so that its X-RateLimit-* headers and its
    /// Retry-After come from one reading (boxed: it is rare, and errors travel in `Result`s).
    snapshot: Option<Box<Snapshot>>,
    record: Option<Record>,
}

/// What [`ApiError::record`] records of an error when it is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Record {
    /// A 429, counted by the limit that refused it: every 429 passes here, whichever endpoint
    /// admitted it.
    RateLimited(&'static str),
    /// Internal detail for the pod's log, never for the client.
    Log {
        level: Level,
        what: &'static str,
        detail: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Error,
    Warn,
    Debug,
}

#[derive(Serialize)]
pub struct Envelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: ErrorType,
    message: &'a str,
}

impl ApiError {
    fn new(status: StatusCode, kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            retry_after_secs: None,
            snapshot: None,
            record: None,
        }
    }

    /// The same error, with a line for the log when it is sent.
    fn logged(self, level: Level, what: &'static str, detail: Option<String>) -> Self {
        Self {
            record: Some(Record::Log {
                level,
                what,
                detail,
            }),
            ..self
        }
    }

    /// Records what the error's conversion noted (its log line, the 429 counter). Called once
    /// per error sent: by `into_response`, the stream events' builders, and the dashboard's
    /// pages, which render the message themselves.
    pub fn record(&self) {
        match &self.record {
            None => {}
            Some(Record::RateLimited(dimension)) => metrics::rate_limited(dimension),
            Some(Record::Log {
                level,
                what,
                detail: Some(detail),
            }) => match level {
                Level::Error => tracing::error!(error = %detail, "{what}"),
                Level::Warn => tracing::warn!(error = %detail, "{what}"),
                Level::Debug => tracing::debug!(error = %detail, "{what}"),
            },
            Some(Record::Log {
                level,
                what,
                detail: None,
            }) => match level {
                Level::Error => tracing::error!("{what}"),
                Level::Warn => tracing::warn!("{what}"),
                Level::Debug => tracing::debug!("{what}"),
            },
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            message,
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorType::NotFoundError, message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorType::InvalidRequestError,
            "method not allowed on this path",
        )
    }

    pub fn headers_too_large(limit_bytes: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorType::InvalidRequestError,
            format!("request headers exceed the {limit_bytes} byte limit"),
        )
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::ApiError,
            "internal error; retry with backoff",
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::ApiError,
            message,
        )
    }

    pub fn envelope(&self) -> Envelope<'_> {
        Envelope {
            kind: "error",
            error: Body {
                kind: self.kind,
                message: &self.message,
            },
        }
    }

    /// The envelope as JSON text, for SSE `error` events; the error is recorded as sent.
    pub fn envelope_json(&self) -> String {
        self.record();
        serde_json::to_string(&self.envelope()).unwrap_or_default()
    }

    /// The last event of a stream cut by the end of the shutdown grace period: the envelope
    /// and the stream's `usage` (the endpoint's usage object, `credits_consumed` included).
    pub fn interrupted_stream_json(usage: &impl Serialize) -> String {
        #[derive(Serialize)]
        struct Interrupted<'a, U> {
            #[serde(flatten)]
            envelope: Envelope<'a>,
            usage: U,
        }
        let error = Self::interrupted_stream();
        let event = Interrupted {
            envelope: error.envelope(),
            usage,
        };
        serde_json::to_string(&event).unwrap_or_default()
    }

    /// A stream cut by the end of the shutdown grace period. Its client was sent part of the
    /// answer and billed for it: a blind retry would pay for that part again.
    pub fn interrupted_stream() -> Self {
        Self::unavailable(
            "the server shut down before this response was finished: it ends here, billed for \
             the output sent so far (usage.credits_consumed); a new request is a new turn, \
             billed again",
        )
    }

    /// The `error` event of a Responses API stream: the envelope, plus the fields that stream's
    /// error event has (`code`, `message`, `param`, `sequence_number`).
    pub fn responses_stream_error(&self, sequence_number: u64) -> String {
        self.record();
        #[derive(Serialize)]
        struct StreamError<'a> {
            #[serde(flatten)]
            envelope: Envelope<'a>,
            code: ErrorType,
            message: &'a str,
            param: Option<&'a str>,
            sequence_number: u64,
        }
        serde_json::to_string(&StreamError {
            envelope: self.envelope(),
            code: self.kind,
            message: &self.message,
            param: None,
            sequence_number,
        })
        .unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.record();
        let mut response = (self.status, axum::Json(self.envelope())).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(snapshot) = self.snapshot {
            response.extensions_mut().insert(*snapshot);
        }
        response
    }
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge { .. }
            | BodyError::Budget(
                BudgetError::TooLarge { .. } | BudgetError::TooLargeForOne { .. },
            ) => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorType::RequestTooLarge,
                e.to_string(),
            ),
            // hyper then closes the connection, since the rest of the body was never read.
            BodyError::Timeout => Self::new(
                StatusCode::REQUEST_TIMEOUT,
                ErrorType::InvalidRequestError,
                e.to_string(),
            ),
            BodyError::Unreadable => Self::invalid(e.to_string()),
            BodyError::Budget(BudgetError::Busy { retry_after_secs }) => Self {
                retry_after_secs: Some(retry_after_secs),
                ..Self::unavailable(e.to_string())
            },
        }
    }
}

/// A path parameter that does not decode (`/v1/responses/%FF`): refused in the envelope, not
/// with axum's plain text.
impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        if e.status().is_server_error() {
            return Self::internal().logged(
                Level::Error,
                "a route's path parameters do not fit",
                Some(e.body_text()),
            );
        }
        Self::invalid(format!("path: {}", e.body_text()))
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing
            | AuthError::Malformed
            | AuthError::Invalid
            | AuthError::Expired(_) => Self::new(
                StatusCode::UNAUTHORIZED,
                ErrorType::AuthenticationError,
                e.to_string(),
            ),
            AuthError::CliKey | AuthError::Suspended | AuthError::Scope(_) => Self::new(
                StatusCode::FORBIDDEN,
                ErrorType::PermissionError,
                e.to_string(),
            ),
            AuthError::Store(inner) => inner.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(message) => Self::new(
                StatusCode::CONFLICT,
                ErrorType::InvalidRequestError,
                message,
            ),
            StoreError::Unavailable(detail) => Self {
                retry_after_secs: Some(STORE_RETRY_SECS),
                ..Self::unavailable("account service temporarily unavailable; retry with backoff")
            }
            .logged(Level::Error, "account store failed", Some(detail)),
        }
    }
}

impl From<ResponseStoreError> for ApiError {
    fn from(e: ResponseStoreError) -> Self {
        match e {
            ResponseStoreError::TooLarge { .. } => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorType::InvalidRequestError,
                format!("store: {e}; send `store: false` to get the response without storing it"),
            ),
            ResponseStoreError::Full => Self {
                retry_after_secs: Some(STORE_FULL_RETRY_SECS),
                ..Self::unavailable(format!(
                    "store: {e}; retry later, or send `store: false` to get the response without storing it"
                ))
            },
            ResponseStoreError::IdTaken(_) => Self::internal().logged(
                Level::Error,
                "a fresh response id was taken",
                Some(e.to_string()),
            ),
            ResponseStoreError::Unavailable(detail) => Self {
                retry_after_secs: Some(STORE_RETRY_SECS),
                ..Self::unavailable("stored responses temporarily unavailable; retry with backoff")
            }
            .logged(Level::Error, "response store failed", Some(detail)),
        }
    }
}

/// When to retry a store that failed (a database timeout or outage is usually short), and one
/// full of other accounts' responses (freed as they are deleted or expire).
const STORE_RETRY_SECS: u64 = 5;
const STORE_FULL_RETRY_SECS: u64 = 60;

/// When to retry while the limits' Redis does not answer: a failover or a slow moment lasts
/// seconds (docs/capacity.md).
const LIMITER_RETRY_SECS: u64 = 1;

/// When to retry a turn cut by this pod's shutdown: another pod serves it at once.
const SHUTDOWN_RETRY_SECS: u64 = 1;

impl From<LimitError> for ApiError {
    fn from(e: LimitError) -> Self {
        match e {
            LimitError::Exceeded {
                retry_after_secs,
                dimension,
                snapshot,
                ..
            } => Self {
                retry_after_secs: Some(retry_after_secs),
                snapshot: Some(Box::new(snapshot)),
                record: Some(Record::RateLimited(dimension.label())),
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorType::RateLimitError,
                    e.to_string(),
                )
            },
            // The outage itself is logged once, when the limiter switches policy.
            LimitError::Unavailable(detail) => Self {
                retry_after_secs: Some(LIMITER_RETRY_SECS),
                ..Self::unavailable("rate limiter temporarily unavailable; retry with backoff")
            }
            .logged(Level::Debug, "rate limiter unavailable", Some(detail)),
        }
    }
}

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::InsufficientCredits { needed, available } => Self::new(
                StatusCode::PAYMENT_REQUIRED,
                ErrorType::InsufficientQuota,
                format!(
                    "your apiCredits balance is too low for this turn: it may cost up to {needed} \
                     credits and {available} are available; top up at /developers/billing"
                ),
            ),
            LedgerError::SpendCapReached { cap, used, needed } => Self::new(
                StatusCode::PAYMENT_REQUIRED,
                ErrorType::InsufficientQuota,
                format!(
                    "this key's monthly spend cap of {cap} credits is reached: {used} credits are \
                     spent or held this month and this turn may cost up to {needed}; raise the \
                     key's cap at /developers/keys, or wait for the next month (UTC)"
                ),
            ),
            LedgerError::ReferenceConflict | LedgerError::TopUpMismatch => {
                Self::invalid(format!("reference: {e}"))
            }
            // A reversal that outran its payment's confirmation: the provider delivers again.
            LedgerError::UnknownPayment(_) => Self::new(
                StatusCode::CONFLICT,
                ErrorType::InvalidRequestError,
                format!("{e} yet; deliver the event again later"),
            ),
            LedgerError::UnknownAccount | LedgerError::UnknownMessage => {
                Self::internal().logged(Level::Error, "ledger inconsistency", Some(e.to_string()))
            }
            LedgerError::Unavailable(detail) | LedgerError::Refused(detail) => Self {
                retry_after_secs: Some(STORE_RETRY_SECS),
                ..Self::unavailable("billing temporarily unavailable; retry with backoff")
            }
            .logged(Level::Error, "ledger unavailable", Some(detail)),
        }
    }
}

impl From<PaymentError> for ApiError {
    fn from(e: PaymentError) -> Self {
        match e {
            PaymentError::Amount(_) | PaymentError::EmptyReference | PaymentError::Invalid(_) => {
                Self::invalid(e.to_string())
            }
            PaymentError::UnknownAccount(_) => Self::not_found(e.to_string()),
            PaymentError::Duplicate(_) => Self::new(
                StatusCode::CONFLICT,
                ErrorType::InvalidRequestError,
                e.to_string(),
            ),
            PaymentError::Signature(_) => Self::new(
                StatusCode::UNAUTHORIZED,
                ErrorType::AuthenticationError,
                e.to_string(),
            ),
            PaymentError::Ledger(inner) => inner.into(),
            PaymentError::Store(inner) => inner.into(),
        }
    }
}

impl From<ProviderError> for ApiError {
    fn from(e: ProviderError) -> Self {
        let detail = Some(e.to_string());
        let error = match e {
            ProviderError::Rejected(message) => Self::invalid(message),
            ProviderError::Upstream => Self::new(
                StatusCode::BAD_GATEWAY,
                ErrorType::ApiError,
                "the upstream model returned an error; retry with backoff",
            ),
            ProviderError::Timeout => Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                ErrorType::ApiError,
                "the upstream model timed out; retry with backoff or lower max_tokens",
            ),
            ProviderError::Overloaded { .. } => Self::new(
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                ErrorType::OverloadedError,
                "the model is overloaded; retry with backoff",
            ),
            ProviderError::Unavailable => {
                Self::unavailable("the model is temporarily unavailable; retry with backoff")
            }
            ProviderError::ShuttingDown => Self {
                retry_after_secs: Some(SHUTDOWN_RETRY_SECS),
                ..Self::unavailable(
                    "the server is shutting down; retry the request, another instance will serve it",
                )
            },
        };
        error.logged(Level::Warn, "upstream call failed", detail)
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Job(inner) => inner.into(),
            e => Self::invalid(e.to_string()),
        }
    }
}

/// When to retry a batch refused for the key's cap: batches take minutes to hours.
const BATCH_CAP_RETRY_SECS: u64 = 60;

impl From<BatchError> for ApiError {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::NotFound(_) => Self::not_found(e.to_string()),
            BatchError::TooManyInProgress(_) | BatchError::TooManyQueuedItems(..) => Self {
                retry_after_secs: Some(BATCH_CAP_RETRY_SECS),
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorType::RateLimitError,
                    e.to_string(),
                )
            },
            BatchError::Processing(..) => Self::invalid(e.to_string()),
        }
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::NotFound(_) => Self::not_found(e.to_string()),
            FileError::Purpose(_)
            | FileError::Multipart(_)
            | FileError::NotJsonl { .. }
            | FileError::ExpiresAfter(_)
            | FileError::FilenameTooLong { .. }
            | FileError::InUse(_) => Self::invalid(e.to_string()),
        }
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::NoCredits => Self::new(
                StatusCode::PAYMENT_REQUIRED,
                ErrorType::InsufficientQuota,
                e.to_string(),
            ),
            StorageError::Quota(_) => Self::invalid(e.to_string()),
        }
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        match e {
            TurnError::Invalid(message) => Self::invalid(message),
            TurnError::Validation(e) => e.into(),
            TurnError::Tokens(e) => e.into(),
            TurnError::Limit(e) => e.into(),
            TurnError::Ledger(e) => e.into(),
            TurnError::Provider(e) => e.into(),
            TurnError::Unfinished => Self::internal(),
        }
    }
}

impl From<UsageError> for ApiError {
    fn from(e: UsageError) -> Self {
        match e {
            UsageError::Invalid(message) => Self::invalid(message),
            UsageError::Ledger(e) => e.into(),
        }
    }
}

impl From<validate::Invalid> for ApiError {
    fn from(e: validate::Invalid) -> Self {
        Self::invalid(e.0)
    }
}

impl From<JobFailed> for ApiError {
    fn from(_: JobFailed) -> Self {
        Self::internal()
    }
}

impl From<DashboardError> for ApiError {
    fn from(e: DashboardError) -> Self {
        match e {
            DashboardError::Csrf => Self::new(
                StatusCode::FORBIDDEN,
                ErrorType::PermissionError,
                e.to_string(),
            ),
            DashboardError::BadForm | DashboardError::NulInForm => Self::invalid(e.to_string()),
            DashboardError::Body(inner) => inner.into(),
            DashboardError::NotFound => Self::not_found(e.to_string()),
            DashboardError::PasswordHash => {
                Self::internal().logged(Level::Error, "password hashing failed", None)
            }
            DashboardError::Store(inner) => inner.into(),
            DashboardError::Ledger(inner) => inner.into(),
            DashboardError::Usage(inner) => inner.into(),
            DashboardError::Limit(inner) => inner.into(),
        }
    }
}

impl From<CheckoutError> for ApiError {
    fn from(e: CheckoutError) -> Self {
        match e {
            CheckoutError::NoProvider => Self::unavailable(e.to_string()),
            CheckoutError::Confirmation(inner) => Self::new(
                StatusCode::BAD_GATEWAY,
                ErrorType::ApiError,
                "the payment could not be completed and nothing was charged; please try again",
            )
            .logged(Level::Warn, "payment confirmation refused", Some(inner.to_string())),
            CheckoutError::Store(inner) => inner.into(),
            // Stripe's own text (its error objects, its host) stays in the log.
            CheckoutError::Provider(inner) => Self::new(
                StatusCode::BAD_GATEWAY,
                ErrorType::ApiError,
                "the checkout could not be started and nothing was charged; please try again in a minute",
            )
            .logged(Level::Warn, "the payment provider refused a checkout", Some(inner.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::limits::Dimension;

    fn sign_up_429s() -> u64 {
        let rendered = metrics::render();
        rendered
            .lines()
            .find_map(|line| {
                line.strip_prefix(r#"gateway_rate_limited_total{dimension="sign_ups"} "#)
            })
            .map_or(0, |n| n.trim().parse().unwrap_or(0))
    }

    #[test]
    fn a_429_is_counted_once_when_it_is_sent_not_when_it_is_converted() {
        let before = sign_up_429s();
        let refusal = ApiError::from(LimitError::Exceeded {
            dimension: Dimension::SignUps,
            limit: 1,
            retry_after_secs: 60,
            snapshot: Snapshot::default(),
        });
        assert_eq!(sign_up_429s(), before, "converting counted it");
        let response = refusal.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(sign_up_429s(), before + 1);
    }

    #[test]
    fn a_429_carries_the_counts_that_refused_it_so_its_headers_and_retry_after_agree() {
        let counts = Snapshot {
            requests: 5,
            input_tokens: 0,
            streams: 0,
            reset_secs: 58,
        };
        let response = ApiError::from(LimitError::Exceeded {
            dimension: Dimension::Requests,
            limit: 5,
            retry_after_secs: counts.reset_secs,
            snapshot: counts,
        })
        .into_response();
        assert_eq!(response.extensions().get::<Snapshot>(), Some(&counts));
        assert_eq!(response.headers()[header::RETRY_AFTER], "58");
    }

    #[test]
    fn the_ledger_says_what_happened_and_the_edge_says_where_to_go_about_it() {
        let short = LedgerError::InsufficientCredits {
            needed: 30,
            available: 7,
        };
        assert!(!short.to_string().contains("/developers"), "{short}");
        let refusal = ApiError::from(short);
        assert_eq!(refusal.status, StatusCode::PAYMENT_REQUIRED);
        assert!(
            refusal.message.ends_with("top up at /developers/billing"),
            "{}",
            refusal.message
        );
        let capped = ApiError::from(LedgerError::SpendCapReached {
            cap: 100,
            used: 90,
            needed: 30,
        });
        assert!(
            capped
                .message
                .contains("raise the key's cap at /developers/keys"),
            "{}",
            capped.message
        );
    }
}
