//! The AWS event stream (`application/vnd.amazon.eventstream`) as Bedrock's
//! `InvokeModelWithResponseStream` sends it: binary frames (a prelude with the lengths and its
//! CRC, headers, a payload, the message's CRC), decoded and checked by
//! `aws-smithy-eventstream`. An `event` message of type `chunk` carries `{"bytes": base64}`,
//! the base64 of one Messages API stream event, which is handed on as the SSE reader hands on
//! an event's data, so the `anthropic` decoder reads both. An `exception` message (or an
//! `error` one) ends the stream with the matching `ProviderError`; its text is only logged.

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde::Deserialize;

use super::http::{self, SseEvent};
use super::ProviderError;

/// Reads frames as bytes arrive and yields the Messages events their chunks carry.
pub struct EventStreamReader<S> {
    bytes: S,
    buffer: BytesMut,
    frames: MessageFrameDecoder,
}

#[derive(Deserialize)]
struct Chunk {
    bytes: String,
}

impl<S> EventStreamReader<S>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Unpin,
{
    pub fn new(bytes: S) -> Self {
        Self {
            bytes,
            buffer: BytesMut::new(),
            frames: MessageFrameDecoder::new(),
        }
    }

    /// The next chunk's event; `None` at the end of the body (a frame cut short is the
    /// decoder's business: the stream then ends without its last event).
    pub async fn next(&mut self) -> Result<Option<SseEvent>, ProviderError> {
        loop {
            match self.frames.decode_frame(&mut self.buffer) {
                Ok(DecodedFrame::Complete(message)) => match chunk(&message)? {
                    Some(event) => return Ok(Some(event)),
                    None => continue,
                },
                Ok(DecodedFrame::Incomplete) => {}
                Err(e) => return Err(http::malformed("event stream frame", e)),
            }
            match self.bytes.next().await {
                Some(Ok(bytes)) => self.buffer.extend_from_slice(&bytes),
                Some(Err(e)) => return Err(http::transport_error(e)),
                None => return Ok(None),
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
fn chunk(message: &Message) -> Result<Option<SseEvent>, ProviderError> {
    match header(message, ":message-type") {
        Some("event") => {}
        Some("exception") => {
            let kind = header(message, ":exception-type").unwrap_or_default();
            tracing::warn!(
                kind,
                message = %String::from_utf8_lossy(message.payload()),
                "upstream event stream carried an exception"
            );
            return Err(exception_error(kind));
        }
        other => {
            tracing::warn!(
                message_type = ?other,
                code = ?header(message, ":error-code"),
                "upstream event stream carried an error"
            );
            return Err(ProviderError::Upstream);
        }
    }
    if header(message, ":event-type") != Some("chunk") {
        tracing::debug!(kind = ?header(message, ":event-type"), "skipped an upstream event");
        return Ok(None);
    }
    let chunk: Chunk = serde_json::from_slice(message.payload())
        .map_err(|e| http::malformed("event stream chunk", e))?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(chunk.bytes)
        .map_err(|e| http::malformed("event stream chunk bytes", e))?;
    Ok(Some(SseEvent { data: data.into() }))
}

/// Bedrock's exceptions, by the name they carry in a stream (`throttlingException`) or in the
/// `x-amzn-ErrorType` of an error response (`ThrottlingException`): throttles and a model not
/// ready yet are the upstream limiting us (the next upstream, 529 when none is left), as the
/// Messages API's 429 and 529 are; a model timeout is a timeout; a validation error of the
/// content is the client's to fix.
fn exception_error(kind: &str) -> ProviderError {
    let mut name = kind.to_owned();
    if let Some(first) = name.get_mut(0..1) {
        first.make_ascii_lowercase();
    }
    match name.as_str() {
        "throttlingException" | "modelNotReadyException" | "serviceQuotaExceededException" => {
            ProviderError::Overloaded
        }
        "modelTimeoutException" => ProviderError::Timeout,
        "validationException" => http::status_error(StatusCode::BAD_REQUEST),
        _ => ProviderError::Upstream,
    }
}

/// An error response: by its `x-amzn-ErrorType` where that tells more than the status
/// (a quota exceeded is a 400 that is a throttle), else as any upstream's status.
pub fn status_error(status: StatusCode, headers: &HeaderMap) -> ProviderError {
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
    match exception_error(kind) {
        ProviderError::Upstream => http::status_error(status),
        known => known,
    }
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

    async fn read(body: Vec<u8>, cuts: &[usize]) -> Result<Vec<Bytes>, ProviderError> {
        let mut pieces = Vec::new();
        let mut last = 0;
        for &cut in cuts.iter().chain(std::iter::once(&body.len())) {
            pieces.push(Ok(Bytes::copy_from_slice(&body[last..cut])));
            last = cut;
        }
        let mut reader = EventStreamReader::new(futures::stream::iter(pieces));
        let mut out = Vec::new();
        while let Some(event) = reader.next().await? {
            out.push(event.data);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn chunks_cut_anywhere_yield_their_decoded_events_in_order() {
        let mut body = chunk_frame(r#"{"type":"message_start"}"#);
        body.extend(frame(
            &[(":event-type", "other"), (":message-type", "event")],
            b"{}",
        ));
        body.extend(chunk_frame(r#"{"type":"message_stop"}"#));
        for cut in 0..=body.len() {
            let events = read(body.clone(), &[cut]).await.expect("a good stream");
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

    #[tokio::test]
    async fn a_frame_whose_crc_does_not_match_is_an_upstream_error() {
        let mut body = chunk_frame(r#"{"type":"message_start"}"#);
        let last = body.len() - 1;
        body[last] ^= 0xff;
        assert!(matches!(
            read(body, &[]).await,
            Err(ProviderError::Upstream)
        ));
    }

    #[tokio::test]
    async fn exceptions_in_the_stream_map_to_throttles_timeouts_or_upstream_errors() {
        let exception = |kind: &str| {
            frame(
                &[
                    (":exception-type", kind),
                    (":content-type", "application/json"),
                    (":message-type", "exception"),
                ],
                br#"{"message":"bedrock says no"}"#,
            )
        };
        let error = |kind: &'static str| async move { read(exception(kind), &[]).await };
        assert!(matches!(
            error("throttlingException").await,
            Err(ProviderError::Overloaded)
        ));
        assert!(matches!(
            error("modelTimeoutException").await,
            Err(ProviderError::Timeout)
        ));
        assert!(matches!(
            error("modelStreamErrorException").await,
            Err(ProviderError::Upstream)
        ));
        assert!(matches!(
            error("internalServerException").await,
            Err(ProviderError::Upstream)
        ));
    }

    #[test]
    fn an_error_response_is_read_by_its_error_type_then_its_status() {
        let headers = |kind: &str| {
            let mut headers = HeaderMap::new();
            let value = format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/");
            headers.insert("x-amzn-errortype", value.parse().expect("a header value"));
            headers
        };
        assert!(matches!(
            status_error(
                StatusCode::BAD_REQUEST,
                &headers("ServiceQuotaExceededException")
            ),
            ProviderError::Overloaded
        ));
        assert!(matches!(
            status_error(
                StatusCode::TOO_MANY_REQUESTS,
                &headers("ThrottlingException")
            ),
            ProviderError::Overloaded
        ));
        assert!(matches!(
            status_error(StatusCode::BAD_REQUEST, &headers("ValidationException")),
            ProviderError::Rejected(_)
        ));
        assert!(matches!(
            status_error(StatusCode::FORBIDDEN, &headers("InvalidSignatureException")),
            ProviderError::Upstream
        ));
        assert!(matches!(
            status_error(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new()),
            ProviderError::Upstream
        ));
    }
}
