//! Amazon Bedrock as the mock upstream ([`crate::upstream`]) serves it: `InvokeModel`
//! (`POST /model/{modelId}/invoke`, the Messages answer in JSON) and
//! `InvokeModelWithResponseStream` (`/model/{modelId}/invoke-with-response-stream`, the AWS
//! event stream: binary frames with their prelude and message CRCs, each `chunk` event's
//! `bytes` the base64 of one Messages stream event, the last one with
//! `amazon-bedrock-invocationMetrics`). Before any model answers, it does what Bedrock does:
//!
//! - recomputes the request's SigV4 signature (`aws-sigv4`, from [`ACCESS_KEY_ID`] and
//!   [`SECRET_ACCESS_KEY`], the signed headers, the body and `x-amz-date` it received) and
//!   refuses a mismatch with Bedrock's 403 `InvalidSignatureException`, an unknown key with
//!   `UnrecognizedClientException`, a credential scoped to another region or service too;
//! - refuses a body with `model` or `stream` (extraneous keys), without an
//!   `anthropic_version` (`bedrock-2023-05-31`, or a dated one as newer official clients
//!   send), or for another model id, with a 400 `ValidationException`.
//!
//! Errors carry `x-amzn-ErrorType` and a `{"message"}` body as Bedrock's do; the messages name
//! "bedrock" so the harness' leak checks catch a gateway that forwards them.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue as FrameValue, Message};
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

use crate::upstream::MockUsage;

/// The region every generated bedrock route names.
pub const REGION: &str = "eu-west-3";
/// The Bedrock model id the routes name: a `:` to escape, and the upstream model's name for
/// the leak checks.
pub const MODEL_ID: &str = "anthropic.upstream-model-zq7-v1:0";
/// The body's version Bedrock's Claude models require.
pub const ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";
/// The test credentials, in the Secret the generated routes name. The secret key holds the
/// mock's upstream key for the leak checks.
pub const ACCESS_KEY_ID: &str = "AKIAMOCKBEDROCK00001";
pub const SECRET_ACCESS_KEY: &str = "upstream-secret-key-aws/Zq7mock+bedrock";
pub const SESSION_TOKEN: &str = "mock-session-token-8812";

/// The Secret of the test credentials.
pub const CREDENTIALS: &str = "mock-aws-credentials";
/// A Secret with the right key id and a wrong secret key: a signature the mock refuses.
pub const WRONG_CREDENTIALS: &str = "mock-aws-credentials-wrong";

/// The Secrets [`CREDENTIALS`] and [`WRONG_CREDENTIALS`], for the manifest folders.
pub const CREDENTIALS_SECRET: &str = "apiVersion: v1
kind: Secret
metadata:
  name: mock-aws-credentials
type: Opaque
stringData:
  accessKeyId: AKIAMOCKBEDROCK00001
  secretAccessKey: upstream-secret-key-aws/Zq7mock+bedrock
  sessionToken: mock-session-token-8812
---
apiVersion: v1
kind: Secret
metadata:
  name: mock-aws-credentials-wrong
type: Opaque
stringData:
  accessKeyId: AKIAMOCKBEDROCK00001
  secretAccessKey: upstream-secret-key-aws/not-the-right-one
";

fn refuse(status: StatusCode, kind: &str, message: &str) -> Response {
    let mut response = (status, axum::Json(json!({"message": message}))).into_response();
    if let Ok(value) = HeaderValue::from_str(&format!(
        "{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    )) {
        response.headers_mut().insert("x-amzn-errortype", value);
    }
    response
}

/// Bedrock's error response for a scripted status.
pub fn error_response(status: u16, message: &str) -> Response {
    let kind = match status {
        400 => "ValidationException",
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    };
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    refuse(code, kind, &format!("bedrock: {message}"))
}

/// Bedrock's checks of a request, in its order: the signature, then the model and the body.
/// `None` when the request passes them.
pub fn refusal(
    path: &str,
    query: &str,
    headers: &HeaderMap,
    bytes: &[u8],
    body: &Value,
) -> Option<Response> {
    if let Err((kind, message)) = verify_signature(path, query, headers, bytes) {
        return Some(refuse(StatusCode::FORBIDDEN, kind, &message));
    }
    let model = path
        .strip_prefix("/model/")
        .and_then(|rest| rest.split('/').next())
        .map(percent_decode);
    if model.as_deref() != Some(MODEL_ID) {
        return Some(refuse(
            StatusCode::BAD_REQUEST,
            "ValidationException",
            "bedrock: The provided model identifier is invalid.",
        ));
    }
    for key in ["model", "stream", "metadata"] {
        if body.get(key).is_some() {
            return Some(refuse(
                StatusCode::BAD_REQUEST,
                "ValidationException",
                &format!(
                    "bedrock: Malformed input request: extraneous key [{key}] is not permitted"
                ),
            ));
        }
    }
    // The gateway sends ANTHROPIC_VERSION (its tests say so); newer official clients send the
    // Messages API's dated version, which Bedrock takes too.
    let version = body["anthropic_version"].as_str().unwrap_or_default();
    if version != ANTHROPIC_VERSION && !is_dated_version(version) {
        return Some(refuse(
            StatusCode::BAD_REQUEST,
            "ValidationException",
            "bedrock: Malformed input request: anthropic_version is required",
        ));
    }
    None
}

/// `2026-10-21`: the Messages API's versions.
fn is_dated_version(version: &str) -> bool {
    version.len() == 10
        && version.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            _ => b.is_ascii_digit(),
        })
}

