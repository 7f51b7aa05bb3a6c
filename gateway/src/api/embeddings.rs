//! `POST /v1/embeddings`: OpenAI's embeddings format (`wire::openai::embeddings`), served by
//! `gateway_core::turn::embeddings` on a route with `capabilities.embeddings`, billed per input
//! token through the same reservation and ledger as a turn.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::edge::body::JsonBody;
use crate::error::ApiError;
use crate::state::TurnApi;
use gateway_core::auth::Principal;
use gateway_core::ids;
use gateway_core::turn::embeddings::{self, EmbeddingsRequest};
use gateway_core::wire::openai::embeddings::{
    Embedding, EmbeddingsRequest as WireRequest, EmbeddingsResponse, EmbeddingsUsage, Vector,
};

pub async fn create(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    JsonBody(request): JsonBody<WireRequest>,
) -> Result<Response, ApiError> {
    let format = request.encoding_format.unwrap_or_default();
    let inputs = request.input.texts().map_err(ApiError::invalid)?;
    let done = embeddings::embed(
        &state.turns(),
        &principal,
        EmbeddingsRequest {
            id: ids::embedding(),
            model: request.model,
            inputs,
            dimensions: request.dimensions,
            user: request.user,
        },
    )
    .await?;
    let prompt_tokens = done.usage.tokens.input_tokens;
    let body = EmbeddingsResponse {
        object: "list",
        data: done
            .vectors
            .into_iter()
            .enumerate()
            .map(|(index, vector)| Embedding {
                object: "embedding",
                index,
                embedding: Vector::encode(vector, format),
            })
            .collect(),
        model: done.model,
        usage: EmbeddingsUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    };
    let mut response = Json(body).into_response();
    response.extensions_mut().insert(done.snapshot);
    Ok(response)
}
