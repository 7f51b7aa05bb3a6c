//! The `anthropic` adapter: the Messages API (`POST {base_url}/v1/messages`, `x-api-key`,
//! `anthropic-version`). The canonical request is already this format, so the request goes
//! out as the client shaped it (tool call ids made safe for it), with the upstream's model
//! name and `stream: true`, and with the client's `anthropic-beta` features, which a request
//! shaped for them (Claude Code's) may need; the stream comes back event by event through [`Blocks`], which keeps indexes
//! dense and drops empty text blocks and redacted thinking.

use std::borrow::Cow;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::blocks::Blocks;
use super::http::{self, Clients, Decoder, SseEvent};
use super::{EventStream, Provider, ProviderCall, ProviderError, ProviderEvent};
use crate::ids;
use crate::wire::anthropic::{Delta, OutputBlock};
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
        let mut body = serde_json::to_value(call.request.as_ref())
            .map_err(|e| http::malformed("request", e))?;
        if let Value::Object(fields) = &mut body {
            fields.insert("model".into(), Value::from(upstream.model.clone()));
            fields.insert("stream".into(), Value::Bool(true));
            // Empty lists are left out rather than sent: the API rejects some of them.
            fields.retain(|_, v| !matches!(v, Value::Array(items) if items.is_empty()));
            if let Some(Value::Array(messages)) = fields.get_mut("messages") {
                safe_tool_ids(messages);
            }
        }
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
        http::open(request, upstream_call, upstream.timeouts, Stream::default()).await
    }
}

/// Tool call ids a chat-completions client sent back (any form: `call_…`, another
/// provider's) in the form the Messages API takes, tool_use and tool_result alike.
fn safe_tool_ids(messages: &mut [Value]) {
    let blocks = messages
        .iter_mut()
        .filter_map(|m| m.get_mut("content").and_then(Value::as_array_mut))
        .flatten();
    for block in blocks {
        let key = match block.get("type").and_then(Value::as_str) {
            Some("tool_use") => "id",
            Some("tool_result") => "tool_use_id",
            _ => continue,
        };
        if let Some(Value::String(id)) = block.get_mut(key) {
            if let Cow::Owned(safe) = ids::tool_call_for_upstream(id, "toolu_") {
                *id = safe;
            }
        }
    }
}

/// The state of one upstream stream: blocks, and usage gathered from `message_start` and
/// `message_delta`.
#[derive(Default)]
struct Stream {
    blocks: Blocks,
    usage: TokenUsage,
    stop_reason: Option<StopReason>,
    stop_sequence: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: Value,
    },
    ContentBlockDelta {
        index: usize,
        delta: Value,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct MessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    stop_sequence: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: Option<u32>,
    output_tokens: Option<u32>,
    cache_creation_input_tokens: Option<u32>,
    cache_read_input_tokens: Option<u32>,
    /// The writes by cache lifetime, when the upstream tells them apart.
    cache_creation: Option<WireCacheCreation>,
}

#[derive(Deserialize)]
struct WireCacheCreation {
    ephemeral_1h_input_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type")]
    kind: String,
}

impl Stream {
    fn merge_usage(&mut self, usage: WireUsage) {
        let u = &mut self.usage;
        u.input_tokens = usage.input_tokens.unwrap_or(u.input_tokens);
        u.output_tokens = usage.output_tokens.unwrap_or(u.output_tokens);
        u.cache_creation_input_tokens = usage
            .cache_creation_input_tokens
            .unwrap_or(u.cache_creation_input_tokens);
        if let Some(one_hour) = usage
            .cache_creation
            .and_then(|c| c.ephemeral_1h_input_tokens)
        {
            u.cache_creation_1h_input_tokens = one_hour.min(u.cache_creation_input_tokens);
        }
        u.cache_read_input_tokens = usage
            .cache_read_input_tokens
            .unwrap_or(u.cache_read_input_tokens);
    }

    fn block_start(&mut self, index: usize, block: Value, out: &mut Vec<ProviderEvent>) {
        let text = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default();
        let block = match block.get("type").and_then(Value::as_str) {
            Some("text") => OutputBlock::Text {
                text: text("text").to_owned(),
            },
            Some("tool_use") => OutputBlock::ToolUse {
                id: text("id").to_owned(),
                name: text("name").to_owned(),
                input: Value::Object(serde_json::Map::new()),
            },
            Some("thinking") => {
                let (thinking, signature) = (text("thinking").to_owned(), text("signature"));
                self.blocks.start(
                    index,
                    OutputBlock::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    },
                    out,
                );
                self.blocks.delta(index, Delta::Thinking { thinking }, out);
                self.blocks.delta(
                    index,
                    Delta::Signature {
                        signature: signature.to_owned(),
                    },
                    out,
                );
                return;
            }
            _ => {
                self.blocks.skip(index);
                return;
            }
        };
        self.blocks.start(index, block, out);
    }

    fn block_delta(&mut self, index: usize, delta: Value, out: &mut Vec<ProviderEvent>) {
        let text = |key: &str| {
            delta
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let delta = match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => Delta::Text { text: text("text") },
            Some("input_json_delta") => Delta::InputJson {
                partial_json: text("partial_json"),
            },
            Some("thinking_delta") => Delta::Thinking {
                thinking: text("thinking"),
            },
            Some("signature_delta") => Delta::Signature {
                signature: text("signature"),
            },
            _ => return,
        };
        self.blocks.delta(index, delta, out);
    }
}

impl Decoder for Stream {
    fn event(&mut self, event: SseEvent) -> Result<Vec<ProviderEvent>, ProviderError> {
        let parsed: Event = match serde_json::from_str(&event.data) {
            Ok(parsed) => parsed,
            Err(e) => {
                // Event types added to the API later are skipped; broken JSON is an error.
                let value: Value = serde_json::from_str(&event.data)
                    .map_err(|_| http::malformed("anthropic event", e))?;
                tracing::debug!(kind = ?value.get("type"), "skipped an unknown upstream event");
                return Ok(Vec::new());
            }
        };
        let mut out = Vec::new();
        match parsed {
            Event::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.merge_usage(usage);
                }
                out.push(ProviderEvent::Started {
                    usage: TokenUsage {
                        output_tokens: 0,
                        ..self.usage
                    },
                });
            }
            Event::ContentBlockStart {
                index,
                content_block,
            } => self.block_start(index, content_block, &mut out),
            Event::ContentBlockDelta { index, delta } => self.block_delta(index, delta, &mut out),
            Event::ContentBlockStop { index } => self.blocks.stop(index, &mut out),
            Event::MessageDelta { delta, usage } => {
                if let Some(usage) = usage {
                    self.merge_usage(usage);
                }
                self.stop_reason = delta.stop_reason.as_deref().map(stop_reason);
                self.stop_sequence = delta.stop_sequence;
            }
            Event::MessageStop => {
                self.blocks.stop_all(&mut out);
                out.push(ProviderEvent::Finish {
                    stop_reason: self.stop_reason.unwrap_or(StopReason::EndTurn),
                    stop_sequence: self.stop_sequence.take(),
                    usage: self.usage,
                });
            }
            Event::Ping => {}
            Event::Error { error } => {
                tracing::warn!(kind = %error.kind, "upstream stream carried an error");
                return Err(match error.kind.as_str() {
                    "overloaded_error" | "rate_limit_error" => ProviderError::Overloaded,
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

/// Stop reasons this API may add (`pause_turn`, `refusal`) end the turn as far as clients of
/// the public API know.
fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "max_tokens" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "tool_use" => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}
