//! The JSON body extractor of every POST: content type, the 16 MiB cap (413), and serde
//! errors that name the field path (`messages[1].content[0].type: unknown variant ...`).

use std::time::Duration;

use tokio::time::Instant;

use axum::body::{Body, BodyDataStream};
use axum::extract::{FromRequest, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use futures::StreamExt;
use serde::de::DeserializeOwned;

use crate::cpu;
use crate::error::ApiError;

pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// How much of an oversized body is read and dropped before the 413, and for how long: a
/// client still uploading when the server closes gets a connection reset instead of the 413,
/// so the gateway keeps reading (within these bounds) until the client can read its answer.
const DRAIN_BYTES: usize = 4 * MAX_BODY_BYTES;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// How long a request body may take to arrive: `base`, plus a second for every
/// `min_bytes_per_sec` bytes received, so a client that keeps up the minimum rate always gets
/// its body in and one trickling a byte at a time is cut after `base`. Set by the server as a
/// request extension; the default applies where none is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyDeadline {
    pub base: Duration,
    pub min_bytes_per_sec: u64,
}

impl Default for BodyDeadline {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(30),
            min_bytes_per_sec: 32 * 1024,
        }
    }
}

impl BodyDeadline {
    fn of(req: &Request) -> Self {
        req.extensions().get::<Self>().copied().unwrap_or_default()
    }

    /// The time by which the body must be in, having received `received` bytes so far.
    fn until(&self, started: Instant, received: usize) -> Instant {
        let earned = Duration::from_secs_f64(received as f64 / self.min_bytes_per_sec as f64);
        started + self.base + earned
    }
}

pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| {
                let v = v.trim().to_ascii_lowercase();
                v == "application/json" || v.ends_with("+json")
            })
            .unwrap_or(false);
        if !json {
            return Err(ApiError::invalid("Content-Type must be application/json"));
        }
        let bytes = read_request(req).await?;
        if bytes.len() <= cpu::INLINE_BYTES {
            return parse(&bytes).map(JsonBody);
        }
        // Parsing megabytes takes milliseconds to seconds: off the async workers.
        cpu::run(move || parse(&bytes)).await?.map(JsonBody)
    }
}

/// A body of any content type, read whole under the same cap and 413 as [`JsonBody`] (the
/// payment webhook signs the raw bytes).
pub struct RawBody(pub Vec<u8>);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        read_request(req).await.map(RawBody)
    }
}

/// The request's whole body, under the cap, its declared length and its deadline.
async fn read_request(req: Request) -> Result<Vec<u8>, ApiError> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let deadline = BodyDeadline::of(&req);
    read_capped(req.into_body(), declared, deadline).await
}

async fn read_capped(
    body: Body,
    declared: Option<usize>,
    deadline: BodyDeadline,
) -> Result<Vec<u8>, ApiError> {
    let started = Instant::now();
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
        drain(stream).await;
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(MAX_BODY_BYTES));
    loop {
        let until = deadline.until(started, bytes.len());
        let Ok(next) = tokio::time::timeout_at(until, stream.next()).await else {
            return Err(ApiError::body_timeout());
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|_| ApiError::invalid("could not read the request body"))?;
        if bytes.len() + chunk.len() > MAX_BODY_BYTES {
            drain(stream).await;
            return Err(ApiError::too_large(MAX_BODY_BYTES));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

pub(crate) async fn drain(mut stream: BodyDataStream) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut read = 0;
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(invalid)?;
    de.end()
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

/// A body already read as JSON, typed, with the same field-path errors as [`parse`]; for
/// endpoints that also keep parts of the raw body (to echo them back).
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(invalid)
}

fn invalid(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::invalid(format!("invalid JSON body: {inner}"));
    }
    ApiError::invalid(data_error(&path, &inner))
}

/// A field that does not fit, said the way the providers' APIs say it (`max_tokens: field
/// required`) rather than in serde's words: the position in the body is dropped (the path
/// names the field) and Rust's type names become JSON's.
fn data_error(path: &str, e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    let text = text.strip_suffix(&position).unwrap_or(&text);
    let at = |field: &str| match path {
        "." => field.to_owned(),
        _ => format!("{path}.{field}"),
    };
    if let Some(field) = text
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return format!("{}: field required", at(field));
    }
    let mut text = text.to_owned();
    for (rust, json) in [
        ("expected u8", "expected a non-negative integer"),
        ("expected u16", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected i64", "expected an integer"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
    ] {
        if let Some(head) = text.strip_suffix(rust) {
            text = format!("{head}{json}");
        }
    }
    match path {
        "." => text,
        _ => format!("{path}: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[allow(dead_code)] // read by serde only
    #[derive(Debug, Deserialize)]
    struct Request {
        max_tokens: u32,
        messages: Vec<Message>,
    }

    #[allow(dead_code)]
    #[derive(Debug, Deserialize)]
    struct Message {
        role: String,
        temperature: Option<f64>,
    }

    fn refusal(body: &str) -> String {
        match parse::<Request>(body.as_bytes()) {
            Ok(r) => panic!("accepted {r:?}"),
            Err(e) => e.message,
        }
    }

    #[test]
    fn a_body_that_does_not_fit_is_refused_naming_the_field_in_json_words_not_serde_ones() {
        let cases = [
            (r#"{"messages":[]}"#, "max_tokens: field required"),
            (
                r#"{"max_tokens":1,"messages":[{"temperature":1}]}"#,
                "messages[0].role: field required",
            ),
            (
                r#"{"max_tokens":"10","messages":[]}"#,
                r#"max_tokens: invalid type: string "10", expected a non-negative integer"#,
            ),
            (
                r#"{"max_tokens":-1,"messages":[]}"#,
                "max_tokens: invalid value: integer `-1`, expected a non-negative integer",
            ),
            (
                r#"{"max_tokens":1,"messages":[{"role":"user","temperature":"hot"}]}"#,
                r#"messages[0].temperature: invalid type: string "hot", expected a number"#,
            ),
        ];
        for (body, message) in cases {
            assert!(
                refusal(body).ends_with(message),
                "{body}: {}",
                refusal(body)
            );
        }
    }

    #[test]
    fn malformed_json_is_refused_with_its_position() {
        let message = refusal(r#"{"max_tokens": 1,"#);
        assert!(
            message.contains("invalid JSON body") && message.contains("line 1"),
            "{message}"
        );
    }
}
