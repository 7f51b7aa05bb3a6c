//! What a request's telemetry layer (`edge::request_telemetry`) and the model turn inside it
//! tell each other: the turn's message id and virtual model, for the request's span, its
//! `request-id` header and its counter.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// What a model turn tells the request around it: its message id and virtual model.
pub struct RequestContext {
    pub arrived: Instant,
    pub turn: OnceLock<(String, String)>,
}

tokio::task_local! {
    pub static CONTEXT: Arc<RequestContext>;
}
