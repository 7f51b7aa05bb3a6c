//! `/v1/batches`: OpenAI's Batch API, as its SDKs call it, over the Files API (`/v1/files`).
//! A batch is a Message Batch of the batch store (`store::batches`) whose items are Chat
//! Completions bodies (`RequestFormat::ChatCompletions`): the same workers run them, through
//! the same turn as `/v1/chat/completions`, at the batch price. Its input file is checked
//! whole at the create (a malformed file fails the batch with its `errors`, no item queued);
//! its output and error files are read from the items' results, and recorded in the file store
//! (their size, for `/v1/files` to list and delete them) by the worker that ends its last item,
//! or (a batch ended by cancel or expiry) when it is next retrieved.

pub mod input;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use time::OffsetDateTime;

use super::list_query;
use super::storage;
use crate::api::message_batches::{self, error::BatchError};
use crate::edge::body::JsonBody;
use crate::edge::body_reader::BodyError;
use crate::edge::budget::{BudgetOwner, Reservation};
use crate::edge::path::Path;
use crate::error::ApiError;
use crate::state::BatchApi;
use gateway_core::auth::{permit, Principal};
use gateway_core::cpu;
use gateway_core::limits::AdmissionRequest;
use store::accounts::StoreError;
use store::batches::{
    Batch, BatchStore, Cursor, ItemResult, ItemState, NewBatch, ProcessingStatus, RequestFormat,
};
use store::files::{FileInfo, GeneratedFile};
use store::ids::random;

/// The endpoints a batch's requests may go to, and the format of its items for each.
pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";
pub const RESPONSES: &str = "/v1/responses";
const ENDPOINTS: [(&str, RequestFormat); 2] = [
    (CHAT_COMPLETIONS, RequestFormat::ChatCompletions),
    (RESPONSES, RequestFormat::Responses),
];

/// The endpoint of a batch of items of `format`.
fn endpoint_of(format: RequestFormat) -> &'static str {
    ENDPOINTS
        .iter()
        .find(|(_, f)| *f == format)
        .map_or(CHAT_COMPLETIONS, |(endpoint, _)| endpoint)
}
/// The only completion window (OpenAI's).
const WINDOW: &str = "24h";
/// Batches in a page of the list: the default, and the most (OpenAI's).
const DEFAULT_PAGE: u32 = 20;
const MAX_PAGE: u32 = 100;
/// Results read from the store per chunk of an output or error file.
const RESULTS_PER_CHUNK: u32 = 500;
/// Metadata: at most 16 pairs, keys of 64 characters, values of 512 (OpenAI's limits).
const METADATA_PAIRS: usize = 16;
const METADATA_KEY: usize = 64;
const METADATA_VALUE: usize = 512;

#[derive(Deserialize)]
pub struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// What a batch echoes back of its create, kept with it as its `details`.
#[derive(Deserialize, Serialize)]
struct Details {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    metadata: Option<Map<String, Value>>,
    /// The lines of an input file that failed validation; the batch is then `failed`.
    errors: Vec<input::LineError>,
}

