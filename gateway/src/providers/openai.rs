//! The `openai` adapter: any OpenAI-compatible chat-completions upstream
//! (`POST {base_url}/chat/completions`, Bearer auth).
//!
//! Request: the system prompt becomes the first `system` message; a user turn's tool results
//! become `tool` messages ahead of its other content (they must follow the assistant's
//! `tool_calls`); images become `image_url` parts (base64 as data URLs); an assistant turn's
//! `tool_use` blocks become `tool_calls` with the input serialized as `arguments` (ids the
//! upstream would refuse made safe, call and result alike: `ids::tool_call_for_upstream`);
//! thinking blocks are not sent (the upstream cannot check their signatures); `tool_choice`
//! any is `required`; usage is asked for with `stream_options.include_usage`.
//!
//! Stream: `reasoning_content` (as served for thinking models) becomes a thinking block,
//! `content` a text block, and each `tool_calls[].index` a tool_use block whose argument
//! fragments are its `input_json_delta`s; one block is open at a time. `finish_reason`
//! `tool_calls` (or any end after a tool call) is `tool_use`, `length` is `max_tokens`.
//! Cached prompt tokens are reported as cache reads and taken out of `input_tokens`.

use std::collections::HashMap;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::blocks::Blocks;
use super::http::{self, Clients, Decoder, SseEvent};
use super::{EventStream, Provider, ProviderCall, ProviderError, ProviderEvent};
use crate::ids;
use crate::tokens::Tokenizer;
use crate::wire::anthropic::{
    Delta, ImageSource, InputBlock, InputMessage, MessagesRequest, OutputBlock, Role, ToolChoice,
};
use crate::wire::one_or_many::StringOr;
use store::usage::{StopReason, TokenUsage};

pub struct OpenAi {
    clients: Clients,
    tokens: Tokenizer,
}

impl OpenAi {
    pub fn new(tokens: Tokenizer) -> Self {
        Self {
            clients: Clients::default(),
            tokens,
        }
    }
}

#[async_trait]
impl Provider for OpenAi {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError> {
        let upstream = &call.upstream;
        let base = upstream.base_url.as_deref().ok_or_else(|| {
            tracing::error!(upstream = %upstream.name, "openai upstream without a base URL");
            ProviderError::Unavailable
        })?;
        let body = chat_request(&call.request, &upstream.model);
        let (client, upstream_call) = self.clients.get(upstream)?;
        let mut request = client
            .post(format!("{}/chat/completions", base.trim_end_matches('/')))
            .header("accept", "text/event-stream")
            .json(&body);
        if let Some(key) = &upstream.api_key {
            request = request.bearer_auth(key.expose());
        }
        let stream = Stream {
            blocks: Blocks::default(),
            tokens: self.tokens,
            input_tokens: call.input_tokens,
            open: None,
            keys: 0,
            tools: HashMap::new(),
            finish: None,
            usage: None,
            generated: String::new(),
        };
        http::open(request, upstream_call, upstream.timeouts, stream).await
    }
}

fn chat_request(req: &MessagesRequest, model: &str) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = req.system_text() {
        messages.push(json!({"role": "system", "content": system}));
    }
    for message in &req.messages {
        match message.role {
            Role::User => user_messages(message, &mut messages),
            Role::Assistant => messages.push(assistant_message(message)),
            Role::System => messages.push(json!({"role": "system", "content": message.text()})),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("max_tokens".into(), json!(req.max_tokens));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if !req.stop_sequences.is_empty() {
        body.insert("stop".into(), json!(req.stop_sequences));
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name,
                    "description": t.description.clone().unwrap_or_default(),
                    "parameters": t.input_schema,
                }})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &req.tool_choice {
        let (value, no_parallel) = match choice {
            ToolChoice::Auto {
                disable_parallel_tool_use,
            } => (json!("auto"), *disable_parallel_tool_use),
            ToolChoice::Any {
                disable_parallel_tool_use,
            } => (json!("required"), *disable_parallel_tool_use),
            ToolChoice::Tool {
                name,
                disable_parallel_tool_use,
            } => (
                json!({"type": "function", "function": {"name": name}}),
                *disable_parallel_tool_use,
            ),
            ToolChoice::None => (json!("none"), None),
        };
        body.insert("tool_choice".into(), value);
        if no_parallel == Some(true) && !req.tools.is_empty() {
            body.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if let Some(user) = req.metadata.as_ref().and_then(|m| m.user_id.clone()) {
        body.insert("user".into(), json!(user));
    }
    Value::Object(body)
}

fn user_messages(message: &InputMessage, out: &mut Vec<Value>) {
    let blocks: Vec<&InputBlock> = match &message.content {
        StringOr::String(text) => {
            out.push(json!({"role": "user", "content": text}));
            return;
        }
        StringOr::Many(blocks) => blocks.iter().collect(),
    };
    let mut parts = Vec::new();
    for block in blocks {
        match block {
            InputBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
                ..
            } => {
                let text = content.as_ref().map(result_text).unwrap_or_default();
                let text = if *is_error == Some(true) {
                    format!("Error: {text}")
                } else {
                    text
                };
                let id = ids::tool_call_for_upstream(tool_use_id, "call_");
                out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
            }
            InputBlock::Text { text, .. } => parts.push(json!({"type": "text", "text": text})),
            InputBlock::Image { source, .. } => {
                parts.push(json!({"type": "image_url", "image_url": {"url": image_url(source)}}))
            }
            InputBlock::ToolUse { .. }
            | InputBlock::Thinking { .. }
            | InputBlock::RedactedThinking { .. } => {}
        }
    }
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
}

