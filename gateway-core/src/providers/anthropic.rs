//! The `anthropic` adapter: the Messages API (`POST {base_url}/v1/messages`, `x-api-key`,
//! `anthropic-version`). The request and the stream's blocks are translated by
//! `wire::anthropic::translate` (the rules are there), so the request goes out as the client
//! shaped it, with `stream: true`, and with the client's `anthropic-beta` features, which a
//! request shaped for them (Claude Code's) may need; the stream comes back event by event
//! through [`Blocks`], which keeps indexes dense and drops empty text blocks; blocks of other
//! types (redacted thinking) are left out.

use async_trait::async_trait;
use serde_json::Value;

use super::blocks::Blocks;
use super::http::{self, Clients, Decoder, Framing, SseEvent};
use super::{EventStream, Provider, ProviderCall, ProviderError, ProviderEvent};
use crate::conversation::{Delta, OutputBlock};
use crate::wire::anthropic::translate::{
    block_from_messages, delta_from_messages, request_to_messages,
};
use crate::wire::anthropic::{MessagesRequest, StreamEvent, StreamedUsage};
use store::usage::{StopReason, TokenUsage};

const API_VERSION: &str = "2023-06-01";

#[derive(Default)]
pub struct Anthropic {
    clients: Clients,
}

#[async_trait]
impl Provider for Anthropic {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError> {
        let upstream = &call.upstream;
        let base = upstream.base_url.as_deref().ok_or_else(|| {
            tracing::error!(upstream = %upstream.name, "anthropic upstream without a base URL");
            ProviderError::Unavailable
        })?;
        let body = body(&call);
        let (client, upstream_call) = self.clients.get(upstream)?;
        let mut request = client
            .post(format!("{}/v1/messages", base.trim_end_matches('/')))
            .header("anthropic-version", API_VERSION)
            .header("accept", "text/event-stream")
            .json(&body);
        if let Some(key) = &upstream.api_key {
            request = request.header("x-api-key", key.expose());
        }
        if let Some(features) = &call.anthropic_beta {
            request = request.header("anthropic-beta", features);
        }
        http::open(
            request,
            upstream_call,
            upstream.timeouts,
            Framing::Sse,
            Stream::default(),
        )
        .await
    }
}

/// The Messages body sent upstream: the request as the client shaped it, streamed.
pub(super) fn body(call: &ProviderCall) -> MessagesRequest {
    MessagesRequest {
        stream: true,
        ..request_to_messages(&call.request, &call.upstream.model)
    }
}

/// The state of one upstream stream: blocks, and usage gathered from `message_start` and
/// `message_delta`.
#[derive(Default)]
pub(super) struct Stream {
    blocks: Blocks,
    usage: TokenUsage,
    stop_reason: Option<StopReason>,
    stop_sequence: Option<String>,
}

impl Stream {
    fn block_start(&mut self, index: usize, block: OutputBlock, out: &mut Vec<ProviderEvent>) {
        let block = match block {
            // A thinking block may arrive whole: its text and signature go out as deltas.
            OutputBlock::Thinking {
                thinking,
                signature,
            } => {
                let empty = OutputBlock::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                };
                self.blocks.start(index, empty, out);
                self.blocks.delta(index, Delta::Thinking { thinking }, out);
                self.blocks
                    .delta(index, Delta::Signature { signature }, out);
                return;
            }
            // The input follows as `input_json_delta`s.
            OutputBlock::ToolUse { id, name, .. } => OutputBlock::ToolUse {
                id,
                name,
                input: Value::Object(serde_json::Map::new()),
            },
            text @ OutputBlock::Text { .. } => text,
        };
        self.blocks.start(index, block, out);
    }
}

