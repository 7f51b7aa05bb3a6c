//! The request-count admission of every model and count_tokens call, right after
//! authentication and before the body is read, parsed or tokenized: a key over its requests
//! per minute (or with its minute's input tokens used up) is refused for the price of a
//! counter, whatever it sends, and every request it makes counts, valid or not.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::body_reader;
use crate::error::ApiError;
use crate::state::Gate;
use gateway_core::auth::Principal;
use gateway_core::limits::{AdmissionRequest, Snapshot};

pub async fn layer(State(state): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let Some(principal) = req.extensions().get::<Arc<Principal>>().cloned() else {
        // The auth layer runs first and always sets the principal; without one, nothing here
        // can be counted, and the handler refuses anyway.
        return next.run(req).await;
    };
    let admitted = state
        .limiter
        .admit(
            &principal.key.id,
            &principal.limits,
            AdmissionRequest::REQUEST_ONLY,
        )
        .await;
    match admitted {
        Ok(admission) => {
            let mut response = next.run(req).await;
            // The request count as this request was counted (concurrent ones counted later
            // must not show in its Remaining-Requests); the rest as the turn's admission saw
            // it, when there was one.
            let counted = admission.snapshot;
            let snapshot = match response.extensions().get::<Snapshot>() {
                Some(turn) => Snapshot {
                    requests: counted.requests,
                    ..*turn
                },
                None => counted,
            };
            response.extensions_mut().insert(snapshot);
            response
        }
        Err(e) => {
            // Read (and drop) what the client is still sending, within bounds, so that it can
            // read the 429 instead of a reset connection.
            body_reader::drain(req.into_body().into_data_stream()).await;
            ApiError::from(e).into_response()
        }
    }
}
