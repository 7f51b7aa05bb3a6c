//! The `gemini` adapter: the Gemini API
//! (`POST {base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse`, the key in the
//! `x-goog-api-key` header; `base_url` defaults to `https://generativelanguage.googleapis.com`).
//! The request is translated by `wire::gemini::translate` (the rules, and what is refused, are
//! there); what is Gemini's in the wire format is the module's, so that Gemini on Vertex AI
//! can share it with another address and credential. Only the endpoint and the stream's
//! reading are here.
//!
//! Stream: each event is a whole `GenerateContentResponse`; a part with `thought: true` is
//! thinking (its `thoughtSignature` the block's signature), `text` a text block, and a
//! `functionCall` a tool_use block that comes whole (its arguments one `input_json_delta`),
//! named by the call's `id` when the model gives one, else by a fresh one. `usageMetadata` is
//! cumulative: the last one counts. The turn ends with the body, once a finish reason came.
//! Errors: a 429 (`RESOURCE_EXHAUSTED`) or a 503 (`UNAVAILABLE`) is the upstream limiting us,
//! its `RetryInfo` the wait; a 400 refusing the key (`API_KEY_INVALID`) is the upstream's
//! failure (502), not the client's; other statuses are mapped as every adapter's are.

use async_trait::async_trait;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::StatusCode;

use super::blocks::Blocks;
use super::http::{self, Clients, Decoder, Framing, SseEvent};
use super::{EventStream, Provider, ProviderCall, ProviderError, ProviderEvent};
use crate::conversation::{Delta, OutputBlock};
use crate::ids;
use crate::tokens::Tokenizer;
use crate::wire::gemini::translate::{
    refuses_the_key, request_to_gemini, retry_delay, stop_from_gemini, usage_from_gemini,
};
use crate::wire::gemini::{GenerateContentResponse, UsageMetadata};
use store::usage::TokenUsage;

/// The Gemini API's address, when the route names none.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// Everything but RFC 3986's unreserved characters is escaped: the model stays one segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub struct Gemini {
    clients: Clients,
    tokens: Tokenizer,
}

impl Gemini {
    pub fn new(tokens: Tokenizer) -> Self {
        Self {
            clients: Clients::default(),
            tokens,
        }
    }
}

/// The streaming endpoint of `model` under `base` (a model named `models/x` as Google's
/// listings name it is `x`).
fn stream_url(base: &str, model: &str) -> String {
    let model = model.strip_prefix("models/").unwrap_or(model);
    format!(
        "{}/v1beta/models/{}:streamGenerateContent?alt=sse",
        base.trim_end_matches('/'),
        utf8_percent_encode(model, SEGMENT)
    )
}

#[async_trait]
impl Provider for Gemini {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError> {
        let upstream = &call.upstream;
        let body = request_to_gemini(&call.request).map_err(|e| ProviderError::Rejected(e.0))?;
        let base = upstream.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL);
        let (client, upstream_call) = self.clients.get(upstream)?;
        let mut request = client
            .post(stream_url(base, &upstream.model))
            .header("accept", "text/event-stream")
            .json(&body);
        if let Some(key) = &upstream.api_key {
            request = request.header("x-goog-api-key", key.expose());
        }
        let stream = Stream::new(self.tokens, call.input_tokens);
        http::open(
            request,
            upstream_call,
            upstream.timeouts,
            Framing::Sse,
            stream,
        )
        .await
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

pub(super) struct Stream {
    blocks: Blocks,
    tokens: Tokenizer,
    input_tokens: u32,
    /// The thinking or text block being streamed, and its key in `blocks`.
    open: Option<(Open, usize)>,
    keys: usize,
    /// Whether the model called a function.
    called: bool,
    /// The finish reason (or the prompt's block reason), once one came.
    finish: Option<String>,
    usage: Option<UsageMetadata>,
    /// Output text, counted when the upstream reports no usage.
    generated: String,
}

impl Stream {
    pub(super) fn new(tokens: Tokenizer, input_tokens: u32) -> Self {
        Self {
            blocks: Blocks::default(),
            tokens,
            input_tokens,
            open: None,
            keys: 0,
            called: false,
            finish: None,
            usage: None,
            generated: String::new(),
        }
    }

