//! `GET /v1/models` and `GET /v1/models/{id}`. One shape serves both SDKs: the Messages API's
//! list (`data`, `has_more`, `first_id`, `last_id`; `type`, `display_name`, `created_at`) and
//! the Chat Completions one (`object`, `created`, `owned_by`), plus the spec's limits.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use crate::edge::path::Path;
use crate::error::ApiError;
use crate::state::TurnApi;
use gateway_core::routing::Model;

/// The API's launch date (v0.1.0), the creation time reported for every virtual model.
const CREATED: i64 = 1_778_284_800;
const CREATED_AT: &str = "2026-05-09T00:00:00Z";

#[derive(Serialize)]
struct ModelRecord<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    object: &'static str,
    display_name: &'a str,
    created: i64,
    created_at: &'static str,
    owned_by: &'static str,
    context_window: u32,
    max_output_tokens: u32,
    capabilities: crds::config::Capabilities,
}

fn record(model: &Model) -> ModelRecord<'_> {
    ModelRecord {
        id: &model.id,
        kind: "model",
        object: "model",
        display_name: &model.config.display_name,
        created: CREATED,
        created_at: CREATED_AT,
        owned_by: "svc",
        context_window: model.config.context_window,
        max_output_tokens: model.config.max_output_tokens,
        capabilities: model.config.capabilities,
    }
}

pub async fn list(State(state): State<Arc<TurnApi>>) -> Json<Value> {
    let catalog = state.catalog();
    let data: Vec<ModelRecord> = catalog.models().map(|m| record(m)).collect();
    Json(json!({
        "object": "list",
        "api_version": crate::version::API_VERSION,
        "first_id": data.first().map(|m| m.id),
        "last_id": data.last().map(|m| m.id),
        "has_more": false,
        "data": data,
    }))
}

pub async fn get(
    State(state): State<Arc<TurnApi>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let catalog = state.catalog();
    let model = catalog
        .model(&id)
        .ok_or_else(|| ApiError::not_found(format!("model `{id}` does not exist")))?;
    Ok(Json(json!(record(model))))
}
