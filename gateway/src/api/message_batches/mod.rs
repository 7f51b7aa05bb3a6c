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
use self::requests::{Requests, SeenIds};
pub use self::settings::BatchSettings;
use super::list_query;
use super::storage::{self, StorageError};
use crate::edge::body::require_json;
use crate::edge::body_reader::read_streamed;
use crate::edge::budget::{parsed_cost, BYTES_PER_BODY_BYTE};
use crate::edge::path::Path;
use crate::error::ApiError;
use crate::state::BatchApi;
use gateway_core::auth::Principal;
use gateway_core::cpu;
use gateway_core::limits::AdmissionRequest;
use store::accounts::StoreError;
use store::batches::{
    Batch, BatchDraft, BatchStore, CapReached, Cursor, Deleted, ItemResult, KeyCaps, NewBatch,
    NewItem, ProcessingStatus, RequestFormat,
};
use store::ids::random;

/// Batches in a page of the list: the default, and the most.
const DEFAULT_PAGE: u32 = 20;
const MAX_PAGE: u32 = 1_000;
/// Results read from the store per chunk of the JSONL stream.
const RESULTS_PER_CHUNK: u32 = 500;

/// Items held before they are written to the batch's draft: about a megabyte of them.
const WRITE_BYTES: usize = 1024 * 1024;

/// `POST /v1/messages/batches`: every request is checked as `/v1/messages` checks it; one
/// that fails ends `errored` with its envelope at once, the others are queued. The body is
/// parsed as it arrives ([`requests`]), under the batch cap
/// ([`crate::edge::body_reader::BodyCap::BATCH`]) and its read deadline: each request is
/// checked and written to the batch's draft as it comes, holding of the memory budget only
/// the request being read, the items not yet written and the `custom_id`s seen. All or
/// nothing: a create refused midway (an invalid request, the storage quota, a body cut or
/// late) stores nothing.
pub async fn create(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    req: Request,
) -> Result<Response, ApiError> {
    require_json(req.headers())?;
    storage::require_credits(&api, &principal).await?;
    // The create is a request against the key's requests per minute, counted before its
    // body is read: a key over its minute creates no batch, on whichever pod.
    let admission = api
        .turns
        .limiter
        .admit(
            &principal.key.id,
            &principal.limits,
            AdmissionRequest::counting(&principal.request_count),
        )
        .await?;
    let account_id = principal.account.id.clone();
    // What the account may still keep, counted as the requests come and refused the moment
    // it is passed; checked again, with every other cap, when the batch is stored.
    let room = storage::room_for_batches(&api, &account_id)
        .await?
        .saturating_sub(api.batches.held_bytes(&account_id).await?);
    let mut body = read_streamed(req).await?;
    let created_at = OffsetDateTime::now_utc();
    let header = NewBatch {
        id: format!("msgbatch_{}", random(24)),
        account_id,
        key_id: principal.key.id.clone(),
        key_hash: principal.key.hash,
        created_at,
        expires_at: created_at + api.settings.expiry,
        format: RequestFormat::Messages,
        details: None,
        items: Vec::new(),
    };
    let turns = api.turns.turns();
    let mut reader = Requests::new(api.settings.max_requests);
    let mut seen = SeenIds::default();
    let mut draft: Option<Box<dyn BatchDraft + '_>> = None;
    let mut pending: Vec<NewItem> = Vec::new();
    let (mut pending_bytes, mut costliest) = (0usize, 0usize);
    let (mut queued, mut queued_bytes) = (0u64, 0u64);
    loop {
        let piece = body.next().await?;
        let mut complete = Vec::new();
        match &piece {
            Some(piece) => reader.feed(piece, &mut complete)?,
            None => reader.finish(&mut complete)?,
        }
        // The budget of what is held now: the request being read (its bytes, and the
        // costliest request parsed so far, one being parsed at a time), the items not yet
        // written and the ids seen.
        let held = |reader: &Requests, pending_bytes: usize, costliest: usize, seen: &SeenIds| {
            reader
                .held()
                .saturating_mul(BYTES_PER_BODY_BYTE)
                .saturating_add(costliest)
                .saturating_add(pending_bytes)
                .saturating_add(seen.cost())
        };
        body.hold(held(&reader, pending_bytes, costliest, &seen))
            .await?;
        for request in complete {
            costliest = costliest.max(parsed_cost(&request.bytes));
            body.hold(held(&reader, pending_bytes, costliest, &seen))
                .await?;
            let (custom_id, params) = requests::fields(&mut seen, &request)?;
            let item = if request.bytes.len() <= cpu::INLINE_BYTES {
                requests::item(&turns, custom_id, &request.bytes[params])
            } else {
                // Checking megabytes takes milliseconds to seconds: off the async workers.
                let turns = turns.clone();
                cpu::run(move || requests::item(&turns, custom_id, &request.bytes[params])).await?
            };
            if item.refused.is_none() {
                queued += 1;
                queued_bytes += item.params.len() as u64;
                if queued_bytes > room {
                    return Err(StorageError::Quota(api.settings.files_account_max_bytes).into());
                }
            }
            pending_bytes += item.params.len()
                + item.custom_id.len()
                + item.refused.as_ref().map_or(0, String::len)
                + requests::BYTES_PER_ITEM;
            pending.push(item);
            body.hold(held(&reader, pending_bytes, costliest, &seen))
                .await?;
            if pending_bytes >= WRITE_BYTES {
                let draft = draft.get_or_insert_with(|| api.batches.draft(header.clone()));
                draft.push(std::mem::take(&mut pending)).await?;
                pending_bytes = 0;
            }
        }
        if piece.is_none() {
            break;
        }
    }
    let created = match draft {
        // All of it held at once: stored as any batch is.
        None => {
            let batch = NewBatch {
                items: pending,
                ..header
            };
            create_within_caps(&api, batch).await?
        }
        Some(mut draft) => {
            if !pending.is_empty() {
                draft.push(pending).await?;
            }
            let caps = caps_of(&api, &header.key_id, &header.account_id).await?;
            let stored = draft.commit(caps).await?;
            stored.map_err(|cap| refusal(&api, caps, cap, queued))?
        }
    };
    drop(body);
    let mut response = Json(object(&created)).into_response();
    response.extensions_mut().insert(admission.snapshot);
    Ok(response)
}

