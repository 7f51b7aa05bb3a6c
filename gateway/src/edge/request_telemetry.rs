//! The layer every public request passes first: one tracing span per request (the parent of
//! the turn's spans, continuing the caller's W3C trace context), the `request-id` response
//! header, and the request counter.
//!
//! `request-id` is the id of the message the request created (`msg_…` or `chatcmpl_…`, the
//! same id the body and the ledger carry) once a model turn began; otherwise a fresh `req_…`
//! id, also recorded on the span, so that every answer can be found in the traces.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::Status;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use gateway_core::auth::Principal;
use gateway_core::ids;
use gateway_core::telemetry::request::{RequestContext, CONTEXT};
use gateway_core::telemetry::{metrics, propagation};

const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

pub async fn layer(req: Request, next: Next) -> Response {
    let endpoint = endpoint(req.uri().path());
    let method = req.method().clone();
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{method} {endpoint}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = endpoint,
    );
    // Without an exporter there is no OpenTelemetry layer to take the parent; nothing to do.
    let _ = span.set_parent(propagation::extract(req.headers()));
    let context = Arc::new(RequestContext {
        arrived: Instant::now(),
        turn: OnceLock::new(),
    });
    let mut response = CONTEXT
        .scope(context.clone(), next.run(req))
        .instrument(span.clone())
        .await;

    let status = response.status();
    span.set_attribute("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.set_status(Status::error(status.canonical_reason().unwrap_or("")));
    }
    if let Some(principal) = response.extensions().get::<Arc<Principal>>() {
        span.set_attribute("svc.key_id", principal.key.id.clone());
        span.set_attribute("svc.tier", principal.tier.clone());
    }
    let (request_id, model) = match context.turn.get() {
        Some((id, model)) => (id.clone(), model.as_str()),
        None => {
            let id = ids::request();
            span.set_attribute("svc.request_id", id.clone());
            (id, "")
        }
    };
    metrics::request(endpoint, model, status.as_u16());
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

/// The route a path belongs to, so that labels and span names stay a small fixed set.
fn endpoint(path: &str) -> &'static str {
    match path {
        "/v1/messages" => "/v1/messages",
        "/v1/messages/count_tokens" => "/v1/messages/count_tokens",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/embeddings" => "/v1/embeddings",
        "/v1/models" => "/v1/models",
        "/v1/account" => "/v1/account",
        "/v1/usage" => "/v1/usage",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        _ => "other",
    }
}