impl Decoder for Stream {
    fn event(&mut self, event: SseEvent) -> Result<Vec<ProviderEvent>, ProviderError> {
        let parsed: StreamEvent<StreamedUsage> = match serde_json::from_slice(&event.data) {
            Ok(parsed) => parsed,
            Err(e) => {
                // What the API added later is skipped (an event type, or a block we cannot
                // show, such as redacted thinking, with its deltas); broken JSON is an error.
                let value: Value = serde_json::from_slice(&event.data)
                    .map_err(|_| http::malformed("anthropic event", e))?;
                tracing::debug!(kind = ?value.get("type"), "skipped an unknown upstream event");
                return Ok(Vec::new());
            }
        };
        let mut out = Vec::new();
        match parsed {
            StreamEvent::MessageStart { message } => {
                message.usage.merge_into(&mut self.usage);
                out.push(ProviderEvent::Started {
                    usage: TokenUsage {
                        output_tokens: 0,
                        ..self.usage
                    },
                });
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => self.block_start(index, block_from_messages(content_block), &mut out),
            StreamEvent::ContentBlockDelta { index, delta } => {
                self.blocks
                    .delta(index, delta_from_messages(delta), &mut out)
            }
            StreamEvent::ContentBlockStop { index } => self.blocks.stop(index, &mut out),
            StreamEvent::MessageDelta { delta, usage } => {
                usage.merge_into(&mut self.usage);
                self.stop_reason = delta.stop_reason;
                self.stop_sequence = delta.stop_sequence;
            }
            StreamEvent::MessageStop => {
                self.blocks.stop_all(&mut out);
                out.push(ProviderEvent::Finish {
                    stop_reason: self.stop_reason.unwrap_or(StopReason::EndTurn),
                    stop_sequence: self.stop_sequence.take(),
                    usage: self.usage,
                });
            }
            StreamEvent::Ping => {}
            StreamEvent::Error { error } => {
                tracing::warn!(kind = %error.kind, "upstream stream carried an error");
                return Err(match error.kind.as_str() {
                    "overloaded_error" | "rate_limit_error" => ProviderError::overloaded(),
                    "timeout_error" => ProviderError::Timeout,
                    _ => ProviderError::Upstream,
                });
            }
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn feed(stream: &mut Stream, events: &[&str]) -> Result<Vec<ProviderEvent>, ProviderError> {
        let mut out = Vec::new();
        for data in events {
            out.extend(stream.event(SseEvent {
                data: Bytes::copy_from_slice(data.as_bytes()),
            })?);
        }
        Ok(out)
    }

    const START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}"#;

    #[test]
    fn a_stream_finishes_with_the_stop_reason_and_the_usage_of_message_start_and_message_delta() {
        let mut stream = Stream::default();
        let events = feed(
            &mut stream,
            &[
                START,
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                r#"{"type":"ping"}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":7}}"#,
                r#"{"type":"message_stop"}"#,
            ],
        )
        .expect("a well-formed stream");
        assert!(
            matches!(events.first(), Some(ProviderEvent::Started { usage }) if usage.input_tokens == 12 && usage.output_tokens == 0)
        );
        assert!(events.contains(&ProviderEvent::BlockDelta {
            index: 0,
            delta: Delta::Text { text: "Hi".into() },
        }));
        match events.last() {
            Some(ProviderEvent::Finish {
                stop_reason, usage, ..
            }) => {
                assert_eq!(*stop_reason, StopReason::MaxTokens);
                assert_eq!((usage.input_tokens, usage.output_tokens), (12, 7));
            }
            other => panic!("the stream did not finish: {other:?}"),
        }
    }

    #[test]
    fn an_event_the_api_added_later_is_skipped_and_broken_json_is_an_error() {
        let mut stream = Stream::default();
        let skipped = feed(&mut stream, &[r#"{"type":"a_future_event","x":1}"#]);
        assert_eq!(skipped.expect("skipped"), Vec::new());
        assert!(matches!(
            feed(&mut stream, &["{not json"]),
            Err(ProviderError::Upstream)
        ));
    }

    #[test]
    fn an_error_event_is_told_apart_overloaded_timeout_or_upstream() {
        let error = |kind: &str| {
            let data = format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"x"}}}}"#);
            feed(&mut Stream::default(), &[data.as_str()]).expect_err("an error event")
        };
        assert!(matches!(
            error("overloaded_error"),
            ProviderError::Overloaded { .. }
        ));
        assert!(matches!(
            error("rate_limit_error"),
            ProviderError::Overloaded { .. }
        ));
        assert!(matches!(error("timeout_error"), ProviderError::Timeout));
        assert!(matches!(error("api_error"), ProviderError::Upstream));
    }
}
