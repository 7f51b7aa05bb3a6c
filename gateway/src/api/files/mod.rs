//! `/v1/files`: OpenAI's Files API, as its SDKs call it, for the input of a batch
//! (`purpose=batch`, JSONL). Uploads are kept in the file store (`store::files`) of the
//! account; a batch's output and error files are listed there too once recorded, their
//! content read from the batch store itself ([`super::batches`]).

pub mod error;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};
use time::OffsetDateTime;

use self::error::FileError;
use super::batches::{self, Generated};
use super::list_query;
use super::storage::{self, StorageError};
use crate::edge::body_reader::{read_upload, BodyError};
use crate::edge::budget::{BudgetOwner, Reservation};
use crate::edge::path::Path;
use crate::error::ApiError;
use crate::state::BatchApi;
use gateway_core::auth::Principal;
use gateway_core::cpu;
use store::batches::Deleted;
use store::files::{FileInfo, FileStore, NewFile, Order};
use store::ids::random;

/// The only purpose accepted: the input of a batch.
const BATCH: &str = "batch";
/// What an upload's `expires_after[seconds]` may be (OpenAI's bounds: an hour to 30 days).
const EXPIRES_AFTER_SECS: std::ops::RangeInclusive<i64> = 3_600..=2_592_000;
/// Files in a page of the list: the default, and the most (as the batch lists': OpenAI's
/// 10,000 of names and objects made one page of an account's files hundreds of megabytes;
/// the SDKs page on `after`).
const DEFAULT_PAGE: u32 = 20;
const MAX_PAGE: u32 = 1_000;
/// The longest file name kept, in bytes (a file system's usual bound); a name is counted in the
/// account's quota with its content.
pub const MAX_FILENAME_BYTES: usize = 255;

/// `POST /v1/files`: a multipart form of `purpose` and `file`, read whole under the `/v1`
/// body cap (a larger declared length refused before any of it is read) and the memory budget
/// of its bytes (it is checked a line at a time, never parsed whole); a batch input must be
/// JSONL, one JSON object a line.
pub async fn upload(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    req: Request,
) -> Result<Json<Value>, ApiError> {
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let boundary = multer::parse_boundary(&content_type)
        .map_err(|e| FileError::Multipart(format!("Content-Type: {e}")))?;
    storage::require_credits(&api, &principal).await?;
    let body = Bytes::from(read_upload(req).await?);
    let form = read_form(body, boundary).await?;
    let purpose = form
        .purpose
        .ok_or_else(|| ApiError::invalid("purpose: field required"))?;
    if purpose != BATCH {
        return Err(FileError::Purpose(purpose).into());
    }
    let (filename, content) = form
        .file
        .ok_or_else(|| ApiError::invalid("file: field required"))?;
    if filename.len() > MAX_FILENAME_BYTES {
        return Err(FileError::FilenameTooLong {
            bytes: filename.len(),
            max: MAX_FILENAME_BYTES,
        }
        .into());
    }
    let expires_after = match form.expires_after.seconds {
        Some(seconds) => expires_after(form.expires_after.anchor.as_deref(), &seconds)?,
        None if form.expires_after.anchor.is_some() => {
            return Err(FileError::ExpiresAfter("seconds: field required".to_owned()).into())
        }
        None => api.settings.files_expiry,
    };
    let content = cpu::run(move || check_jsonl(&content).map(|()| content)).await??;
    let created_at = OffsetDateTime::now_utc();
    let file = NewFile {
        id: format!("file-{}", random(24)),
        account_id: principal.account.id.clone(),
        filename,
        purpose,
        content: Vec::from(content),
        created_at,
        expires_at: Some(created_at + expires_after),
    };
    let room = storage::room_for_files(&api, &principal.account.id).await?;
    let created = api
        .files
        .create(file, room)
        .await?
        .ok_or(StorageError::Quota(api.settings.files_account_max_bytes))?;
    Ok(Json(object(&created)))
}

struct Form {
    purpose: Option<String>,
    /// Its file name and content.
    file: Option<(String, Bytes)>,
    expires_after: ExpiresAfter,
}

/// The form's `expires_after[anchor]` and `expires_after[seconds]`, as the SDKs send them.
#[derive(Default)]
struct ExpiresAfter {
    anchor: Option<String>,
    seconds: Option<String>,
}

