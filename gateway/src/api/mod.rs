//! The public `/v1` API: routes, and the layers every request passes (each surface's body cap
//! and the body memory budget, auth, rate-limit headers, panic guard). Every non-2xx leaves as the spec's error envelope; under
//! `/v1` even unknown paths and wrong methods need a key, like every `/v1/*` request.

mod account;
pub mod batches;
mod chat;
mod count_tokens;
mod embeddings;
pub mod files;
mod list_query;
pub mod message_batches;
mod messages;
mod models;
mod responses;
mod sse;
pub mod storage;
pub mod usage;

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef, Request};
use axum::http::HeaderValue;
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use tower::{Service, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::client_address::TrustedProxies;
use crate::edge::body_reader::{BodyCap, BodyDeadline};
use crate::edge::{
    authenticate, budget, pre_admission, rate_limit_headers, request_telemetry, webhooks,
};
use crate::error::ApiError;
use crate::state::AppState;
use crate::{dashboard, version};

/// A finished HTTP service as the listeners serve it: the public API, the admin API and the
/// probes. Named once so the routers and `serve` state the same bound.
pub trait HttpService:
    Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> HttpService for S where
    S: Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// The public listener's service: the routes under the layers every request passes.
///
/// Each stack of layers wraps its router once, as a service, rather than through
/// `Router::layer`, which wraps every route in a boxed service per layer: a request then cloned
/// a chain of boxes at each layer it passed (127 of a proxied turn's 524 allocations,
/// docs/benchmarks-history.md, "Where a turn's allocations go").
pub fn service(state: AppState, deadline: BodyDeadline) -> impl HttpService {
    let proxies = Arc::<TrustedProxies>::from_ref(&state);
    let routes = Router::new()
        .nest_service("/v1", v1(state.clone()))
        .merge(
            dashboard::router()
                .layer(Extension(BodyCap::FORM))
                .layer(axum::middleware::from_fn(header_limit)),
        )
        .route(
            "/webhooks/payments",
            post(webhooks::payments)
                .layer(Extension(BodyCap::WEBHOOK))
                .layer(axum::middleware::from_fn(header_limit)),
        )
        .route(
            "/webhooks/stripe",
            post(webhooks::stripe)
                .layer(Extension(BodyCap::WEBHOOK))
                .layer(axum::middleware::from_fn(header_limit)),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state);
    ServiceBuilder::new()
        .layer(Extension(deadline))
        .layer(axum::middleware::from_fn(request_telemetry::layer))
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("handler panicked");
            ApiError::internal().into_response()
        }))
        .layer(axum::middleware::from_fn(no_nul_in_url))
        .layer(axum::middleware::from_fn(budget::hold))
        .layer(from_fn_with_state(proxies, budget::address))
        // Every body is read by `edge::body_reader`; should one of axum's own extractors ever
        // read one, it gets the smallest cap.
        .layer(DefaultBodyLimit::max(BodyCap::FORM.0))
        .service(routes)
}

/// `/v1`: every request needs a key, unknown paths and wrong methods too.
fn v1(state: AppState) -> impl HttpService {
    // Model and count_tokens calls count against RPM before their body is read (the auth
    // layer, outside the router, has run already).
    let admitted = |handler: axum::routing::MethodRouter<AppState>| {
        handler.layer(from_fn_with_state(state.clone(), pre_admission::layer))
    };
    // Uploads, downloads and lists of files and batches run no turn: each is counted against
    // RPM before its body is read or its store asked. Retrieving, cancelling or deleting one
    // batch or file (what a client polls) is not.
    let counted = |handler: axum::routing::MethodRouter<AppState>| {
        handler.layer(from_fn_with_state(state.clone(), pre_admission::counted))
    };
    let routes = Router::new()
        .route("/messages", admitted(post(messages::create)))
        .route(
            "/messages/count_tokens",
            admitted(post(count_tokens::count)),
        )
        .route(
            "/messages/batches",
            admitted(post(message_batches::create).layer(Extension(BodyCap::BATCH)))
                .merge(counted(get(message_batches::list))),
        )
        .route(
            "/messages/batches/{id}",
            get(message_batches::get).delete(message_batches::delete),
        )
        .route(
            "/messages/batches/{id}/cancel",
            post(message_batches::cancel),
        )
        .route(
            "/messages/batches/{id}/results",
            counted(get(message_batches::results)),
        )
        .route(
            "/batches",
            admitted(post(batches::create)).merge(counted(get(batches::list))),
        )
        .route("/batches/{id}", get(batches::get))
        .route("/batches/{id}/cancel", post(batches::cancel))
        .route("/files", counted(post(files::upload).get(files::list)))
        .route("/files/{id}", get(files::get).delete(files::delete))
        .route("/files/{id}/content", counted(get(files::content)))
        .route("/chat/completions", admitted(post(chat::create)))
        .route("/embeddings", admitted(post(embeddings::create)))
        .route("/responses", admitted(post(responses::create)))
        .route(
            "/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/responses/{id}/input_items", get(responses::input_items))
        .route("/models", get(models::list))
        .route("/models/{*id}", get(models::get))
        .route("/account", get(account::get))
        .route("/usage", get(usage::get))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state.clone());
    ServiceBuilder::new()
        .layer(SetResponseHeaderLayer::overriding(
            version::HEADER,
            HeaderValue::from_static(version::API_VERSION),
        ))
        .layer(from_fn_with_state(state.clone(), rate_limit_headers::layer))
        .layer(from_fn_with_state(state, authenticate::layer))
        // After the key, so that the 431 carries the key's rate-limit headers as every `/v1`
        // answer does (the spec); the headers were read by then whatever their size.
        .layer(axum::middleware::from_fn(header_limit))
        .layer(Extension(BodyCap::API))
        .service(routes)
}

/// The largest request header block answered normally; above it, 431 in the envelope (under
/// `/v1` once the key is known, with its rate-limit headers; on the dashboard and webhook
/// routes at once). hyper itself cuts far larger blocks (past its read buffer, about 400 KiB)
/// with a bare 431 before any of this runs.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

async fn header_limit(req: Request, next: axum::middleware::Next) -> Response {
    let size: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if size > MAX_HEADER_BYTES {
        return ApiError::headers_too_large(MAX_HEADER_BYTES).into_response();
    }
    next.run(req).await
}

/// A URL whose path or query decodes to a NUL byte is refused (400) before any handler runs:
/// an id or a query value carrying one would reach Postgres, which refuses the byte in text
/// (an error that reads as an outage, 503, when it is the request's fault).
async fn no_nul_in_url(req: Request, next: axum::middleware::Next) -> Response {
    let nul = req
        .uri()
        .path_and_query()
        .is_some_and(|p| p.as_str().as_bytes().windows(3).any(|w| w == b"%00"));
    if nul {
        return ApiError::invalid(
            "the URL holds a NUL byte (`%00`), which no id or query value may",
        )
        .into_response();
    }
    next.run(req).await
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("no such path")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