    /// Makes `kind` the open block, closing another one first; returns its key.
    fn switch_to(&mut self, kind: Open, out: &mut Vec<ProviderEvent>) -> usize {
        if let Some((open, key)) = self.open {
            if open == kind {
                return key;
            }
            self.blocks.stop(key, out);
        }
        let key = self.next_key();
        let block = match kind {
            Open::Thinking => OutputBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            },
            Open::Text => OutputBlock::Text {
                text: String::new(),
            },
        };
        self.blocks.start(key, block, out);
        self.open = Some((kind, key));
        key
    }

    fn next_key(&mut self) -> usize {
        let key = self.keys;
        self.keys += 1;
        key
    }

    fn finish(&mut self) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        self.blocks.stop_all(&mut out);
        let usage = match &self.usage {
            Some(reported) => usage_from_gemini(reported),
            None => TokenUsage {
                input_tokens: self.input_tokens,
                output_tokens: self.tokens.count(&self.generated),
                ..TokenUsage::default()
            },
        };
        out.push(ProviderEvent::Finish {
            stop_reason: stop_from_gemini(self.finish.as_deref(), self.called),
            stop_sequence: None,
            usage,
        });
        out
    }
}

impl Decoder for Stream {
    const READS_ERROR_BODY: bool = true;

    fn event(&mut self, event: SseEvent) -> Result<Vec<ProviderEvent>, ProviderError> {
        let response: GenerateContentResponse = serde_json::from_slice(&event.data)
            .map_err(|e| http::malformed("gemini response", e))?;
        if let Some(usage) = response.usage_metadata {
            self.usage = Some(usage);
        }
        if let Some(reason) = response.prompt_feedback.and_then(|f| f.block_reason) {
            self.finish = Some(reason);
        }
        let mut out = Vec::new();
        // One candidate is asked for (`candidateCount` is left at 1).
        let Some(candidate) = response.candidates.into_iter().next() else {
            return Ok(out);
        };
        for part in candidate.content.map(|c| c.parts).unwrap_or_default() {
            if part.thought == Some(true) {
                let key = self.switch_to(Open::Thinking, &mut out);
                if let Some(thinking) = part.text {
                    self.generated.push_str(&thinking);
                    self.blocks
                        .delta(key, Delta::Thinking { thinking }, &mut out);
                }
                if let Some(signature) = part.thought_signature {
                    self.blocks
                        .delta(key, Delta::Signature { signature }, &mut out);
                }
                continue;
            }
            // The last event often carries an empty text with the finish reason.
            if let Some(text) = part.text.filter(|t| !t.is_empty()) {
                self.generated.push_str(&text);
                let key = self.switch_to(Open::Text, &mut out);
                self.blocks.delta(key, Delta::Text { text }, &mut out);
            }
            if let Some(call) = part.function_call {
                if let Some((_, key)) = self.open.take() {
                    self.blocks.stop(key, &mut out);
                }
                let key = self.next_key();
                let block = OutputBlock::ToolUse {
                    id: call.id.unwrap_or_else(ids::tool_use),
                    name: call.name,
                    input: serde_json::Value::Object(serde_json::Map::new()),
                };
                self.blocks.start(key, block, &mut out);
                let partial_json = call
                    .args
                    .map_or_else(|| "{}".to_owned(), |args| args.to_string());
                self.generated.push_str(&partial_json);
                self.blocks
                    .delta(key, Delta::InputJson { partial_json }, &mut out);
                self.blocks.stop(key, &mut out);
                self.called = true;
            }
        }
        if let Some(reason) = candidate.finish_reason {
            self.finish = Some(reason);
        }
        Ok(out)
    }

