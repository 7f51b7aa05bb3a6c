//! `POST /v1/messages/count_tokens`: the input token count of a request, free of charge but
//! counted against the key's requests per minute.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use crate::edge::body::JsonBody;
use crate::error::ApiError;
use crate::state::TurnApi;
use gateway_core::auth::Principal;
use gateway_core::limits::AdmissionRequest;
use gateway_core::validate;
use gateway_core::wire::anthropic::translate::request_from_count_tokens;
use gateway_core::wire::anthropic::CountTokensRequest;

pub async fn count(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    JsonBody(body): JsonBody<CountTokensRequest>,
) -> Result<Response, ApiError> {
    let request = request_from_count_tokens(body);
    let model = state
        .catalog()
        .model(&request.model)
        .cloned()
        .ok_or_else(|| ApiError::invalid(format!("model: unknown model `{}`", request.model)))?;
    validate::request(&request, &model.id, &model.config, true)?;
    let (_, input_tokens) = state.tokens.count_request_off_workers(request).await?;
    let admission = state
        .limiter
        .admit(
            &principal.key.id,
            &principal.limits,
            AdmissionRequest::counting(&principal.request_count),
        )
        .await?;
    let mut response = Json(json!({ "input_tokens": input_tokens })).into_response();
    response.extensions_mut().insert(admission.snapshot);
    Ok(response)
}