/// The key's caps on batches: those of its ApiKey grant where it sets them, else the flags';
/// and what the account's quota leaves once its files are counted.
async fn caps_of(api: &BatchApi, key_id: &str, account_id: &str) -> Result<KeyCaps, ApiError> {
    let granted = api
        .turns
        .turns()
        .catalog
        .grant(key_id)
        .and_then(|g| g.batches)
        .unwrap_or_default();
    Ok(KeyCaps {
        max_in_progress: granted
            .max_in_progress
            .unwrap_or(api.settings.max_in_progress),
        max_queued_items: granted
            .max_queued_items
            .unwrap_or(api.settings.max_queued_items),
        max_account_bytes: storage::room_for_batches(api, account_id).await?,
    })
}

/// The error of a batch of `queued` items that would pass `cap`.
fn refusal(api: &BatchApi, caps: KeyCaps, cap: CapReached, queued: u64) -> ApiError {
    match cap {
        CapReached::InProgress => BatchError::TooManyInProgress(caps.max_in_progress).into(),
        CapReached::QueuedItems => {
            BatchError::TooManyQueuedItems(queued, caps.max_queued_items).into()
        }
        CapReached::AccountBytes => {
            StorageError::Quota(api.settings.files_account_max_bytes).into()
        }
        CapReached::InputFileGone => ApiError::not_found(
            "input_file_id: the input file was deleted or expired while the batch was being created",
        ),
    }
}

/// Stores a new batch of either API unless it would pass one of its key's caps
/// ([`caps_of`]).
pub async fn create_within_caps(api: &BatchApi, batch: NewBatch) -> Result<Batch, ApiError> {
    let caps = caps_of(api, &batch.key_id, &batch.account_id).await?;
    let queued = batch.queued();
    api.batches
        .create(batch, caps)
        .await?
        .map_err(|cap| refusal(api, caps, cap, queued))
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