/// What Bedrock says of the model's output (the body's type, or each chunk's in a stream).
pub fn add_content_type(response: &mut Response) {
    response.headers_mut().insert(
        "x-amzn-bedrock-content-type",
        HeaderValue::from_static("application/json"),
    );
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

type Refusal = (&'static str, String);

const MISMATCH: &str = "bedrock: The request signature we calculated does not match the \
    signature you provided. Check your AWS Secret Access Key and signing method.";

/// Recomputes the request's signature from what arrived and the known secret key.
fn verify_signature(
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let invalid = |message: &str| ("InvalidSignatureException", message.to_owned());
    let authorization = header("authorization").ok_or_else(|| {
        (
            "MissingAuthenticationTokenException",
            "bedrock: Missing Authentication Token".to_owned(),
        )
    })?;
    let fields = authorization
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(|| invalid("bedrock: only AWS4-HMAC-SHA256 is accepted"))?;
    let field = |name: &str| {
        fields
            .split(", ")
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| invalid(&format!("bedrock: Authorization lacks {name}")))
    };
    let scope: Vec<&str> = field("Credential")?.split('/').collect();
    let signed_headers = field("SignedHeaders")?;
    let signature = field("Signature")?;
    if scope.first() != Some(&ACCESS_KEY_ID) {
        return Err((
            "UnrecognizedClientException",
            "bedrock: The security token included in the request is invalid.".to_owned(),
        ));
    }
    if scope.get(2) != Some(&REGION) || scope.get(3) != Some(&"bedrock") {
        return Err(invalid(&format!(
            "bedrock: Credential should be scoped to a valid region and service: {scope:?}"
        )));
    }
    let token = header("x-amz-security-token");
    if token.is_some_and(|t| t != SESSION_TOKEN) {
        return Err((
            "UnrecognizedClientException",
            "bedrock: The security token included in the request is invalid.".to_owned(),
        ));
    }
    let time = header("x-amz-date")
        .and_then(parse_amz_date)
        .ok_or_else(|| invalid("bedrock: missing or malformed x-amz-date"))?;
    let host = header("host").ok_or_else(|| invalid("bedrock: no host"))?;
    if !signed_headers.split(';').any(|h| h == "host") {
        return Err(invalid("bedrock: the host header must be signed"));
    }
    let signed: Vec<(&str, &str)> = signed_headers
        .split(';')
        .filter_map(|name| Some((name, header(name)?)))
        .collect();
    let url = if query.is_empty() {
        format!("http://{host}{path}")
    } else {
        format!("http://{host}{path}?{query}")
    };
    let credentials = Credentials::new(
        ACCESS_KEY_ID,
        SECRET_ACCESS_KEY,
        token.map(str::to_owned),
        None,
        "mock",
    );
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(REGION)
        .name("bedrock")
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| invalid(&e.to_string()))?
        .into();
    let request = SignableRequest::new("POST", url, signed.into_iter(), SignableBody::Bytes(body))
        .map_err(|e| invalid(&e.to_string()))?;
    let expected = sign(request, &params)
        .map_err(|e| invalid(&e.to_string()))?
        .signature()
        .to_owned();
    if expected != signature {
        return Err(invalid(MISMATCH));
    }
    Ok(())
}

/// `20261207T153000Z`.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let at = time::PrimitiveDateTime::parse(text, format).ok()?;
    Some(at.assume_utc().into())
}

fn frame(headers: &[(&str, &str)], payload: Vec<u8>) -> Bytes {
    let message = Message::new_from_parts(
        headers
            .iter()
            .map(|(name, value)| {
                Header::new(
                    name.to_string(),
                    FrameValue::String(value.to_string().into()),
                )
            })
            .collect(),
        payload,
    );
    let mut out = Vec::new();
    write_message_to(&message, &mut out).expect("an event-stream frame");
    Bytes::from(out)
}

/// A `chunk` event carrying `event` (any text: a test may break it), as Bedrock pads it.
pub fn chunk_frame(event: &str) -> Bytes {
    let bytes = base64::engine::general_purpose::STANDARD.encode(event);
    let payload = json!({"bytes": bytes, "p": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"});
    frame(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().into_bytes(),
    )
}

/// An exception message in the stream (`throttlingException`, `modelStreamErrorException`...).
pub fn exception_frame(kind: &str, message: &str) -> Bytes {
    frame(
        &[
            (":exception-type", kind),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        json!({"message": message}).to_string().into_bytes(),
    )
}

/// The Messages stream's SSE events as Bedrock's frames, the last with Bedrock's invocation
/// metrics.
pub fn frames(sse_events: &[String], usage: &MockUsage) -> Vec<Bytes> {
    let count = sse_events.len();
    sse_events
        .iter()
        .enumerate()
        .filter_map(|(i, event)| {
            let data = event.lines().find_map(|l| l.strip_prefix("data: "))?;
            let mut data: Value = serde_json::from_str(data).ok()?;
            if i + 1 == count {
                data["amazon-bedrock-invocationMetrics"] = json!({
                    "inputTokenCount": usage.input, "outputTokenCount": usage.output,
                    "invocationLatency": 120, "firstByteLatency": 40});
            }
            Some(chunk_frame(&data.to_string()))
        })
        .collect()
}
