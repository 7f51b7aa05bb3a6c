//! `/v1/messages/batches`: Anthropic's Message Batches API, as its SDKs call it. A batch is
//! checked and stored whole (`store::batches`); the workers every process runs
//! ([`worker`]) run its items through the same turn as `/v1/messages`, and its results are
//! streamed back as JSONL once every item has ended.

pub mod error;
pub mod requests;
pub mod settings;
pub mod worker;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use self::error::BatchError;
use self::requests::Index;
pub use self::settings::BatchSettings;
use super::list_query;
use super::storage::{self, StorageError};
use crate::edge::body::require_json;
use crate::edge::body_reader::{read_reserved, BodyError};
use crate::edge::path::Path;
use crate::error::ApiError;
use crate::state::BatchApi;
use gateway_core::auth::Principal;
use gateway_core::cpu;
use gateway_core::limits::AdmissionRequest;
use store::accounts::StoreError;
use store::batches::{
    Batch, BatchStore, CapReached, Cursor, Deleted, ItemResult, KeyCaps, NewBatch,
    ProcessingStatus, RequestFormat,
};
use store::ids::random;

/// Batches in a page of the list: the default, and the most.
const DEFAULT_PAGE: u32 = 20;
const MAX_PAGE: u32 = 1_000;
/// Results read from the store per chunk of the JSONL stream.
const RESULTS_PER_CHUNK: u32 = 500;

/// `POST /v1/messages/batches`: every request is checked as `/v1/messages` checks it; one
/// that fails ends `errored` with its envelope at once, the others are queued. The body is read
/// as bytes under the batch cap ([`crate::edge::body_reader::BodyCap::BATCH`]) and indexed, its
/// requests parsed one at a time ([`requests`]).
pub async fn create(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    req: Request,
) -> Result<Response, ApiError> {
    require_json(req.headers())?;
    storage::require_credits(&api, &principal).await?;
    let (body, mut reservation) = read_reserved(req).await?;
    let body = Arc::new(body);
    let max = api.settings.max_requests;
    let index = {
        let body = body.clone();
        cpu::run(move || Index::of(&body, max)).await??
    };
    // The create is a request against the key's requests per minute, counted before its
    // items are checked or stored: a key over its minute creates no batch, on whichever pod.
    let admission = api
        .turns
        .limiter
        .admit(
            &principal.key.id,
            &principal.limits,
            AdmissionRequest::counting(&principal.request_count),
        )
        .await?;
    reservation
        .grow_to_cost(body.len(), index.cost(&body))
        .await
        .map_err(BodyError::from)?;
    let turns = api.turns.turns();
    let items = cpu::run(move || index.items(&turns, &body)).await?;
    let created_at = OffsetDateTime::now_utc();
    let batch = NewBatch {
        id: format!("msgbatch_{}", random(24)),
        account_id: principal.account.id.clone(),
        key_id: principal.key.id.clone(),
        key_hash: principal.key.hash,
        created_at,
        expires_at: created_at + api.settings.expiry,
        format: RequestFormat::Messages,
        details: None,
        items,
    };
    let created = create_within_caps(&api, batch).await?;
    drop(reservation);
    let mut response = Json(object(&created)).into_response();
    response.extensions_mut().insert(admission.snapshot);
    Ok(response)
}

/// Stores a new batch of either API unless it would pass one of its key's caps: those of its
/// ApiKey grant where it sets them, else the flags'.
pub async fn create_within_caps(api: &BatchApi, batch: NewBatch) -> Result<Batch, ApiError> {
    let granted = api
        .turns
        .turns()
        .catalog
        .grant(&batch.key_id)
        .and_then(|g| g.batches)
        .unwrap_or_default();
    let caps = KeyCaps {
        max_in_progress: granted
            .max_in_progress
            .unwrap_or(api.settings.max_in_progress),
        max_queued_items: granted
            .max_queued_items
            .unwrap_or(api.settings.max_queued_items),
        max_account_bytes: storage::room_for_batches(api, &batch.account_id).await?,
    };
    let queued = batch.queued();
    match api.batches.create(batch, caps).await? {
        Ok(created) => Ok(created),
        Err(CapReached::InProgress) => {
            Err(BatchError::TooManyInProgress(caps.max_in_progress).into())
        }
        Err(CapReached::QueuedItems) => {
            Err(BatchError::TooManyQueuedItems(queued, caps.max_queued_items).into())
        }
        Err(CapReached::AccountBytes) => {
            Err(StorageError::Quota(api.settings.files_account_max_bytes).into())
        }
    }
}

/// The `errored` result of an item, with the envelope of its error.
pub fn errored(error: &ApiError) -> String {
    json!({"type": "errored", "error": error.envelope()}).to_string()
}

