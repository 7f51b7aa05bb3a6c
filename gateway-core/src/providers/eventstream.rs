//! The AWS event stream (`application/vnd.amazon.eventstream`) as Bedrock's
//! `InvokeModelWithResponseStream` sends it: binary frames (a prelude with the lengths and its
//! CRC, headers, a payload, the message's CRC), decoded and checked by
//! `aws-smithy-eventstream`. An `event` message of type `chunk` carries `{"bytes": base64}`,
//! the base64 of one Messages API stream event, which is handed on as the SSE reader hands on
//! an event's data, so the `anthropic` decoder reads both. An `exception` message (or an
//! `error` one) ends the stream as the status Bedrock gives that exception would; its text is
//! only logged. This module only decodes; `http` reads the body and maps the failures.

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde::Deserialize;

/// Cuts the bytes that came into frames and yields the Messages events their chunks carry.
/// It only decodes: the HTTP reader (`http`) feeds it and maps its failures.
#[derive(Default)]
pub struct FrameReader {
    buffer: BytesMut,
    frames: MessageFrameDecoder,
}

/// Why a stream cannot go on.
#[derive(Debug, PartialEq)]
pub enum Failure {
    /// A frame or a chunk that does not decode (a CRC that does not match, bad base64...).
    Malformed(String),
    /// An exception message, as the HTTP status Bedrock gives the same exception in a response
    /// (`None`: one with no such meaning, an upstream error).
    Exception(Option<StatusCode>),
}

#[derive(Deserialize)]
struct Chunk {
    bytes: String,
}

impl FrameReader {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next chunk's event; `None` until more bytes are pushed (a frame cut short at the
    /// end of the body is the stream ending without its last event).
    pub fn next(&mut self) -> Result<Option<Bytes>, Failure> {
        loop {
            match self.frames.decode_frame(&mut self.buffer) {
                Ok(DecodedFrame::Complete(message)) => {
                    if let Some(event) = chunk(&message)? {
                        return Ok(Some(event));
                    }
                }
                Ok(DecodedFrame::Incomplete) => return Ok(None),
                Err(e) => return Err(Failure::Malformed(e.to_string())),
            }
        }
    }
}

fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| match h.value() {
            HeaderValue::String(value) => Some(value.as_str()),
            _ => None,
        })
}

/// A `chunk` event's Messages event; `None` for events of other types (skipped, as the
/// Messages decoder skips event types it does not know).
fn chunk(message: &Message) -> Result<Option<Bytes>, Failure> {
    match header(message, ":message-type") {
        Some("event") => {}
        Some("exception") => {
            let kind = header(message, ":exception-type").unwrap_or_default();
            tracing::warn!(
                kind,
                message = %String::from_utf8_lossy(message.payload()),
                "upstream event stream carried an exception"
            );
            return Err(Failure::Exception(exception_status(kind)));
        }
        other => {
            tracing::warn!(
                message_type = ?other,
                code = ?header(message, ":error-code"),
                "upstream event stream carried an error"
            );
            return Err(Failure::Exception(None));
        }
    }
    if header(message, ":event-type") != Some("chunk") {
        tracing::debug!(kind = ?header(message, ":event-type"), "skipped an upstream event");
        return Ok(None);
    }
    let chunk: Chunk =
        serde_json::from_slice(message.payload()).map_err(|e| Failure::Malformed(e.to_string()))?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(chunk.bytes)
        .map_err(|e| Failure::Malformed(e.to_string()))?;
    Ok(Some(data.into()))
}

/// Bedrock's exceptions, by the name they carry in a stream (`throttlingException`) or in the
/// `x-amzn-ErrorType` of an error response (`ThrottlingException`), as the status that says
/// the same to the fallback rules: throttles, a model not ready yet and an exceeded quota are
/// the upstream limiting us (429, as the Messages API's 429 and 529), a model timeout is a
/// timeout (408), a validation error is the content's (400); the rest says nothing more.
fn exception_status(kind: &str) -> Option<StatusCode> {
    let mut name = kind.to_owned();
    if let Some(first) = name.get_mut(0..1) {
        first.make_ascii_lowercase();
    }
    match name.as_str() {
        "throttlingException" | "modelNotReadyException" | "serviceQuotaExceededException" => {
            Some(StatusCode::TOO_MANY_REQUESTS)
        }
        "modelTimeoutException" => Some(StatusCode::REQUEST_TIMEOUT),
        "validationException" => Some(StatusCode::BAD_REQUEST),
        _ => None,
    }
}

