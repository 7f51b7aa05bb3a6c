//! What the HTTP adapters share: pooled reqwest clients, the three timeouts, the mapping of
//! upstream statuses and transport failures onto `ProviderError`, and the SSE reader that
//! turns a response body into events one at a time (the AWS event stream's reader is
//! `eventstream`).
//!
//! Adapters always ask the upstream for a stream, whatever the client asked for: a stream
//! tells a slow first byte from a long answer, bills a cut turn by what was generated, and a
//! non-streaming client response is gathered by the turn from the same events.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use reqwest::StatusCode;

use super::eventstream::{self, FrameReader};
use super::{EventStream, ProviderError, ProviderEvent};
use crds::config::{Timeouts, Upstream};

/// How many calls one reqwest client carries at once. Over HTTP/2 a client keeps one
/// connection per upstream host, and servers cap the streams of a connection (100 to 256 is
/// usual); past the cap hyper queues a call instead of opening another connection, so a
/// streamed turn would wait for another to end. Past this count a call gets another client,
/// with connections of its own. (Over HTTP/1.1 each call has a connection anyway.)
const CALLS_PER_CLIENT: usize = 100;

/// The upstream clients, by what reqwest sets per client: the connect timeout, and cleartext
/// HTTP/2.
#[derive(Default)]
pub struct Clients {
    by_kind: Mutex<HashMap<(u64, bool), Vec<Pooled>>>,
}

struct Pooled {
    client: reqwest::Client,
    calls: Arc<AtomicUsize>,
}

/// A call in flight on one client; counted until dropped (with the response body).
pub struct Call(Arc<AtomicUsize>);

impl Drop for Call {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Clients {
    /// A client for a call to `upstream`: the first of its kind with room for one more call.
    pub fn get(&self, upstream: &Upstream) -> Result<(reqwest::Client, Call), ProviderError> {
        let kind = (upstream.timeouts.connect_ms, upstream.http2);
        let mut by_kind = self.by_kind.lock().unwrap_or_else(|e| e.into_inner());
        let clients = by_kind.entry(kind).or_default();
        let free = clients
            .iter()
            .find(|c| c.calls.load(Ordering::Relaxed) < CALLS_PER_CLIENT);
        let pooled = match free {
            Some(pooled) => pooled,
            None => {
                clients.push(Pooled {
                    client: build(upstream)?,
                    calls: Arc::default(),
                });
                clients.last().ok_or(ProviderError::Unavailable)?
            }
        };
        pooled.calls.fetch_add(1, Ordering::Relaxed);
        Ok((pooled.client.clone(), Call(pooled.calls.clone())))
    }
}

fn build(upstream: &Upstream) -> Result<reqwest::Client, ProviderError> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(upstream.timeouts.connect_ms))
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true);
    if upstream.http2 {
        builder = builder.http2_prior_knowledge();
    }
    builder.build().map_err(|e| {
        tracing::error!(error = %e, "cannot build the upstream HTTP client");
        ProviderError::Unavailable
    })
}

/// Turns one upstream SSE event into canonical events; `end` is called when the body ends.
pub trait Decoder: Send + 'static {
    /// Whether an error answer's body is read and given to [`Decoder::error`]: for upstreams
    /// whose body says more than the status (Google's throttles carry their wait there).
    const READS_ERROR_BODY: bool = false;

    fn event(&mut self, event: SseEvent) -> Result<Vec<ProviderEvent>, ProviderError>;
    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError>;

    /// The upstream's own reading of an error answer; `None` keeps the shared one
    /// ([`status_error`], the wait from the headers).
    fn error(&self, _status: StatusCode, _body: &[u8]) -> Option<ProviderError> {
        None
    }
}

/// How an upstream's response body is cut into events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Server-sent events (the Messages API, chat completions).
    Sse,
    /// The AWS event stream (`application/vnd.amazon.eventstream`, Bedrock): binary frames
    /// whose `chunk` events carry the Messages API's events, base64-encoded.
    AwsEventStream,
}

/// A response body read as `Framing` says.
enum Body<S> {
    Sse(SseReader<S>),
    AwsEventStream { bytes: S, frames: FrameReader },
}

impl<S> Body<S>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Unpin,
{
    fn new(bytes: S, framing: Framing) -> Self {
        match framing {
            Framing::Sse => Self::Sse(SseReader::new(bytes)),
            Framing::AwsEventStream => Self::AwsEventStream {
                bytes,
                frames: FrameReader::default(),
            },
        }
    }

