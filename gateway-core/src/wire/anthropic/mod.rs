//! The Messages API wire format (`/v1/messages`), as a client sends it to the endpoint and
//! the `anthropic` adapter sends it upstream; `translate.rs` maps it to and from the
//! conversation a turn serves (`crate::conversation`).
//!
//! Unknown fields are ignored rather than rejected, so requests written for the public
//! Messages API (which grows fields over time) keep working; see the README's field policy.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use store::usage::{StopReason, TokenUsage};

use super::null_as_default;
use super::one_or_many::StringOr;

pub mod translate;

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct MessagesRequest {
    pub model: String,
    pub max_tokens: u32,
    pub messages: Vec<InputMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<StringOr<TextBlock>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Empty lists are left out when sent: the API rejects some of them.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub stop_sequences: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tools: Vec<Tool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Thinking>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// The body of `/v1/messages/count_tokens`: the message request without `max_tokens`.
#[derive(Clone, Debug, Deserialize)]
pub struct CountTokensRequest {
    pub model: String,
    pub messages: Vec<InputMessage>,
    #[serde(default)]
    pub system: Option<StringOr<TextBlock>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tools: Vec<Tool>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    /// A system message inside the conversation (a Messages API beta Claude Code sends).
    System,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct InputMessage {
    pub role: Role,
    pub content: StringOr<InputBlock>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TextBlock {
    #[serde(rename = "type")]
    pub kind: TextType,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<Value>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TextType {
    Text,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputBlock {
    Text {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        citations: Option<Value>,
    },
    Image {
        source: ImageSource,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<StringOr<InputBlock>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<Value>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    None,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Thinking {
    Enabled { budget_tokens: u32 },
    Adaptive,
    Disabled,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
}

// ---- responses ----
//
// Written by the endpoint and read by the `anthropic` adapter. `U` is the usage object: the
// endpoint writes [`MessagesUsage`], whole; an adapter reads [`StreamedUsage`], where a count may be
// left out. An adapter reads leniently (a string left out or `null` is empty), and never
// reads a message's id, content or model: a client sees the gateway's, and the content
// streams as blocks.

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(bound(deserialize = "U: Deserialize<'de> + Default"))]
pub struct MessageResponse<U = MessagesUsage> {
    #[serde(skip_deserializing)]
    pub id: String,
    /// Always `message`; not read.
    #[serde(rename = "type", skip_deserializing)]
    pub kind: &'static str,
    /// Always `assistant`; not read.
    #[serde(skip_deserializing)]
    pub role: &'static str,
    #[serde(skip_deserializing)]
    pub content: Vec<OutputBlock>,
    #[serde(skip_deserializing)]
    pub model: String,
    #[serde(default, deserialize_with = "stop_reason_or_end_turn")]
    pub stop_reason: Option<StopReason>,
    #[serde(default)]
    pub stop_sequence: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub usage: U,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBlock {
    Text {
        #[serde(default, deserialize_with = "null_as_default")]
        text: String,
    },
    ToolUse {
        #[serde(default, deserialize_with = "null_as_default")]
        id: String,
        #[serde(default, deserialize_with = "null_as_default")]
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default, deserialize_with = "null_as_default")]
        thinking: String,
        #[serde(default, deserialize_with = "null_as_default")]
        signature: String,
    },
}

/// The usage object of a response: token counts plus the service's `credits_consumed`, which
/// is absent only from `message_start`, where it is not known yet (SDKs that accumulate a
/// stream would otherwise keep a 0 from it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MessagesUsage {
    #[serde(flatten)]
    pub tokens: TokenUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits_consumed: Option<u64>,
}

/// The usage object as an upstream reports it: a `message_delta` may carry only the counts
/// that changed, so a count left out keeps what `message_start` said; cache writes may be
/// split by cache lifetime.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct StreamedUsage {
    pub input_tokens: Option<u32>,
    pub output_tokens: Option<u32>,
    pub cache_creation_input_tokens: Option<u32>,
    pub cache_read_input_tokens: Option<u32>,
    pub cache_creation: Option<CacheCreation>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct CacheCreation {
    pub ephemeral_1h_input_tokens: Option<u32>,
}

impl StreamedUsage {
    /// `usage` with this report's counts laid over it.
    pub fn merge_into(self, usage: &mut TokenUsage) {
        usage.input_tokens = self.input_tokens.unwrap_or(usage.input_tokens);
        usage.output_tokens = self.output_tokens.unwrap_or(usage.output_tokens);
        usage.cache_creation_input_tokens = self
            .cache_creation_input_tokens
            .unwrap_or(usage.cache_creation_input_tokens);
        if let Some(one_hour) = self
            .cache_creation
            .and_then(|c| c.ephemeral_1h_input_tokens)
        {
            usage.cache_creation_1h_input_tokens = one_hour.min(usage.cache_creation_input_tokens);
        }
        usage.cache_read_input_tokens = self
            .cache_read_input_tokens
            .unwrap_or(usage.cache_read_input_tokens);
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type")]
pub enum Delta {
    #[serde(rename = "text_delta")]
    Text {
        #[serde(default, deserialize_with = "null_as_default")]
        text: String,
    },
    #[serde(rename = "input_json_delta")]
    InputJson {
        #[serde(default, deserialize_with = "null_as_default")]
        partial_json: String,
    },
    #[serde(rename = "thinking_delta")]
    Thinking {
        #[serde(default, deserialize_with = "null_as_default")]
        thinking: String,
    },
    #[serde(rename = "signature_delta")]
    Signature {
        #[serde(default, deserialize_with = "null_as_default")]
        signature: String,
    },
}

/// Server-sent events of a streamed message; the SSE event name is the `type` field. An
/// event, block or delta of a type not listed here (one the API added later) does not parse,
/// and a reader skips it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    bound(deserialize = "U: Deserialize<'de> + Default")
)]
pub enum StreamEvent<U = MessagesUsage> {
    MessageStart {
        message: MessageResponse<U>,
    },
    ContentBlockStart {
        index: usize,
        content_block: OutputBlock,
    },
    Ping,
    ContentBlockDelta {
        index: usize,
        delta: Delta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDeltaBody,
        #[serde(default, deserialize_with = "null_as_default")]
        usage: U,
    },
    MessageStop,
    /// An error in the middle of a stream. The endpoint writes its own from `ApiError`'s
    /// envelope; an upstream's is read here.
    Error {
        error: StreamError,
    },
}

/// An upstream's stream error: only its type is read (its message is the upstream's, never
/// passed on).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct StreamError {
    #[serde(rename = "type")]
    pub kind: String,
}

impl<U> StreamEvent<U> {
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::Ping => "ping",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
            Self::Error { .. } => "error",
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct MessageDeltaBody {
    #[serde(default, deserialize_with = "stop_reason_or_end_turn")]
    pub stop_reason: Option<StopReason>,
    #[serde(default)]
    pub stop_sequence: Option<String>,
}

/// Stop reasons the API may add (`pause_turn`, `refusal`) end the turn as far as clients of
/// the public API know. `model_context_window_exceeded` is kept: an upstream whose own count
/// of the input is above the gateway's fills the window before the capped max_tokens.
fn stop_reason_or_end_turn<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<StopReason>, D::Error> {
    Ok(
        Option::<String>::deserialize(d)?.map(|reason| match reason.as_str() {
            "max_tokens" => StopReason::MaxTokens,
            "stop_sequence" => StopReason::StopSequence,
            "tool_use" => StopReason::ToolUse,
            "model_context_window_exceeded" => StopReason::ModelContextWindowExceeded,
            _ => StopReason::EndTurn,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(messages: Value) -> MessagesRequest {
        serde_json::from_value(json!({"model": "svc/opus", "max_tokens": 10,
            "system": "Be brief.", "messages": messages}))
        .expect("a valid request")
    }

    #[test]
    fn a_count_left_out_of_message_delta_keeps_what_message_start_said() {
        let start: StreamEvent<StreamedUsage> = serde_json::from_value(json!({
            "type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "content": [], "model": "upstream", "stop_reason": null,
            "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 4,
                      "cache_creation_input_tokens": 6,
                      "cache_creation": {"ephemeral_1h_input_tokens": 9}}}}))
        .expect("message_start");
        let delta: StreamEvent<StreamedUsage> = serde_json::from_value(json!({
            "type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"output_tokens": 30}}))
        .expect("message_delta");
        let mut usage = TokenUsage::default();
        let StreamEvent::MessageStart { message } = start else {
            panic!("message_start")
        };
        message.usage.merge_into(&mut usage);
        let StreamEvent::MessageDelta {
            delta,
            usage: report,
        } = delta
        else {
            panic!("message_delta")
        };
        report.merge_into(&mut usage);
        assert_eq!(delta.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(
            usage,
            TokenUsage {
                input_tokens: 12,
                output_tokens: 30,
                cache_creation_input_tokens: 6,
                cache_read_input_tokens: 4,
                cache_creation_1h_input_tokens: 6,
            },
            "the 1-hour writes are capped at the writes' total"
        );
    }

    #[test]
    fn a_stop_reason_the_api_added_later_ends_the_turn() {
        let body: MessageDeltaBody =
            serde_json::from_value(json!({"stop_reason": "pause_turn"})).unwrap();
        assert_eq!(body.stop_reason, Some(StopReason::EndTurn));
    }

    #[test]
    fn an_upstream_that_fills_its_context_window_says_so_to_the_client() {
        let body: MessageDeltaBody =
            serde_json::from_value(json!({"stop_reason": "model_context_window_exceeded"}))
                .unwrap();
        assert_eq!(
            body.stop_reason,
            Some(StopReason::ModelContextWindowExceeded)
        );
    }

    #[test]
    fn the_events_the_endpoint_writes_read_back_as_an_adapter_reads_them() {
        let written: StreamEvent = StreamEvent::ContentBlockStart {
            index: 0,
            content_block: OutputBlock::ToolUse {
                id: "toolu_1".into(),
                name: "f".into(),
                input: json!({}),
            },
        };
        let read: StreamEvent<StreamedUsage> =
            serde_json::from_str(&serde_json::to_string(&written).unwrap()).unwrap();
        let StreamEvent::ContentBlockStart { content_block, .. } = read else {
            panic!("content_block_start")
        };
        let StreamEvent::ContentBlockStart {
            content_block: expected,
            ..
        } = written
        else {
            unreachable!()
        };
        assert_eq!(content_block, expected);
    }

    #[test]
    fn a_block_type_the_api_added_later_does_not_parse_so_a_reader_skips_it() {
        let event = json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "x"}});
        assert!(serde_json::from_value::<StreamEvent<StreamedUsage>>(event).is_err());
    }

    #[test]
    fn empty_lists_are_left_out_of_a_request_sent_upstream() {
        let req = request(json!([{"role": "user", "content": "hi"}]));
        let sent = serde_json::to_value(&req).unwrap();
        assert!(sent.get("tools").is_none() && sent.get("stop_sequences").is_none());
    }

    #[test]
    fn a_compatible_upstreams_null_where_text_belongs_reads_as_empty() {
        let event: StreamEvent<StreamedUsage> = serde_json::from_value(json!({
            "type": "content_block_start", "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": null}}))
        .expect("parses");
        let StreamEvent::ContentBlockStart { content_block, .. } = event else {
            panic!("content_block_start")
        };
        assert_eq!(
            content_block,
            OutputBlock::Thinking {
                thinking: String::new(),
                signature: String::new()
            }
        );
    }
}