/// The status an error response is read as: its `x-amzn-ErrorType`'s where that tells more
/// (a quota exceeded is a 400 that is a throttle), else its own.
pub fn error_status(status: StatusCode, headers: &HeaderMap) -> StatusCode {
    let kind = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(':').next().unwrap_or_default())
        .unwrap_or_default();
    tracing::warn!(
        status = status.as_u16(),
        kind,
        "upstream answered with an error"
    );
    exception_status(kind).unwrap_or(status)
}

#[cfg(test)]
mod tests {
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::Header;

    use super::*;

    fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
        let message = Message::new_from_parts(
            headers
                .iter()
                .map(|(name, value)| {
                    Header::new(
                        name.to_string(),
                        HeaderValue::String(value.to_string().into()),
                    )
                })
                .collect(),
            Bytes::copy_from_slice(payload),
        );
        let mut out = Vec::new();
        write_message_to(&message, &mut out).expect("a frame");
        out
    }

    fn chunk_frame(event: &str) -> Vec<u8> {
        let bytes = base64::engine::general_purpose::STANDARD.encode(event);
        let payload = format!(r#"{{"bytes":"{bytes}","p":"abcdefgh"}}"#);
        frame(
            &[
                (":event-type", "chunk"),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            payload.as_bytes(),
        )
    }

    /// Pushes `body` in the pieces `cuts` make, reading events as they come.
    fn read(body: &[u8], cuts: &[usize]) -> Result<Vec<Bytes>, Failure> {
        let mut reader = FrameReader::default();
        let mut out = Vec::new();
        let mut last = 0;
        for &cut in cuts.iter().chain(std::iter::once(&body.len())) {
            reader.push(&body[last..cut]);
            last = cut;
            while let Some(event) = reader.next()? {
                out.push(event);
            }
        }
        Ok(out)
    }

    #[test]
    fn chunks_cut_anywhere_yield_their_decoded_events_in_order() {
        let mut body = chunk_frame(r#"{"type":"message_start"}"#);
        body.extend(frame(
            &[(":event-type", "other"), (":message-type", "event")],
            b"{}",
        ));
        body.extend(chunk_frame(r#"{"type":"message_stop"}"#));
        for cut in 0..=body.len() {
            let events = read(&body, &[cut]).expect("a good stream");
            assert_eq!(
                events,
                vec![
                    Bytes::from_static(br#"{"type":"message_start"}"#),
                    Bytes::from_static(br#"{"type":"message_stop"}"#)
                ],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_frame_whose_crc_does_not_match_is_malformed() {
        let mut body = chunk_frame(r#"{"type":"message_start"}"#);
        let last = body.len() - 1;
        body[last] ^= 0xff;
        assert!(matches!(read(&body, &[]), Err(Failure::Malformed(_))));
    }

    #[test]
    fn exceptions_in_the_stream_read_as_throttles_timeouts_or_upstream_errors() {
        let exception = |kind: &str| {
            let body = frame(
                &[
                    (":exception-type", kind),
                    (":content-type", "application/json"),
                    (":message-type", "exception"),
                ],
                br#"{"message":"bedrock says no"}"#,
            );
            read(&body, &[]).expect_err("an exception")
        };
        assert_eq!(
            exception("throttlingException"),
            Failure::Exception(Some(StatusCode::TOO_MANY_REQUESTS))
        );
        assert_eq!(
            exception("modelTimeoutException"),
            Failure::Exception(Some(StatusCode::REQUEST_TIMEOUT))
        );
        assert_eq!(
            exception("modelStreamErrorException"),
            Failure::Exception(None)
        );
        assert_eq!(
            exception("internalServerException"),
            Failure::Exception(None)
        );
    }

    #[test]
    fn an_error_response_is_read_by_its_error_type_then_its_status() {
        let headers = |kind: &str| {
            let mut headers = HeaderMap::new();
            let value = format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/");
            headers.insert("x-amzn-errortype", value.parse().expect("a header value"));
            headers
        };
        let bad_request = StatusCode::BAD_REQUEST;
        assert_eq!(
            error_status(bad_request, &headers("ServiceQuotaExceededException")),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            error_status(bad_request, &headers("ValidationException")),
            bad_request
        );
        assert_eq!(
            error_status(StatusCode::FORBIDDEN, &headers("InvalidSignatureException")),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            error_status(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new()),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