    /// The next event's data; `None` at the end of the body.
    async fn next(&mut self) -> Result<Option<SseEvent>, ProviderError> {
        let (bytes, frames) = match self {
            Self::Sse(reader) => return reader.next().await,
            Self::AwsEventStream { bytes, frames } => (bytes, frames),
        };
        loop {
            match frames.next() {
                Ok(Some(data)) => return Ok(Some(SseEvent { data })),
                Ok(None) => {}
                Err(eventstream::Failure::Malformed(e)) => {
                    return Err(malformed("event stream frame", e))
                }
                Err(eventstream::Failure::Exception(status)) => {
                    return Err(status.map_or(ProviderError::Upstream, status_error))
                }
            }
            match bytes.next().await {
                Some(Ok(chunk)) => frames.push(&chunk),
                Some(Err(e)) => return Err(transport_error(e)),
                None => return Ok(None),
            }
        }
    }
}

/// Sends the request and waits, within the first-byte timeout, for the first canonical event,
/// so that every failure before anything reached the client can still fall back. The rest of
/// the body is read lazily, each chunk within the idle timeout; dropping the stream drops the
/// connection, which cancels the upstream call. `call` is counted until then.
pub async fn open<D: Decoder>(
    request: reqwest::RequestBuilder,
    call: Call,
    timeouts: Timeouts,
    framing: Framing,
    decoder: D,
) -> Result<EventStream, ProviderError> {
    open_mapping(request, call, timeouts, framing, decoder, |status| status).await
}

/// [`open`], with an upstream's error status first told to `statuses`, which may note it and
/// gives the status of the same meaning `status_error` reads (Vertex AI's 503 is its
/// overload, as a 529 is the Messages API's).
pub async fn open_mapping<D: Decoder>(
    request: reqwest::RequestBuilder,
    call: Call,
    timeouts: Timeouts,
    framing: Framing,
    mut decoder: D,
    statuses: impl FnOnce(StatusCode) -> StatusCode + Send,
) -> Result<EventStream, ProviderError> {
    let first_byte = Duration::from_millis(timeouts.first_byte_ms);
    let idle = Duration::from_millis(timeouts.idle_ms);
    let opening = async {
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        if !status.is_success() {
            let waited = retry_after(response.headers());
            if D::READS_ERROR_BODY {
                let body = response.bytes().await.unwrap_or_default();
                if let Some(error) = decoder.error(status, &body) {
                    return Err(match error {
                        ProviderError::Overloaded { retry_after: None } => {
                            ProviderError::Overloaded {
                                retry_after: waited,
                            }
                        }
                        error => error,
                    });
                }
                return Err(match status_error(status) {
                    ProviderError::Overloaded { .. } => ProviderError::Overloaded {
                        retry_after: waited,
                    },
                    error => error,
                });
            }
            let error = status_error(match framing {
                Framing::Sse => statuses(status),
                Framing::AwsEventStream => eventstream::error_status(status, response.headers()),
            });
            return Err(match error {
                ProviderError::Overloaded { .. } => ProviderError::Overloaded {
                    retry_after: retry_after(response.headers()),
                },
                error => error,
            });
        }
        let mut body = Body::new(response.bytes_stream(), framing);
        let mut ready = VecDeque::new();
        while ready.is_empty() {
            match body.next().await? {
                Some(event) => ready.extend(decoder.event(event)?),
                None => {
                    ready.extend(decoder.end()?);
                    break;
                }
            }
        }
        Ok((body, ready))
    };
    let (mut body, ready) = tokio::time::timeout(first_byte, opening)
        .await
        .map_err(|_| ProviderError::Timeout)??;
    Ok(Box::pin(async_stream::stream! {
        let _call = call;
        let mut finished = false;
        for event in ready {
            finished |= matches!(event, ProviderEvent::Finish { .. });
            yield Ok(event);
        }
        while !finished {
            let next = match tokio::time::timeout(idle, body.next()).await {
                Ok(next) => next,
                Err(_) => Err(ProviderError::Timeout),
            };
            let events = match next {
                Ok(Some(event)) => decoder.event(event),
                Ok(None) => decoder.end().and_then(|events| {
                    if events.iter().any(|e| matches!(e, ProviderEvent::Finish { .. })) {
                        Ok(events)
                    } else {
                        tracing::warn!("upstream stream ended before its last event");
                        Err(ProviderError::Upstream)
                    }
                }),
                Err(e) => Err(e),
            };
            match events {
                Ok(events) => {
                    for event in events {
                        finished |= matches!(event, ProviderEvent::Finish { .. });
                        yield Ok(event);
                    }
                }
                Err(e) => {
                    yield Err(e);
                    return;
                }
            }
        }
    }))
}