/// `POST /v1/batches`: the input file is read and checked whole; each valid line is an item
/// (one whose body `/v1/chat/completions` would refuse ends at once, its 400 in the error
/// file), and any malformed line fails the batch.
pub async fn create(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    owner: Option<Extension<BudgetOwner>>,
    JsonBody(body): JsonBody<CreateBatch>,
) -> Result<Response, ApiError> {
    let Some(&(endpoint, format)) = ENDPOINTS.iter().find(|(e, _)| *e == body.endpoint) else {
        return Err(ApiError::invalid(format!(
            "endpoint: `{}` is not supported; batches run `{CHAT_COMPLETIONS}` or `{RESPONSES}`",
            body.endpoint
        )));
    };
    // Its items run as `/v1/responses` turns, which the key's scopes must allow (checked again
    // when each runs).
    if format == RequestFormat::Responses {
        permit(&principal, "responses")?;
    }
    if body.completion_window != WINDOW {
        return Err(ApiError::invalid(format!(
            "completion_window: must be `{WINDOW}`"
        )));
    }
    check_metadata(body.metadata.as_ref())?;
    storage::require_credits(&api, &principal).await?;
    // Counted against the key's requests per minute before the file is read or checked.
    let admission = api
        .turns
        .limiter
        .admit(
            &principal.key.id,
            &principal.limits,
            AdmissionRequest::counting(&principal.request_count),
        )
        .await?;
    let content = api
        .files
        .content(&principal.account.id, &body.input_file_id)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "input_file_id: no file with id `{}`",
                body.input_file_id
            ))
        })?;
    // Its lines are parsed one at a time into items held together: the file holds the memory
    // budget of its bytes, or of its costliest line parsed when that is more.
    let content = Arc::new(content);
    let costliest = {
        let content = content.clone();
        cpu::run(move || input::costliest_line(&content)).await?
    };
    let mut parsing = Reservation::of(owner.map(|Extension(owner)| owner));
    parsing
        .grow_to_parsed(&content[costliest])
        .await
        .map_err(BodyError::from)?;
    parsing
        .grow_to(content.len())
        .await
        .map_err(BodyError::from)?;
    let max = api.settings.max_requests;
    let turn_api = api.turns.clone();
    let file_id = body.input_file_id.clone();
    let checked = cpu::run(move || {
        let check = input::Check {
            api: &turn_api,
            turns: &turn_api.turns(),
            endpoint,
            format,
        };
        input::read(&check, &file_id, &content, max)
    })
    .await?;
    let created_at = OffsetDateTime::now_utc();
    let details = Details {
        input_file_id: body.input_file_id,
        endpoint: body.endpoint,
        completion_window: body.completion_window,
        metadata: body.metadata,
        errors: checked.errors,
    };
    let batch = NewBatch {
        id: format!("batch_{}", random(24)),
        account_id: principal.account.id.clone(),
        key_id: principal.key.id.clone(),
        key_hash: principal.key.hash,
        created_at,
        expires_at: created_at + api.settings.expiry,
        format,
        details: Some(serde_json::to_string(&details).map_err(|_| ApiError::internal())?),
        items: checked.items,
    };
    let created = message_batches::create_within_caps(&api, batch).await?;
    let mut response = Json(object(&created)).into_response();
    response.extensions_mut().insert(admission.snapshot);
    Ok(response)
}

fn check_metadata(metadata: Option<&Map<String, Value>>) -> Result<(), ApiError> {
    let Some(metadata) = metadata else {
        return Ok(());
    };
    if metadata.len() > METADATA_PAIRS {
        return Err(ApiError::invalid(format!(
            "metadata: at most {METADATA_PAIRS} pairs"
        )));
    }
    for (key, value) in metadata {
        // Postgres keeps no U+0000 in jsonb: refused here, not a 503 from the store.
        if key.contains('\0') || value.as_str().is_some_and(|v| v.contains('\0')) {
            return Err(ApiError::invalid(
                "metadata: a key or value holds U+0000 (NUL), which cannot be stored",
            ));
        }
        let fits = key.chars().count() <= METADATA_KEY
            && value
                .as_str()
                .is_some_and(|v| v.chars().count() <= METADATA_VALUE);
        if !fits {
            return Err(ApiError::invalid(format!(
                "metadata.{key}: keys of at most {METADATA_KEY} characters, string values of at most {METADATA_VALUE}"
            )));
        }
    }
    Ok(())
}

fn details_of(batch: &Batch) -> Option<Details> {
    batch
        .details
        .as_deref()
        .and_then(|d| serde_json::from_str(d).ok())
}

/// OpenAI's status of a batch.
#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Failed,
    InProgress,
    Cancelling,
    Cancelled,
    Expired,
    Completed,
}

