//! The OpenAI Responses API wire format (`/v1/responses`): the request, the response object,
//! its output items and the stream's events.
//!
//! Lenient where the API grows (unknown fields are ignored, unknown tool types are kept as
//! [`RequestTool::Hosted`] and unknown input item types as [`ItemKind::Other`]), strict where a
//! known field is malformed: serde names its path (`input[2].call_id: invalid type ...`).

pub mod translate;
pub mod unsent;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::null_as_default;
use super::one_or_many::StringOr;
use super::openai::{FunctionDef, ReasoningEffort};

#[derive(Clone, Debug, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    #[serde(default)]
    pub input: Option<StringOr<InputItem>>,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tools: Vec<RequestTool>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceParam>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub reasoning: Option<ReasoningParam>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub include: Vec<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// The end user, preferred over `user` (OpenAI's successor of it).
    #[serde(default)]
    pub safety_identifier: Option<String>,
    #[serde(default)]
    pub text: Option<TextParam>,
    #[serde(default)]
    pub background: Option<bool>,
}

/// One input item. A flat shape rather than an enum tagged by `type`: a message may leave
/// `type` out (`{"role": "user", "content": "hi"}`), and each field still reports its own path.
#[derive(Clone, Debug, Deserialize)]
pub struct InputItem {
    #[serde(rename = "type", default)]
    pub kind: Option<ItemKind>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub role: Option<ItemRole>,
    /// Message content; a reasoning item's `content` is read as its text.
    #[serde(default)]
    pub content: Option<StringOr<ContentPart>>,
    #[serde(default)]
    pub call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
    /// A custom tool call's free-form input.
    #[serde(default)]
    pub input: Option<String>,
    #[serde(default)]
    pub output: Option<StringOr<ContentPart>>,
    #[serde(default)]
    pub encrypted_content: Option<String>,
}

impl InputItem {
    /// A user message of plain text: what a string `input` means.
    pub fn user_text(text: String) -> Self {
        Self {
            kind: Some(ItemKind::Message),
            id: None,
            role: Some(ItemRole::User),
            content: Some(StringOr::String(text)),
            call_id: None,
            name: None,
            namespace: None,
            arguments: None,
            input: None,
            output: None,
            encrypted_content: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    Message,
    FunctionCall,
    FunctionCallOutput,
    CustomToolCall,
    CustomToolCallOutput,
    Reasoning,
    ItemReference,
    /// Calls and results of hosted tools (`web_search_call`, `local_shell_call`, ...): the
    /// gateway never offers those tools, so their items carry nothing a model here made.
    #[serde(other)]
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemRole {
    User,
    Assistant,
    System,
    Developer,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
    },
    Refusal {
        refusal: String,
    },
    InputImage {
        #[serde(default)]
        image_url: Option<String>,
        #[serde(default)]
        file_id: Option<String>,
    },
    InputFile {},
    ReasoningText {
        text: String,
    },
    SummaryText {
        text: String,
    },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RequestTool {
    Function(FunctionDef),
    /// Codex's tool groups: their functions are offered, and calls come back under the
    /// namespace.
    Namespace {
        name: String,
        #[serde(default, deserialize_with = "null_as_default")]
        tools: Vec<RequestTool>,
    },
    /// Hosted tools (`web_search`, `file_search`, `local_shell`, `custom`, ...): not offered to
    /// the model, never a reason to fail the turn.
    #[serde(other)]
    Hosted,
}

/// `"none" | "auto" | "required"`, or an object: `{"type": "function", "name": ...}`, or
/// hosted and allowed-tools choices, which leave the choice to the model.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceParam {
    Mode(ToolChoiceMode),
    Object {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        mode: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceMode {
    None,
    Auto,
    Required,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ReasoningParam {
    #[serde(default)]
    pub effort: Option<ReasoningEffort>,
    #[serde(default)]
    pub summary: Option<SummaryMode>,
    /// The deprecated name of `summary`.
    #[serde(default)]
    pub generate_summary: Option<SummaryMode>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SummaryMode {
    Auto,
    Concise,
    Detailed,
    None,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct TextParam {
    #[serde(default)]
    pub format: Option<TextFormat>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema {
        #[serde(default)]
        name: Option<String>,
        schema: Value,
    },
}

// ---- the response ----

#[derive(Clone, Debug, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: i64,
    pub status: Status,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    /// The virtual model id the client asked for.
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub store: bool,
    pub temperature: Option<f64>,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Value,
    pub top_p: Option<f64>,
    pub truncation: &'static str,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

#[derive(Clone, Debug, Serialize)]
pub struct ResponseError {
    pub code: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        status: Status,
        role: &'static str,
        content: Vec<OutputContent>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        arguments: String,
        status: Status,
    },
    Reasoning {
        id: String,
        summary: Vec<SummaryText>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
        status: Status,
    },
}

impl OutputItem {
    pub fn id(&self) -> &str {
        match self {
            Self::Message { id, .. }
            | Self::FunctionCall { id, .. }
            | Self::Reasoning { id, .. } => id,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputContent {
    OutputText {
        text: String,
        annotations: Vec<Value>,
        logprobs: Vec<Value>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

impl SummaryText {
    pub fn new(text: String) -> Self {
        Self {
            kind: "summary_text",
            text,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
    /// A service extension: the authoritative credits charged for this turn.
    pub credits_consumed: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

// ---- the stream ----

/// One server-sent event of a streamed response; the SSE event name is the `type` field.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.created")]
    Created { response: ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseObject },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputContent,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputContent,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.reasoning_summary_part.added")]
    ReasoningSummaryPartAdded {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        part: SummaryText,
    },
    #[serde(rename = "response.reasoning_summary_text.delta")]
    ReasoningSummaryTextDelta {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_summary_text.done")]
    ReasoningSummaryTextDone {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        text: String,
    },
    #[serde(rename = "response.reasoning_summary_part.done")]
    ReasoningSummaryPartDone {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        part: SummaryText,
    },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: ResponseObject },
}

impl StreamEvent {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Created { .. } => "response.created",
            Self::InProgress { .. } => "response.in_progress",
            Self::OutputItemAdded { .. } => "response.output_item.added",
            Self::OutputItemDone { .. } => "response.output_item.done",
            Self::ContentPartAdded { .. } => "response.content_part.added",
            Self::ContentPartDone { .. } => "response.content_part.done",
            Self::OutputTextDelta { .. } => "response.output_text.delta",
            Self::OutputTextDone { .. } => "response.output_text.done",
            Self::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Self::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            Self::ReasoningSummaryPartAdded { .. } => "response.reasoning_summary_part.added",
            Self::ReasoningSummaryTextDelta { .. } => "response.reasoning_summary_text.delta",
            Self::ReasoningSummaryTextDone { .. } => "response.reasoning_summary_text.done",
            Self::ReasoningSummaryPartDone { .. } => "response.reasoning_summary_part.done",
            Self::Completed { .. } => "response.completed",
            Self::Incomplete { .. } => "response.incomplete",
            Self::Failed { .. } => "response.failed",
        }
    }
}

/// An event with its place in the stream: `sequence_number` counts every event from 0.
#[derive(Serialize)]
pub struct Sequenced<'a> {
    #[serde(flatten)]
    pub event: &'a StreamEvent,
    pub sequence_number: u64,
}