/// How long after its creation an upload expires: `anchor` must be `created_at` (the only one
/// OpenAI has), `seconds` an hour to 30 days.
fn expires_after(anchor: Option<&str>, seconds: &str) -> Result<std::time::Duration, FileError> {
    if anchor != Some("created_at") {
        return Err(FileError::ExpiresAfter(
            "anchor: must be `created_at`".to_owned(),
        ));
    }
    match seconds.trim().parse::<i64>() {
        Ok(s) if EXPIRES_AFTER_SECS.contains(&s) => {
            Ok(std::time::Duration::from_secs(s.unsigned_abs()))
        }
        _ => Err(FileError::ExpiresAfter(format!(
            "seconds: an integer from {} to {}, not `{seconds}`",
            EXPIRES_AFTER_SECS.start(),
            EXPIRES_AFTER_SECS.end()
        ))),
    }
}

async fn read_form(body: Bytes, boundary: String) -> Result<Form, FileError> {
    let whole = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut multipart = multer::Multipart::new(whole, boundary);
    let mut form = Form {
        purpose: None,
        file: None,
        expires_after: ExpiresAfter::default(),
    };
    let bad = |e: multer::Error| FileError::Multipart(e.to_string());
    while let Some(field) = multipart.next_field().await.map_err(bad)? {
        match field.name() {
            Some("purpose") => form.purpose = Some(field.text().await.map_err(bad)?),
            Some("expires_after[anchor]") => {
                form.expires_after.anchor = Some(field.text().await.map_err(bad)?);
            }
            Some("expires_after[seconds]") => {
                form.expires_after.seconds = Some(field.text().await.map_err(bad)?);
            }
            Some("file") => {
                let name = field.file_name().unwrap_or("file.jsonl").to_owned();
                form.file = Some((name, field.bytes().await.map_err(bad)?));
            }
            _ => {}
        }
    }
    Ok(form)
}

/// How deep a line's arrays and objects may nest (serde_json's own bound when it builds a
/// value; skipping one, as the check does, has none).
const MAX_NESTING: usize = 128;