fn status(batch: &Batch, details: &Details) -> Status {
    if !details.errors.is_empty() {
        return Status::Failed;
    }
    match batch.status() {
        ProcessingStatus::InProgress => Status::InProgress,
        ProcessingStatus::Canceling => Status::Cancelling,
        ProcessingStatus::Ended if batch.cancel_initiated_at.is_some() => Status::Cancelled,
        ProcessingStatus::Ended if batch.counts.expired > 0 => Status::Expired,
        ProcessingStatus::Ended => Status::Completed,
    }
}

/// Items in the error file: every item that did not succeed.
fn failed(batch: &Batch) -> u64 {
    let c = &batch.counts;
    c.errored + c.canceled + c.expired
}

/// The batch object the SDKs read.
fn object(batch: &Batch) -> Value {
    let details = details_of(batch).unwrap_or_else(|| Details {
        input_file_id: String::new(),
        endpoint: endpoint_of(batch.format).to_owned(),
        completion_window: WINDOW.to_owned(),
        metadata: None,
        errors: Vec::new(),
    });
    let status = status(batch, &details);
    let at = |t: OffsetDateTime| t.unix_timestamp();
    let ended = batch.ended_at.filter(|_| status != Status::Failed);
    let when = |wanted: Status| ended.filter(|_| status == wanted).map(at);
    let output = ended
        .filter(|_| batch.counts.succeeded > 0)
        .map(|_| Generated::output(&batch.id).id());
    let errors = ended
        .filter(|_| failed(batch) > 0)
        .map(|_| Generated::errors(&batch.id).id());
    let c = &batch.counts;
    json!({
        "id": batch.id,
        "object": "batch",
        "endpoint": details.endpoint,
        "errors": (!details.errors.is_empty())
            .then(|| json!({"object": "list", "data": details.errors})),
        "input_file_id": details.input_file_id,
        "completion_window": details.completion_window,
        "status": status,
        "output_file_id": output,
        "error_file_id": errors,
        "created_at": at(batch.created_at),
        "in_progress_at": (status != Status::Failed).then(|| at(batch.created_at)),
        "expires_at": at(batch.expires_at),
        "finalizing_at": ended.map(at),
        "completed_at": when(Status::Completed),
        "failed_at": (status == Status::Failed).then(|| at(batch.created_at)),
        "expired_at": when(Status::Expired),
        "cancelling_at": batch.cancel_initiated_at.map(at),
        "cancelled_at": when(Status::Cancelled),
        "request_counts": {
            "total": c.processing + c.succeeded + failed(batch),
            "completed": c.succeeded,
            "failed": failed(batch),
        },
        "metadata": details.metadata,
    })
}

/// The account's batch of `/v1/batches` of this id, unless it is past its results' retention
/// (so its output and error files are never recorded again once the sweep forgot them).
async fn owned(api: &BatchApi, account_id: &str, id: &str) -> Result<Option<Batch>, ApiError> {
    let now = OffsetDateTime::now_utc();
    Ok(api
        .batches
        .batch(account_id, id)
        .await?
        .filter(|b| RequestFormat::OPENAI.contains(&b.format) && !api.settings.forgotten(b, now)))
}

async fn found(api: &BatchApi, principal: &Principal, id: &str) -> Result<Batch, ApiError> {
    Ok(owned(api, &principal.account.id, id)
        .await?
        .ok_or_else(|| BatchError::NotFound(id.to_owned()))?)
}

/// `GET /v1/batches/{id}`
pub async fn get(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let batch = object(&found(&api, &principal, &id).await?);
    record_generated(&api, &principal.account.id, &batch).await?;
    Ok(Json(batch))
}

#[derive(Deserialize)]
struct ListQuery {
    after: Option<String>,
    limit: Option<u32>,
}

