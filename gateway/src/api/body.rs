//! The JSON body extractor of every POST: content type, the 16 MiB cap (413), and serde
//! errors that name the field path (`messages[1].content[0].type: unknown variant ...`).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
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
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(MAX_BODY_BYTES)
            } else {
                ApiError::invalid("could not read the request body")
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("invalid JSON body: {inner}"))
        } else if path == "." {
            ApiError::invalid(inner.to_string())
        } else {
            ApiError::invalid(format!("{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))?;
    Ok(value)
}
