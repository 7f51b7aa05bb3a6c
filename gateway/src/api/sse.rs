//! Server-sent events as the API writes them. A frame is serialized straight into the bytes
//! sent and costs one allocation of exactly its size; axum's `Event` starts a buffer per field,
//! grows it for the data, then wraps it: four or five allocations a frame (docs/benchmarks.md,
//! "Where a turn's allocations go").

use std::cell::RefCell;
use std::convert::Infallible;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Serialize;

/// A scratch buffer larger than this after a frame is let go, so that one large frame does not
/// keep its memory on the thread.
const SCRATCH_KEPT: usize = 16 * 1024;

thread_local! {
    /// Where a frame is written before it is copied out at its size.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The response of a stream of frames.
pub fn response(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(frames.map(Ok::<_, Infallible>)),
    )
        .into_response()
}

/// A frame whose data is `data` as JSON, named `event` when given.
pub fn json(event: Option<&str>, data: &impl Serialize) -> Bytes {
    write(event, |buf| {
        let start = buf.len();
        // Our own types always serialize; were one not to, the frame keeps empty data, as
        // axum's `Event` was given before.
        if serde_json::to_writer(&mut *buf, data).is_err() {
            buf.truncate(start);
        }
    })
}

/// A frame whose data is `data`, which is one line (JSON or a marker such as `[DONE]`).
pub fn text(event: Option<&str>, data: &str) -> Bytes {
    write(event, |buf| buf.extend_from_slice(data.as_bytes()))
}

fn write(event: Option<&str>, data: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        if let Some(event) = event {
            buf.extend_from_slice(b"event: ");
            buf.extend_from_slice(event.as_bytes());
            buf.push(b'\n');
        }
        buf.extend_from_slice(b"data: ");
        data(buf);
        buf.extend_from_slice(b"\n\n");
        let frame = Bytes::copy_from_slice(buf);
        if buf.capacity() > SCRATCH_KEPT {
            *buf = Vec::new();
        }
        frame
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_frame_is_the_event_line_then_one_data_line() {
        let frame = json(Some("ping"), &serde_json::json!({"type": "ping"}));
        assert_eq!(&frame[..], b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
    }

    #[test]
    fn an_unnamed_frame_is_its_data_line() {
        assert_eq!(&text(None, "[DONE]")[..], b"data: [DONE]\n\n");
    }

    #[test]
    fn a_large_frame_leaves_no_large_buffer_behind() {
        let large = "x".repeat(SCRATCH_KEPT * 2);
        assert_eq!(text(None, &large).len(), large.len() + 8);
        assert_eq!(SCRATCH.with_borrow(Vec::capacity), 0);
    }
}