/// `GET /v1/batches`: the account's batches, newest first, `limit` (1 to 100, default 20) at
/// a time after the batch `after`.
pub async fn list(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let query: ListQuery = list_query::parse(&uri)?;
    let limit = list_query::limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let cursor = query.after.map_or(Cursor::Newest, Cursor::After);
    let page = api
        .batches
        .list(&principal.account.id, &RequestFormat::OPENAI, cursor, limit)
        .await?;
    let data: Vec<Value> = page.batches.iter().map(object).collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "has_more": page.has_more,
        "first_id": page.batches.first().map(|b| &b.id),
        "last_id": page.batches.last().map(|b| &b.id),
    })))
}

/// `POST /v1/batches/{id}/cancel`: its queued items end cancelled (in the error file), billed
/// nothing; those running finish.
pub async fn cancel(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    found(&api, &principal, &id).await?;
    let batch = api
        .batches
        .cancel(&principal.account.id, &id, OffsetDateTime::now_utc())
        .await?
        .ok_or(BatchError::NotFound(id))?;
    Ok(Json(object(&batch)))
}

/// A batch's output or error file: named after its batch, read from its items' results.
pub struct Generated {
    batch_id: String,
    errors: bool,
}

const OUTPUT_PREFIX: &str = "file-output-";
/// The purpose of both generated files, as OpenAI lists them.
const GENERATED_PURPOSE: &str = "batch_output";
const ERRORS_PREFIX: &str = "file-errors-";

impl Generated {
    fn output(batch_id: &str) -> Self {
        Self {
            batch_id: batch_id.to_owned(),
            errors: false,
        }
    }

    fn errors(batch_id: &str) -> Self {
        Self {
            batch_id: batch_id.to_owned(),
            errors: true,
        }
    }

    /// The ids of a batch's output and error files.
    pub fn ids_of(batch_id: &str) -> [String; 2] {
        [Self::output(batch_id).id(), Self::errors(batch_id).id()]
    }

    /// The generated file a file id names, if it names one.
    pub fn of(file_id: &str) -> Option<Self> {
        if let Some(batch_id) = file_id.strip_prefix(OUTPUT_PREFIX) {
            return Some(Self::output(batch_id));
        }
        file_id.strip_prefix(ERRORS_PREFIX).map(Self::errors)
    }

    fn id(&self) -> String {
        let prefix = if self.errors {
            ERRORS_PREFIX
        } else {
            OUTPUT_PREFIX
        };
        format!("{prefix}{}", self.batch_id)
    }

    /// Whether an item's result goes in this file.
    fn holds(&self, state: ItemState) -> bool {
        (state == ItemState::Succeeded) != self.errors
    }
}

/// The generated file's batch, once it has ended with results for that file.
async fn generated_batch(
    api: &BatchApi,
    account_id: &str,
    file: &Generated,
) -> Result<Option<Batch>, ApiError> {
    let Some(batch) = owned(api, account_id, &file.batch_id).await? else {
        return Ok(None);
    };
    let field = if file.errors {
        "error_file_id"
    } else {
        "output_file_id"
    };
    let listed = object(&batch)[field] == Value::String(file.id());
    Ok(listed.then_some(batch))
}

/// The file object of a batch's output or error file: recorded in the file store (listed and
/// deleted as uploads are) the first time it is asked for once its batch has ended, its size
/// counted then from its lines; `None` when there is no such file, or it was deleted.
pub async fn generated_info(
    api: &BatchApi,
    account_id: &str,
    file: &Generated,
) -> Result<Option<FileInfo>, ApiError> {
    if let Some(info) = api.files.file(account_id, &file.id()).await? {
        return Ok(Some(info));
    }
    let Some(batch) = generated_batch(api, account_id, file).await? else {
        return Ok(None);
    };
    let mut bytes = 0;
    let mut lines = std::pin::pin!(file_lines(
        api.batches.clone(),
        batch.id.clone(),
        file.errors
    ));
    while let Some(chunk) = lines.next().await {
        bytes += chunk?.len() as u64;
    }
    let suffix = if file.errors { "errors" } else { "output" };
    let generated = GeneratedFile {
        id: file.id(),
        account_id: batch.account_id,
        filename: format!("{}_{suffix}.jsonl", batch.id),
        purpose: GENERATED_PURPOSE.to_owned(),
        bytes,
        created_at: batch.ended_at.unwrap_or(batch.created_at),
        batch_id: batch.id,
    };
    Ok(api.files.record_generated(generated).await?)
}

