//! The JSON extractor of every POST: content type, the body read by [`super::body_reader`]
//! (its surface's cap, its deadline, the memory budget), and serde errors that name the field
//! path (`messages[1].content[0].type: unknown variant ...`).

use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::body_reader::read_request;
use crate::error::ApiError;
use gateway_core::cpu;

pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        require_json(req.headers())?;
        let bytes = read_request(req).await?;
        if bytes.len() <= cpu::INLINE_BYTES {
            return parse(&bytes).map(JsonBody);
        }
        // Parsing megabytes takes milliseconds to seconds: off the async workers.
        cpu::run(move || parse(&bytes)).await?.map(JsonBody)
    }
}

/// Refuses a body whose `Content-Type` is not JSON.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let json = headers
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
    Ok(())
}

pub fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
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