fn assistant_message(message: &InputMessage) -> Value {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    match &message.content {
        StringOr::String(s) => text.push(s.clone()),
        StringOr::Many(blocks) => {
            for block in blocks {
                match block {
                    InputBlock::Text { text: t, .. } => text.push(t.clone()),
                    InputBlock::ToolUse {
                        id, name, input, ..
                    } => calls.push(json!({"id": ids::tool_call_for_upstream(id, "call_"), "type": "function", "function": {
                        "name": name, "arguments": input.to_string(),
                    }})),
                    _ => {}
                }
            }
        }
    }
    let mut out = json!({"role": "assistant", "content": text.join("\n")});
    if !calls.is_empty() {
        out["tool_calls"] = Value::Array(calls);
        if text.is_empty() {
            out["content"] = Value::Null;
        }
    }
    out
}

fn result_text(content: &StringOr<InputBlock>) -> String {
    match content {
        StringOr::String(s) => s.clone(),
        StringOr::Many(blocks) => blocks
            .iter()
            .filter_map(|b| match b {
                InputBlock::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn image_url(source: &ImageSource) -> String {
    match source {
        ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        ImageSource::Url { url } => url.clone(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    Tool(u32),
}

struct Stream {
    blocks: Blocks,
    tokens: Tokenizer,
    input_tokens: u32,
    /// The block being streamed, and its key in `blocks`.
    open: Option<(Open, usize)>,
    keys: usize,
    /// Tool calls seen, by the upstream's index.
    tools: HashMap<u32, usize>,
    finish: Option<String>,
    usage: Option<WireUsage>,
    /// Output text, counted when an upstream reports no usage.
    generated: String,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: ChunkDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Default, Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Clone, Copy, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    /// Where some compatible upstreams report cache hits instead.
    #[serde(default)]
    cached_tokens: Option<u32>,
}

#[derive(Clone, Copy, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: u32,
}

impl Stream {
    /// Makes `kind` the open block, closing another one first; returns its key.
    fn switch_to(&mut self, kind: Open, block: OutputBlock, out: &mut Vec<ProviderEvent>) -> usize {
        if let Some((open, key)) = self.open {
            if open == kind {
                return key;
            }
            self.blocks.stop(key, out);
        }
        let key = self.keys;
        self.keys += 1;
        self.blocks.start(key, block, out);
        self.open = Some((kind, key));
        key
    }

    fn tool_call(&mut self, call: ToolCallDelta, out: &mut Vec<ProviderEvent>) {
        let function = call.function.unwrap_or(FunctionDelta {
            name: None,
            arguments: None,
        });
        let key = match self.tools.get(&call.index) {
            Some(&key) if self.open == Some((Open::Tool(call.index), key)) => key,
            Some(_) => {
                tracing::debug!(
                    index = call.index,
                    "late fragment of a closed tool call dropped"
                );
                return;
            }
            None => {
                let block = OutputBlock::ToolUse {
                    id: call.id.unwrap_or_else(crate::ids::tool_use),
                    name: function.name.clone().unwrap_or_default(),
                    input: Value::Object(Map::new()),
                };
                let key = self.switch_to(Open::Tool(call.index), block, out);
                self.tools.insert(call.index, key);
                key
            }
        };
        if let Some(arguments) = function.arguments {
            self.generated.push_str(&arguments);
            self.blocks.delta(
                key,
                Delta::InputJson {
                    partial_json: arguments,
                },
                out,
            );
        }
    }

    fn finish(&mut self) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        self.blocks.stop_all(&mut out);
        let called = !self.tools.is_empty();
        let stop_reason = match self.finish.as_deref() {
            Some("length") => StopReason::MaxTokens,
            _ if called => StopReason::ToolUse,
            _ => StopReason::EndTurn,
        };
        let usage = match self.usage {
            Some(u) => {
                let cached = u
                    .prompt_tokens_details
                    .map(|d| d.cached_tokens)
                    .or(u.cached_tokens)
                    .unwrap_or(0);
                TokenUsage {
                    input_tokens: u.prompt_tokens.saturating_sub(cached),
                    output_tokens: u.completion_tokens,
                    cache_read_input_tokens: cached,
                    ..TokenUsage::default()
                }
            }
            None => TokenUsage {
                input_tokens: self.input_tokens,
                output_tokens: self.tokens.count(&self.generated),
                ..TokenUsage::default()
            },
        };
        out.push(ProviderEvent::Finish {
            stop_reason,
            stop_sequence: None,
            usage,
        });
        out
    }
}

impl Decoder for Stream {
    fn event(&mut self, event: SseEvent) -> Result<Vec<ProviderEvent>, ProviderError> {
        if event.data.trim() == "[DONE]" {
            return self.end();
        }
        let chunk: Chunk =
            serde_json::from_str(&event.data).map_err(|e| http::malformed("openai chunk", e))?;
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage);
        }
        let mut out = Vec::new();
        for choice in chunk.choices {
            let delta = choice.delta;
            if let Some(thinking) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                self.generated.push_str(&thinking);
                let block = OutputBlock::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                };
                let key = self.switch_to(Open::Thinking, block, &mut out);
                self.blocks
                    .delta(key, Delta::Thinking { thinking }, &mut out);
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.generated.push_str(&text);
                let block = OutputBlock::Text {
                    text: String::new(),
                };
                let key = self.switch_to(Open::Text, block, &mut out);
                self.blocks.delta(key, Delta::Text { text }, &mut out);
            }
            for call in delta.tool_calls {
                self.tool_call(call, &mut out);
            }
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(reason);
            }
        }
        Ok(out)
    }

    /// The turn ends at `[DONE]` (or at the end of the body, for upstreams that omit it)
    /// once a finish reason came: usage may follow the finish reason in a chunk of its own.
    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        if self.finish.is_none() {
            return Ok(Vec::new());
        }
        let events = self.finish();
        self.finish = None;
        Ok(events)
    }
}