    /// The body's end is the turn's, once a finish reason came (the last event carries it
    /// with the final usage); without one the stream was cut.
    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        if self.finish.is_none() {
            return Ok(Vec::new());
        }
        let events = self.finish();
        self.finish = None;
        Ok(events)
    }

    /// Google's throttle (429 `RESOURCE_EXHAUSTED`) and overload (503 `UNAVAILABLE`) limit
    /// us, for as long as the body's `RetryInfo` says.
    fn error(&self, status: StatusCode, body: &[u8]) -> Option<ProviderError> {
        match status.as_u16() {
            429 | 503 => {
                tracing::warn!(
                    status = status.as_u16(),
                    "upstream answered with an error status"
                );
                Some(ProviderError::Overloaded {
                    retry_after: retry_delay(body),
                })
            }
            // Google refuses a wrong key with a 400: our configuration's fault, not the
            // client's request's.
            400 if refuses_the_key(body) => {
                tracing::error!("the upstream refused the route's API key");
                Some(ProviderError::Upstream)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use store::usage::StopReason;

    use super::*;

    fn stream() -> Stream {
        Stream::new(Tokenizer::default(), 9)
    }

    fn feed(stream: &mut Stream, events: &[&str]) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        for data in events {
            let event = SseEvent {
                data: Bytes::copy_from_slice(data.as_bytes()),
            };
            out.extend(stream.event(event).expect("a well-formed event"));
        }
        out.extend(stream.end().expect("end"));
        out
    }

    #[test]
    fn thoughts_text_and_a_function_call_stream_as_three_blocks_with_the_last_usage() {
        let mut s = stream();
        let events = feed(
            &mut s,
            &[
                r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Let me","thought":true}]}}],"usageMetadata":{"promptTokenCount":10}}"#,
                r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Checking."},{"functionCall":{"name":"get_weather","args":{"city":"Paris"}}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":4,"thoughtsTokenCount":3,"cachedContentTokenCount":6}}"#,
            ],
        );
        let starts: Vec<&OutputBlock> = events
            .iter()
            .filter_map(|e| match e {
                ProviderEvent::BlockStart { block, .. } => Some(block),
                _ => None,
            })
            .collect();
        assert!(
            matches!(starts[0], OutputBlock::Thinking { .. }),
            "{starts:?}"
        );
        assert!(matches!(starts[1], OutputBlock::Text { .. }), "{starts:?}");
        assert!(
            matches!(starts[2], OutputBlock::ToolUse { name, .. } if name == "get_weather"),
            "{starts:?}"
        );
        assert!(events.contains(&ProviderEvent::BlockDelta {
            index: 2,
            delta: Delta::InputJson {
                partial_json: r#"{"city":"Paris"}"#.into()
            },
        }));
        match events.last() {
            Some(ProviderEvent::Finish {
                stop_reason, usage, ..
            }) => {
                assert_eq!(*stop_reason, StopReason::ToolUse);
                assert_eq!(
                    (
                        usage.input_tokens,
                        usage.cache_read_input_tokens,
                        usage.output_tokens
                    ),
                    (4, 6, 7)
                );
            }
            other => panic!("no finish: {other:?}"),
        }
    }

    #[test]
    fn a_body_that_ends_without_a_finish_reason_finishes_nothing() {
        let mut s = stream();
        let events = feed(
            &mut s,
            &[r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}]}}]}"#],
        );
        assert!(!events
            .iter()
            .any(|e| matches!(e, ProviderEvent::Finish { .. })));
    }

    #[test]
    fn the_model_is_one_escaped_segment_of_the_streaming_endpoint() {
        assert_eq!(
            stream_url("https://generativelanguage.googleapis.com/", "models/gemini-2.5-flash"),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            stream_url("http://h", "a/b"),
            "http://h/v1beta/models/a%2Fb:streamGenerateContent?alt=sse"
        );
    }
}