/// Sends a request whose answer is read whole (embeddings: nothing streams), within the
/// first-byte timeout for the status and the idle timeout for the body, mapping a refusal as
/// [`open`] does. `call` is counted until the body is read.
pub async fn whole(
    request: reqwest::RequestBuilder,
    call: Call,
    timeouts: Timeouts,
) -> Result<Bytes, ProviderError> {
    let _call = call;
    let first_byte = Duration::from_millis(timeouts.first_byte_ms);
    let idle = Duration::from_millis(timeouts.idle_ms);
    let response = tokio::time::timeout(first_byte, request.send())
        .await
        .map_err(|_| ProviderError::Timeout)?
        .map_err(transport_error)?;
    let status = response.status();
    if !status.is_success() {
        return Err(match status_error(status) {
            ProviderError::Overloaded { .. } => ProviderError::Overloaded {
                retry_after: retry_after(response.headers()),
            },
            error => error,
        });
    }
    tokio::time::timeout(idle, response.bytes())
        .await
        .map_err(|_| ProviderError::Timeout)?
        .map_err(transport_error)
}

/// When a throttled upstream said to come back: `retry-after-ms` (Azure OpenAI, OpenAI), else
/// `retry-after` in seconds (every API here sends seconds; an HTTP date is not read).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    number("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| number("retry-after"))
        .map(|secs| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// Statuses: a rejection of the request's content is the client's to fix (400); everything
/// else is the upstream's or our configuration's, and may fall back.
pub fn status_error(status: StatusCode) -> ProviderError {
    tracing::warn!(
        status = status.as_u16(),
        "upstream answered with an error status"
    );
    match status.as_u16() {
        400 | 413 | 422 => ProviderError::Rejected(
            "the model rejected the request's content; check the messages, tools and images \
             against the API reference"
                .to_owned(),
        ),
        408 | 504 => ProviderError::Timeout,
        429 | 529 => ProviderError::overloaded(),
        _ => ProviderError::Upstream,
    }
}

pub fn transport_error(e: reqwest::Error) -> ProviderError {
    tracing::warn!(error = %e, "upstream request failed");
    if e.is_timeout() {
        ProviderError::Timeout
    } else if e.is_connect() {
        ProviderError::Unavailable
    } else {
        ProviderError::Upstream
    }
}

/// A malformed chunk from the upstream: logged here, never shown to the client.
pub fn malformed(what: &str, e: impl std::fmt::Display) -> ProviderError {
    tracing::warn!(error = %e, what, "malformed upstream event");
    ProviderError::Upstream
}

/// An event's data: its `data:` lines joined. The event's name is not kept: every format we
/// read names the event inside its data too. A one-line event (nearly all) is a slice of the
/// bytes that came, not a copy. (An AWS event stream's `chunk` gives its decoded `bytes`.)
#[derive(Debug, Default, PartialEq)]
pub struct SseEvent {
    pub data: Bytes,
}

/// Server-sent events from a byte stream, split at blank lines as they arrive.
pub struct SseReader<S> {
    bytes: S,
    buffer: BytesMut,
    /// Where the search for the blank line that ends the first event resumes: the bytes
    /// before it hold none, so each byte is searched once however many events a chunk holds.
    searched: usize,
}

impl<S> SseReader<S>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Unpin,
{
    pub fn new(bytes: S) -> Self {
        Self {
            bytes,
            buffer: BytesMut::new(),
            searched: 0,
        }
    }

    /// The next event with data; `None` at the end of the body.
    pub async fn next(&mut self) -> Result<Option<SseEvent>, ProviderError> {
        loop {
            if let Some(event) = self.take_event()? {
                if !event.data.is_empty() {
                    return Ok(Some(event));
                }
                continue;
            }
            match self.bytes.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(transport_error(e)),
                None => {
                    if self.buffer.iter().all(u8::is_ascii_whitespace) {
                        return Ok(None);
                    }
                    self.buffer.extend_from_slice(b"\n\n");
                }
            }
        }
    }

    fn take_event(&mut self) -> Result<Option<SseEvent>, ProviderError> {
        let Some((end, gap)) = find_blank_line(&self.buffer, self.searched) else {
            // A blank line's first bytes may be the last of what came: look at them again.
            self.searched = self.buffer.len().saturating_sub(BLANK_LINE_MAX - 1);
            return Ok(None);
        };
        let raw = self.buffer.split_to(end + gap).freeze();
        self.searched = 0;
        let text = std::str::from_utf8(&raw[..end]).map_err(|e| malformed("sse", e))?;
        let mut lines = text.lines().filter_map(|line| {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            (field == "data").then(|| value.strip_prefix(' ').unwrap_or(value))
        });
        let data = match (lines.next(), lines.next()) {
            (None, _) => Bytes::new(),
            (Some(only), None) => raw.slice_ref(only.as_bytes()),
            (Some(first), Some(second)) => {
                let mut joined = BytesMut::from(first);
                for line in std::iter::once(second).chain(lines) {
                    joined.extend_from_slice(b"\n");
                    joined.extend_from_slice(line.as_bytes());
                }
                joined.freeze()
            }
        };
        Ok(Some(SseEvent { data }))
    }
}