/// The batch object the SDKs read.
fn object(batch: &Batch) -> Value {
    let status = batch.status();
    let results_url = (status == ProcessingStatus::Ended)
        .then(|| format!("/v1/messages/batches/{}/results", batch.id));
    json!({
        "id": batch.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": batch.counts,
        "ended_at": batch.ended_at.map(rfc3339),
        "created_at": rfc3339(batch.created_at),
        "expires_at": rfc3339(batch.expires_at),
        "cancel_initiated_at": batch.cancel_initiated_at.map(rfc3339),
        "archived_at": null,
        "results_url": results_url,
    })
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// The account's Message Batch of this id (not one of `/v1/batches`), unless it is past its
/// results' retention.
async fn found(api: &BatchApi, principal: &Principal, id: &str) -> Result<Batch, ApiError> {
    let now = OffsetDateTime::now_utc();
    Ok(api
        .batches
        .batch(&principal.account.id, id)
        .await?
        .filter(|b| b.format == RequestFormat::Messages && !api.settings.forgotten(b, now))
        .ok_or_else(|| BatchError::NotFound(id.to_owned()))?)
}

/// `GET /v1/messages/batches/{id}`
pub async fn get(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(object(&found(&api, &principal, &id).await?)))
}

#[derive(Deserialize)]
struct ListQuery {
    before_id: Option<String>,
    after_id: Option<String>,
    limit: Option<u32>,
}

/// `GET /v1/messages/batches`: the account's batches, newest first, `limit` (1 to 1,000,
/// default 20) at a time after `after_id` or before `before_id`.
pub async fn list(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let query: ListQuery = list_query::parse(&uri)?;
    let limit = list_query::limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let cursor = match (query.before_id, query.after_id) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "before_id, after_id: give one of them, not both",
            ))
        }
        (Some(before), None) => Cursor::Before(before),
        (None, Some(after)) => Cursor::After(after),
        (None, None) => Cursor::Newest,
    };
    let page = api
        .batches
        .list(
            &principal.account.id,
            &[RequestFormat::Messages],
            cursor,
            limit,
        )
        .await?;
    let data: Vec<Value> = page.batches.iter().map(object).collect();
    Ok(Json(json!({
        "data": data,
        "has_more": page.has_more,
        "first_id": page.batches.first().map(|b| &b.id),
        "last_id": page.batches.last().map(|b| &b.id),
    })))
}

/// `POST /v1/messages/batches/{id}/cancel`: its queued items end `canceled`, billed nothing;
/// those running finish.
pub async fn cancel(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    found(&api, &principal, &id).await?;
    let now = OffsetDateTime::now_utc();
    let batch = api
        .batches
        .cancel(&principal.account.id, &id, now)
        .await?
        .ok_or(BatchError::NotFound(id))?;
    Ok(Json(object(&batch)))
}

/// `DELETE /v1/messages/batches/{id}`: only once every item has ended.
pub async fn delete(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    found(&api, &principal, &id).await?;
    match api.batches.delete(&principal.account.id, &id).await? {
        Deleted::Deleted => Ok(Json(json!({"id": id, "type": "message_batch_deleted"}))),
        Deleted::Processing => Err(BatchError::Processing(id, "cancel it, or delete it").into()),
        Deleted::NotFound => Err(BatchError::NotFound(id).into()),
    }
}

/// `GET /v1/messages/batches/{id}/results`: one JSON line per request, in request order,
/// read from the store a chunk at a time as the client takes them.
pub async fn results(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let batch = found(&api, &principal, &id).await?;
    if batch.status() != ProcessingStatus::Ended {
        return Err(BatchError::Processing(id, "its results can be read").into());
    }
    let lines = result_lines(api.batches.clone(), batch.id);
    let mut response = Body::from_stream(lines).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-jsonl"),
    );
    Ok(response)
}

/// The results file, a chunk of lines per read of the store.
fn result_lines(
    batches: Arc<dyn BatchStore>,
    id: String,
) -> impl Stream<Item = Result<Bytes, StoreError>> + Send {
    async_stream::try_stream! {
        let mut after = None;
        loop {
            let chunk = batches.results(&id, after, RESULTS_PER_CHUNK).await?;
            let Some(last) = chunk.last() else { break };
            after = Some(last.index);
            let text: String = chunk.iter().map(line).collect();
            yield Bytes::from(text);
        }
    }
}

/// One line of the results file.
fn line(result: &ItemResult) -> String {
    let custom_id = Value::String(result.custom_id.clone());
    format!(
        "{{\"custom_id\":{custom_id},\"result\":{}}}\n",
        result.result
    )
}