/// Records the output and error files of the account's batch, if it has ended: its worker
/// calls this when it ended the batch's last item.
pub async fn record_ended(api: &BatchApi, account_id: &str, id: &str) -> Result<(), ApiError> {
    match owned(api, account_id, id).await? {
        Some(batch) if batch.ended_at.is_some() => {
            record_generated(api, account_id, &object(&batch)).await
        }
        _ => Ok(()),
    }
}

/// Records the output and error files of a batch that has ended, so that `/v1/files` lists
/// them.
async fn record_generated(api: &BatchApi, account_id: &str, batch: &Value) -> Result<(), ApiError> {
    for field in ["output_file_id", "error_file_id"] {
        if let Some(file) = batch[field].as_str().and_then(Generated::of) {
            generated_info(api, account_id, &file).await?;
        }
    }
    Ok(())
}

/// The content of a batch's output or error file, streamed a chunk of results at a time.
pub async fn generated_content(
    api: &BatchApi,
    principal: &Principal,
    file: Generated,
) -> Result<Option<Body>, ApiError> {
    if generated_info(api, &principal.account.id, &file)
        .await?
        .is_none()
    {
        return Ok(None);
    }
    Ok(Some(Body::from_stream(file_lines(
        api.batches.clone(),
        file.batch_id,
        file.errors,
    ))))
}

fn file_lines(
    batches: Arc<dyn BatchStore>,
    batch_id: String,
    errors: bool,
) -> impl Stream<Item = Result<Bytes, StoreError>> + Send {
    let file = Generated { batch_id, errors };
    async_stream::try_stream! {
        let mut after = None;
        loop {
            let chunk = batches.results(&file.batch_id, after, RESULTS_PER_CHUNK).await?;
            let Some(last) = chunk.last() else { break };
            after = Some(last.index);
            let text: String = chunk
                .iter()
                .filter(|r| file.holds(r.state))
                .map(|r| line(&file.batch_id, r))
                .collect();
            yield Bytes::from(text);
        }
    }
}

/// One line of an output or error file: `{id, custom_id, response, error}`.
fn line(batch_id: &str, result: &ItemResult) -> String {
    let (response, error) = match result.state {
        ItemState::Canceled => (
            Value::Null,
            json!({"code": "batch_cancelled", "message": "This request was not run: its batch was cancelled."}),
        ),
        ItemState::Expired => (
            Value::Null,
            json!({"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}),
        ),
        _ => serde_json::from_str::<Value>(&result.result)
            .map(|r| (r["response"].clone(), r["error"].clone()))
            .unwrap_or((Value::Null, Value::Null)),
    };
    let id = format!(
        "batch_req_{}_{}",
        batch_id.trim_start_matches("batch_"),
        result.index
    );
    let mut text = json!({
        "id": id,
        "custom_id": result.custom_id,
        "response": response,
        "error": error,
    })
    .to_string();
    text.push('\n');
    text
}

/// An item's stored result: the response `/v1/chat/completions` answered, its status code
/// and the id of its turn (its ledger row).
pub fn response_result(status_code: u16, request_id: &str, body: &impl Serialize) -> String {
    json!({
        "response": {"status_code": status_code, "request_id": request_id, "body": body},
        "error": null,
    })
    .to_string()
}

/// An item's stored result when `/v1/chat/completions` would have answered this error.
pub fn error_result(error: &ApiError, request_id: &str) -> String {
    response_result(error.status.as_u16(), request_id, &error.envelope())
}
