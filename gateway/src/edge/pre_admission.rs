//! The request count of every model and count_tokens call. A key this process already knows
//! to be over its requests per minute (or with its minute's input tokens used up) is refused
//! before the body is read, parsed or tokenized, for the price of a map lookup
//! ([`Limiter::known_refusal`]). Otherwise the request is counted by its own admission (the
//! turn's, or count_tokens'), in the call that admits its tokens and stream slot; one that ends
//! before any admission counted it (an invalid body, an unknown model) is counted here, so
//! every request counts, valid or not.
//!
//! [`Limiter::known_refusal`]: gateway_core::limits::Limiter::known_refusal

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::body_reader;
use crate::error::ApiError;
use crate::state::Gate;
use gateway_core::auth::Principal;
use gateway_core::limits::{AdmissionRequest, LimitError};

pub async fn layer(State(state): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let Some(principal) = req.extensions().get::<Arc<Principal>>().cloned() else {
        // The auth layer runs first and always sets the principal; without one, nothing here
        // can be counted, and the handler refuses anyway.
        return next.run(req).await;
    };
    let key_id = &principal.key.id;
    if let Some(refusal) = state.limiter.known_refusal(key_id, &principal.limits) {
        // Read (and drop) what the client is still sending, within bounds, so that it can
        // read the 429 instead of a reset connection.
        body_reader::drain(req.into_body().into_data_stream()).await;
        return ApiError::from(refusal).into_response();
    }
    let mut response = next.run(req).await;
    if principal.request_count.take() {
        let counted = state
            .limiter
            .admit(key_id, &principal.limits, AdmissionRequest::REQUEST_ONLY)
            .await;
        // The answer stands (it was decided without this count); its headers show the count.
        let snapshot = match counted {
            Ok(admission) => Some(admission.snapshot),
            Err(LimitError::Exceeded { snapshot, .. }) => Some(snapshot),
            Err(LimitError::Unavailable(_)) => None,
        };
        if let Some(snapshot) = snapshot {
            response.extensions_mut().insert(snapshot);
        }
    }
    response
}

/// The request count of a Files or batch call that runs no turn of its own (an upload, a
/// download, a list), taken before its body is read or its store asked: a key over its
/// requests per minute is refused (429), as `/v1/messages` refuses it, on every pod. A batch
/// create's own admission then finds the count taken and admits nothing more for it.
pub async fn counted(State(state): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let Some(principal) = req.extensions().get::<Arc<Principal>>().cloned() else {
        return next.run(req).await;
    };
    let admitted = state
        .limiter
        .admit(
            &principal.key.id,
            &principal.limits,
            AdmissionRequest::counting(&principal.request_count),
        )
        .await;
    match admitted {
        Ok(admission) => {
            let mut response = next.run(req).await;
            response.extensions_mut().insert(admission.snapshot);
            response
        }
        Err(refusal) => {
            body_reader::drain(req.into_body().into_data_stream()).await;
            ApiError::from(refusal).into_response()
        }
    }
}