/// The longest blank line that ends an event: `\r\n\r\n`.
const BLANK_LINE_MAX: usize = 4;

/// Where the first event ends (searching from `from`), and the length of the blank line that
/// ends it (`\n\n` or `\r\n\r\n`). One pass over the line feeds.
fn find_blank_line(buffer: &[u8], from: usize) -> Option<(usize, usize)> {
    memchr::memchr_iter(b'\n', buffer.get(from..)?).find_map(|at| {
        let lf = from + at;
        if buffer.get(lf + 1) == Some(&b'\n') {
            Some((lf, 2))
        } else if lf >= 1 && buffer[lf - 1] == b'\r' && buffer.get(lf + 1..lf + 3) == Some(b"\r\n")
        {
            Some((lf - 1, 4))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn events(chunks: &[&str]) -> Vec<SseEvent> {
        let chunks: Vec<Result<Bytes, reqwest::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from(c.to_string())))
            .collect();
        let mut reader = SseReader::new(futures::stream::iter(chunks));
        let mut out = Vec::new();
        while let Some(event) = reader.next().await.expect("well-formed") {
            out.push(event);
        }
        out
    }

    #[tokio::test]
    async fn events_split_across_chunks_are_joined() {
        let got = events(&[
            "event: a\nda",
            "ta: {\"x\"",
            ":1}\n\n: comment\n\ndata: [DONE]\n\n",
        ])
        .await;
        assert_eq!(
            got,
            vec![
                SseEvent {
                    data: Bytes::from_static(b"{\"x\":1}")
                },
                SseEvent {
                    data: Bytes::from_static(b"[DONE]")
                },
            ]
        );
    }

    #[tokio::test]
    async fn crlf_separated_events_and_a_last_event_without_blank_line_are_read() {
        let got = events(&["data: 1\r\n\r\ndata: 2"]).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].data, "2".as_bytes());
    }

    #[tokio::test]
    async fn a_stream_cut_into_chunks_at_any_two_points_reads_the_same_events() {
        let whole =
            "event: a\r\ndata: 1\r\n\r\ndata: 2\n\n: ping\n\nevent: b\ndata: 3\ndata: 4\n\n";
        let expected = events(&[whole]).await;
        assert_eq!(expected.len(), 3, "{expected:?}");
        assert_eq!(expected[2].data, "3\n4".as_bytes());
        for i in 0..=whole.len() {
            for j in i..=whole.len() {
                let got = events(&[&whole[..i], &whole[i..j], &whole[j..]]).await;
                assert_eq!(got, expected, "cut at {i} and {j}");
            }
        }
    }

    #[test]
    fn a_throttles_wait_is_read_in_milliseconds_first_then_in_seconds() {
        let wait = |headers: &[(&'static str, &'static str)]| {
            let mut map = reqwest::header::HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, reqwest::header::HeaderValue::from_static(value));
            }
            retry_after(&map)
        };
        let ms = Duration::from_millis;
        assert_eq!(wait(&[("retry-after", "2")]), Some(ms(2000)));
        assert_eq!(wait(&[("retry-after-ms", "1500")]), Some(ms(1500)));
        assert_eq!(
            wait(&[("retry-after", "9"), ("retry-after-ms", "250")]),
            Some(ms(250))
        );
        assert_eq!(wait(&[]), None);
        assert_eq!(
            wait(&[("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT")]),
            None
        );
        assert_eq!(wait(&[("retry-after", "-3")]), None);
    }
}
