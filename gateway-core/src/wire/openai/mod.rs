//! The Chat Completions wire format (`/v1/chat/completions`): what the endpoint reads from
//! clients and writes back, and what the `openai` adapter writes to an upstream and reads back,
//! one type each. Fields the serving side leaves out are left out of the JSON
//! (`skip_serializing_if`), so an upstream sees only what it was asked. Translation to and from
//! the conversation (`crate::conversation`) is [`translate`].

pub mod embeddings;
pub mod translate;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::null_as_default;
use super::one_or_many::StringOr;

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StringOr<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ChatTool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ChatToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// OpenAI's successor of `user`: the end user, preferred over `user` when both are sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_identifier: Option<String>,
    /// Names the conversation for upstream affinity (prompt caching).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<ReasoningEffort>,
}

/// How hard a reasoning model should think: chat completions' `reasoning_effort` and the
/// Responses API's `reasoning.effort`. It becomes a thinking budget (`translate`); on a model
/// without thinking it is accepted and left out of the turn (`validate::fit_thinking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    System {
        content: StringOr<ContentPart>,
    },
    Developer {
        content: StringOr<ContentPart>,
    },
    User {
        content: StringOr<ContentPart>,
    },
    Assistant {
        /// `null` (sent, not left out) when the turn is only tool calls.
        #[serde(default)]
        content: Option<StringOr<ContentPart>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_calls: Option<Vec<ToolCall>>,
    },
    Tool {
        tool_call_id: String,
        content: StringOr<ContentPart>,
    },
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ImageUrl {
    pub url: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ChatTool {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// `"none" | "auto" | "required"` or `{"type": "function", "function": {"name": ...}}`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ChatToolChoice {
    Mode(ToolChoiceMode),
    Named {
        #[serde(rename = "type", default = "function_type")]
        kind: String,
        function: NamedFunction,
    },
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceMode {
    None,
    Auto,
    Required,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct NamedFunction {
    pub name: String,
}

fn function_type() -> String {
    "function".to_owned()
}

// ---- responses ----

#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: ChatUsage,
    pub system_fingerprint: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    pub finish_reason: FinishReason,
    pub logprobs: Option<Value>,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    pub refusal: Option<String>,
}

/// Why a choice ended. The gateway writes only `stop`, `length` and `tool_calls`; what else an
/// upstream may send is read as the end of the turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    #[serde(other)]
    Other,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
pub struct ChatUsage {
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
    /// Derived (prompt plus completion): written, not read.
    #[serde(skip_deserializing)]
    pub total_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Where some compatible upstreams report cache hits instead of `prompt_tokens_details`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// A service extension: the authoritative credits charged for this turn. Ours alone: an
    /// upstream's figure is not read.
    #[serde(skip_deserializing)]
    pub credits_consumed: u64,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: u32,
}

/// One chunk of a stream. An adapter reads only the choices and the usage: the chunk's id,
/// `created` and model are the serving side's own (a client never sees an upstream's).
#[derive(Debug, Deserialize, Serialize)]
pub struct ChatChunk<'a> {
    #[serde(skip_deserializing)]
    pub id: &'a str,
    #[serde(skip_deserializing)]
    pub object: &'static str,
    #[serde(skip_deserializing)]
    pub created: i64,
    #[serde(skip_deserializing)]
    pub model: &'a str,
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ChatUsage>,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub delta: ChunkDelta,
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    #[serde(default)]
    pub logprobs: Option<Value>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
pub struct ChunkDelta {
    /// Only ever `assistant`, in the first chunk; not read from an upstream.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A thinking model's reasoning, as compatible upstreams stream it; never sent to a client
    /// (thinking is not shown in this format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct ToolCallDelta {
    #[serde(default)]
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Only ever `function`, with a call's first fragment; not read from an upstream.
    #[serde(
        rename = "type",
        skip_deserializing,
        skip_serializing_if = "Option::is_none"
    )]
    pub kind: Option<&'static str>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub function: FunctionDelta,
}

#[derive(Debug, Default, Deserialize, Serialize)]
pub struct FunctionDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub arguments: String,
}