/// Whether no array or object of `line` is nested deeper than `max`, counted outside strings.
fn nesting_within(line: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in line {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// Every non-blank line is a JSON object, UTF-8 and at most [`MAX_NESTING`] deep: checked
/// without building it (a line of many tiny values would take far more memory parsed than its
/// bytes).
fn check_jsonl(content: &[u8]) -> Result<(), FileError> {
    let mut lines = 0;
    for (i, line) in content.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        lines += 1;
        let not_jsonl = |reason: String| FileError::NotJsonl {
            line: i + 1,
            reason,
        };
        if line.trim_ascii_start().first() != Some(&b'{') {
            return Err(not_jsonl("not an object".to_owned()));
        }
        if let Err(e) = std::str::from_utf8(line) {
            return Err(not_jsonl(format!("not UTF-8: {e}")));
        }
        if !nesting_within(line, MAX_NESTING) {
            return Err(not_jsonl(format!(
                "nested more than {MAX_NESTING} arrays and objects deep"
            )));
        }
        if let Err(e) = serde_json::from_slice::<IgnoredAny>(line) {
            return Err(not_jsonl(e.to_string()));
        }
    }
    if lines == 0 {
        return Err(FileError::NotJsonl {
            line: 1,
            reason: "the file is empty".to_owned(),
        });
    }
    Ok(())
}

/// The file object the SDKs read.
pub fn object(file: &FileInfo) -> Value {
    json!({
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": file.created_at.unix_timestamp(),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": null,
        "expires_at": file.expires_at.map(OffsetDateTime::unix_timestamp),
    })
}

/// `GET /v1/files/{id}`: an upload, or a batch's output or error file.
pub async fn get(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let info = match Generated::of(&id) {
        Some(generated) => batches::generated_info(&api, &principal.account.id, &generated).await?,
        None => api.files.file(&principal.account.id, &id).await?,
    };
    Ok(Json(object(&info.ok_or(FileError::NotFound(id))?)))
}

/// `GET /v1/files/{id}/content`: an upload streamed from the store a range at a time
/// ([`upload_content`]), or a batch's output or error file streamed from its results.
pub async fn content(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    owner: Option<Extension<BudgetOwner>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let body = match Generated::of(&id) {
        Some(generated) => batches::generated_content(&api, &principal, generated).await?,
        None => {
            let owner = owner.map(|Extension(owner)| owner);
            upload_content(&api, &principal.account.id, owner, &id).await?
        }
    };
    let mut response = body.ok_or(FileError::NotFound(id))?.into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// Bytes of an upload a download reads from the store at a time.
const DOWNLOAD_RANGE: u32 = 1024 * 1024;

/// An upload's content, `None` when the account has no such upload: a stream of ranges read
/// from the store one after the other, never the whole file at once. It holds the memory
/// budget (`edge::budget`, counted with the account's bodies) of two ranges, the one being
/// sent and the one being read, taken before the answer starts (503 when the budget is
/// full) and given back when the stream ends or the client hangs up.
async fn upload_content(
    api: &BatchApi,
    account_id: &str,
    owner: Option<BudgetOwner>,
    id: &str,
) -> Result<Option<Body>, ApiError> {
    let Some(info) = api.files.file(account_id, id).await? else {
        return Ok(None);
    };
    let in_flight = usize::try_from(info.bytes)
        .unwrap_or(usize::MAX)
        .min(2 * DOWNLOAD_RANGE as usize);
    let mut held = Reservation::of(owner);
    held.grow_to_cost(in_flight, in_flight)
        .await
        .map_err(BodyError::from)?;
    Ok(Some(Body::from_stream(ranges(
        api.files.clone(),
        account_id.to_owned(),
        id.to_owned(),
        held,
    ))))
}

type RangeError = Box<dyn std::error::Error + Send + Sync>;

/// The upload's ranges from its start until one comes back short; `held` is dropped with the
/// stream. An upload deleted or expired meanwhile cuts the stream (an error, the connection
/// closed): its `200` was sent already.
fn ranges(
    files: Arc<dyn FileStore>,
    account_id: String,
    id: String,
    held: Reservation,
) -> impl futures::Stream<Item = Result<Bytes, RangeError>> + Send {
    async_stream::try_stream! {
        let _held = held;
        let mut offset = 0u64;
        loop {
            let range = files
                .content_range(&account_id, &id, offset, DOWNLOAD_RANGE)
                .await?
                .ok_or_else(|| RangeError::from("the file is gone: deleted or expired while read"))?;
            let last = range.len() < DOWNLOAD_RANGE as usize;
            offset += range.len() as u64;
            if !range.is_empty() {
                yield Bytes::from(range);
            }
            if last {
                break;
            }
        }
    }
}

#[derive(Deserialize)]
struct ListQuery {
    purpose: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
    order: Option<String>,
}

/// `GET /v1/files`: the account's uploads and batch output files, newest first, `limit` (1 to
/// 1,000, default 20) at a time after the file `after`.
pub async fn list(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let query: ListQuery = list_query::parse(&uri)?;
    let limit = list_query::limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let order = match query.order.as_deref() {
        None | Some("desc") => Order::NewestFirst,
        Some("asc") => Order::OldestFirst,
        Some(_) => return Err(ApiError::invalid("order: `asc` or `desc`")),
    };
    let page = api
        .files
        .list(
            &principal.account.id,
            query.purpose.as_deref(),
            query.after.as_deref(),
            limit,
            order,
        )
        .await?;
    let data: Vec<Value> = page.files.iter().map(object).collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "has_more": page.has_more,
        "first_id": page.files.first().map(|f| &f.id),
        "last_id": page.files.last().map(|f| &f.id),
    })))
}

/// `DELETE /v1/files/{id}`: an upload, or a batch's output or error file (its content is then
/// gone; the batch still names it).
pub async fn delete(
    State(api): State<Arc<BatchApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if let Some(generated) = Generated::of(&id) {
        // Recorded first, if it was not yet, so that it stays deleted.
        batches::generated_info(&api, &principal.account.id, &generated).await?;
    }
    // A batch reads each request from its input file when it runs: the file stays while any
    // is open (one copy for every batch made from it, counted once in the quota). One decision
    // with the batch creates, so none reads the file once it is deleted.
    match api.batches.delete_file(&principal.account.id, &id).await? {
        Deleted::Deleted => {}
        Deleted::Processing => return Err(FileError::InUse(id).into()),
        Deleted::NotFound => return Err(FileError::NotFound(id).into()),
    }
    Ok(Json(json!({"id": id, "object": "file", "deleted": true})))
}
