//! Chat Completions and the conversation (`crate::conversation`, "canonical" below), both ways,
//! written once for both sides: the endpoint (`api/chat.rs`) reads a client's request with
//! [`request_from_chat`] and answers with [`message_to_chat`], [`stop_to_chat`] and
//! [`usage_to_chat`]; the `openai` adapter (`providers/openai.rs`) writes an upstream's request
//! with [`request_to_chat`] and reads the answer with [`stop_from_chat`] and [`usage_from_chat`].
//! What stays with each side is its own: HTTP, SSE framing, the turn, the state of a stream.
//!
//! Client to canonical: `system` and `developer` messages form the system prompt; consecutive
//! messages of one role merge (tool results join the following user turn) so the canonical
//! conversation alternates; `temperature` is accepted in OpenAI's [0, 2] and values above 1
//! are clamped to 1; `required` tool choice is `any`; `reasoning_effort` is a thinking budget
//! (left out on models without thinking); any tool call id a client sends back is taken as it
//! is.
//!
//! Canonical to upstream: the system prompt becomes the first `system` message; a user turn's
//! tool results become `tool` messages ahead of its other content (they must follow the
//! assistant's `tool_calls`); images become `image_url` parts (base64 as data URLs); an
//! assistant turn's `tool_use` blocks become `tool_calls` with the input serialized as
//! `arguments` (ids the upstream would refuse made safe, call and result alike:
//! `ids::tool_call_for_upstream`); thinking blocks are not sent (the upstream cannot check
//! their signatures); `tool_choice` any is `required`; a request without `temperature` is sent
//! the spec's default of 1, since OpenAI-compatible servers default otherwise (vLLM takes the
//! model's generation config, Ollama and llama.cpp 0.8) and a model would then answer
//! differently by route (OpenAI's reasoning models accept 1, the only value they take), except
//! while thinking, when a thinking model's server keeps the sampling it is tuned for, as the
//! Responses endpoint does with a client's own values.
//!
//! Answers: thinking is not shown to a client; tool calls reach it with `call_` ids
//! (`ids::openai_call`); `length` is `max_tokens`, and `tool_calls` (or any end after a tool
//! call) is `tool_use`; cached prompt tokens are cache reads, counted in `prompt_tokens` and
//! taken out of the canonical `input_tokens`.

use serde_json::{json, Value};
use store::usage::{StopReason, TokenUsage};

use super::{
    AssistantMessage, ChatMessage, ChatRequest, ChatTool, ChatToolChoice, ChatUsage, ContentPart,
    FinishReason, FunctionCall, FunctionDef, FunctionDelta, ImageUrl, NamedFunction,
    PromptTokensDetails, ReasoningEffort, ToolCall, ToolCallDelta, ToolChoiceMode,
};
use crate::conversation::{
    BilledUsage, Content, ImageSource, InputBlock, Message, Metadata, OutputBlock, Request, Role,
    Thinking, Tool, ToolChoice, DEFAULT_TEMPERATURE,
};
use crate::ids;
use crate::validate::{self, Invalid, MIN_THINKING_BUDGET};
use crate::wire::one_or_many::StringOr;

impl ReasoningEffort {
    /// The conversation's `thinking` for this effort. The budget stays below max_tokens
    /// when the client set one (thinking is left out when the minimum budget would not fit);
    /// with max_tokens left open it is fitted once the turn's cap is known.
    pub fn thinking(self, max_tokens: Option<u32>) -> Option<Thinking> {
        let budget = match self {
            Self::None => return None,
            Self::Minimal | Self::Low => MIN_THINKING_BUDGET,
            Self::Medium => 4 * MIN_THINKING_BUDGET,
            Self::High => 16 * MIN_THINKING_BUDGET,
            Self::Xhigh => 31 * MIN_THINKING_BUDGET,
        };
        let budget = match max_tokens {
            Some(max) if budget >= max => {
                max.checked_sub(1).filter(|b| *b >= MIN_THINKING_BUDGET)?
            }
            _ => budget,
        };
        Some(Thinking::Enabled {
            budget_tokens: budget,
        })
    }
}

/// A client's request as the conversation, and whether max_tokens was left open.
pub fn request_from_chat(chat: ChatRequest) -> Result<(Request, bool), Invalid> {
    if chat.n.is_some_and(|n| n != 1) {
        return Err(Invalid::new("n: only 1 choice per request is supported"));
    }
    if chat.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(Invalid::new("temperature: must be between 0 and 2"));
    }
    let mut system: Vec<String> = Vec::new();
    let mut messages: Vec<Message> = Vec::new();
    for (i, message) in chat.messages.into_iter().enumerate() {
        let (role, blocks) = match message {
            ChatMessage::System { content } | ChatMessage::Developer { content } => {
                system.push(text_of(&content));
                continue;
            }
            ChatMessage::User { content } => (Role::User, user_blocks(content, i)?),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => (Role::Assistant, assistant_blocks(content, tool_calls, i)?),
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => (
                Role::User,
                vec![InputBlock::ToolResult {
                    tool_use_id: tool_call_id,
                    content: Some(Content::Text(text_of(&content))),
                    is_error: None,
                    cache_control: None,
                }],
            ),
        };
        Message::append(&mut messages, role, blocks);
    }
    let tools = chat
        .tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind != "function" {
                return Err(Invalid::new(format!(
                    "tools[{i}].type: only `function` tools are supported"
                )));
            }
            Ok(Tool {
                name: t.function.name,
                description: t.function.description,
                input_schema: t
                    .function
                    .parameters
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                cache_control: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let parallel_tool_calls = chat.parallel_tool_calls;
    let tool_choice = match chat.tool_choice {
        Some(choice) => Some(tool_choice_from_chat(choice, parallel_tool_calls)),
        // `parallel_tool_calls: false` alone still asks for one call at a time: the default
        // choice (auto) with parallel use off, as OpenAI applies it.
        None if parallel_tool_calls == Some(false) && !tools.is_empty() => Some(ToolChoice::Auto {
            disable_parallel_tool_use: Some(true),
        }),
        None => None,
    };
    let max_tokens = chat.max_completion_tokens.or(chat.max_tokens);
    let request = Request {
        model: chat.model,
        max_tokens: max_tokens.unwrap_or(0),
        messages,
        system: (!system.is_empty()).then(|| Content::Text(system.join("\n"))),
        temperature: chat.temperature.map(|t| t.min(1.0)),
        top_p: chat.top_p,
        top_k: None,
        stop_sequences: match chat.stop {
            None => Vec::new(),
            Some(StringOr::String(s)) => vec![s],
            Some(StringOr::Many(v)) => v,
        },
        stream: chat.stream.unwrap_or(false),
        tools,
        tool_choice,
        thinking: chat.reasoning_effort.and_then(|e| e.thinking(max_tokens)),
        metadata: end_user(chat.safety_identifier, chat.user)?.map(|user_id| Metadata {
            user_id: Some(user_id),
        }),
    };
    Ok((request, max_tokens.is_none()))
}

/// The conversation as an upstream's chat request for `model` (the upstream's name for
/// it). Whether to stream is the adapter's to say.
/// The end user of a Chat Completions or Responses request: `safety_identifier`, else `user`,
/// each held to [`validate::end_user`] under its own name.
pub fn end_user(
    safety_identifier: Option<String>,
    user: Option<String>,
) -> Result<Option<String>, Invalid> {
    if let Some(id) = &safety_identifier {
        validate::end_user("safety_identifier", id)?;
    }
    if let Some(user) = &user {
        validate::end_user("user", user)?;
    }
    Ok(safety_identifier.or(user))
}

pub fn request_to_chat(req: &Request, model: &str) -> ChatRequest {
    let mut messages = Vec::new();
    if let Some(system) = req.system_text() {
        messages.push(ChatMessage::System {
            content: StringOr::String(system),
        });
    }
    for message in &req.messages {
        match message.role {
            Role::User => user_to_chat(message, &mut messages),
            Role::Assistant => messages.push(assistant_to_chat(message)),
            Role::System => messages.push(ChatMessage::System {
                content: StringOr::String(message.text()),
            }),
        }
    }
    let tools: Vec<ChatTool> = req
        .tools
        .iter()
        .map(|t| ChatTool {
            kind: "function".to_owned(),
            function: FunctionDef {
                name: t.name.clone(),
                description: Some(t.description.clone().unwrap_or_default()),
                parameters: Some(t.input_schema.clone()),
            },
        })
        .collect();
    let (tool_choice, parallel_tool_calls) = match req.tool_choice.as_ref().map(tool_choice_to_chat)
    {
        Some((choice, parallel)) => (Some(choice), parallel.filter(|_| !tools.is_empty())),
        None => (None, None),
    };
    ChatRequest {
        model: model.to_owned(),
        messages,
        max_tokens: Some(req.max_tokens),
        max_completion_tokens: None,
        temperature: req.temperature.or_else(|| {
            req.thinking_budget()
                .is_none()
                .then_some(DEFAULT_TEMPERATURE)
        }),
        top_p: req.top_p,
        stop: (!req.stop_sequences.is_empty()).then(|| StringOr::Many(req.stop_sequences.clone())),
        stream: None,
        stream_options: None,
        tools: (!tools.is_empty()).then_some(tools),
        tool_choice,
        parallel_tool_calls,
        user: req.metadata.as_ref().and_then(|m| m.user_id.clone()),
        safety_identifier: None,
        prompt_cache_key: None,
        n: None,
        reasoning_effort: None,
    }
}

/// A chat tool choice as the canonical one; `parallel_tool_calls: false` is
/// `disable_parallel_tool_use`.
pub fn tool_choice_from_chat(
    choice: ChatToolChoice,
    parallel_tool_calls: Option<bool>,
) -> ToolChoice {
    let disable_parallel_tool_use = parallel_tool_calls.map(|p| !p);
    match choice {
        ChatToolChoice::Mode(ToolChoiceMode::None) => ToolChoice::None,
        ChatToolChoice::Mode(ToolChoiceMode::Auto) => ToolChoice::Auto {
            disable_parallel_tool_use,
        },
        ChatToolChoice::Mode(ToolChoiceMode::Required) => ToolChoice::Any {
            disable_parallel_tool_use,
        },
        ChatToolChoice::Named { function, .. } => ToolChoice::Tool {
            name: function.name,
            disable_parallel_tool_use,
        },
    }
}

/// The canonical tool choice as a chat one, with `parallel_tool_calls`: only ever `false`, as
/// allowing parallel calls is the default.
pub fn tool_choice_to_chat(choice: &ToolChoice) -> (ChatToolChoice, Option<bool>) {
    let (choice, disable_parallel) = match choice {
        ToolChoice::Auto {
            disable_parallel_tool_use,
        } => (
            ChatToolChoice::Mode(ToolChoiceMode::Auto),
            *disable_parallel_tool_use,
        ),
        ToolChoice::Any {
            disable_parallel_tool_use,
        } => (
            ChatToolChoice::Mode(ToolChoiceMode::Required),
            *disable_parallel_tool_use,
        ),
        ToolChoice::Tool {
            name,
            disable_parallel_tool_use,
        } => (
            ChatToolChoice::Named {
                kind: "function".to_owned(),
                function: NamedFunction { name: name.clone() },
            },
            *disable_parallel_tool_use,
        ),
        ToolChoice::None => (ChatToolChoice::Mode(ToolChoiceMode::None), None),
    };
    (choice, (disable_parallel == Some(true)).then_some(false))
}

/// An image as the OpenAI formats give it: a `data:<type>;base64,` URL or an http(s) URL.
pub fn image_from_url(url: &str) -> Option<ImageSource> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest.split_once(";base64,")?;
        return Some(ImageSource::Base64 {
            media_type: media_type.to_owned(),
            data: data.to_owned(),
        });
    }
    (url.starts_with("https://") || url.starts_with("http://")).then(|| ImageSource::Url {
        url: url.to_owned(),
    })
}

pub fn image_to_url(source: &ImageSource) -> String {
    match source {
        ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        ImageSource::Url { url } => url.clone(),
    }
}

pub fn stop_to_chat(stop: StopReason) -> FinishReason {
    match stop {
        StopReason::EndTurn | StopReason::StopSequence => FinishReason::Stop,
        // Chat completions has one reason for a cut answer, whichever limit cut it.
        StopReason::MaxTokens | StopReason::ModelContextWindowExceeded => FinishReason::Length,
        StopReason::ToolUse => FinishReason::ToolCalls,
    }
}

/// `called`: the upstream streamed a tool call; some compatible upstreams end such a turn with
/// `stop`, and the client must still be told to run the tool.
pub fn stop_from_chat(finish: Option<FinishReason>, called: bool) -> StopReason {
    match finish {
        Some(FinishReason::Length) => StopReason::MaxTokens,
        _ if called => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

pub fn usage_to_chat(usage: &BilledUsage) -> ChatUsage {
    let t = &usage.tokens;
    let prompt = t.input_tokens + t.cache_creation_input_tokens + t.cache_read_input_tokens;
    ChatUsage {
        prompt_tokens: prompt,
        completion_tokens: t.output_tokens,
        total_tokens: prompt + t.output_tokens,
        prompt_tokens_details: Some(PromptTokensDetails {
            cached_tokens: t.cache_read_input_tokens,
        }),
        cached_tokens: None,
        credits_consumed: usage.credits,
    }
}

pub fn usage_from_chat(usage: &ChatUsage) -> TokenUsage {
    let cached = usage
        .prompt_tokens_details
        .map(|d| d.cached_tokens)
        .or(usage.cached_tokens)
        .unwrap_or(0);
    TokenUsage {
        input_tokens: usage.prompt_tokens.saturating_sub(cached),
        output_tokens: usage.completion_tokens,
        cache_read_input_tokens: cached,
        ..TokenUsage::default()
    }
}

/// A finished reply's blocks as the assistant message of a completion: text joined, tool calls
/// with `call_` ids, thinking left out.
pub fn message_to_chat(content: Vec<OutputBlock>) -> AssistantMessage {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in content {
        match block {
            OutputBlock::Text { text: t } => text.push_str(&t),
            OutputBlock::ToolUse { id, name, input } => {
                tool_calls.push(tool_call(ids::openai_call(&id), name, &input))
            }
            OutputBlock::Thinking { .. } => {}
        }
    }
    AssistantMessage {
        role: "assistant",
        content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
        tool_calls,
        refusal: None,
    }
}

/// The first fragment of a streamed tool call as a client sees it: its `call_` id and name
/// (the arguments follow).
pub fn tool_call_start_to_chat(index: u32, id: &str, name: String) -> ToolCallDelta {
    ToolCallDelta {
        index,
        id: Some(ids::openai_call(id)),
        kind: Some("function"),
        function: FunctionDelta {
            name: Some(name),
            arguments: String::new(),
        },
    }
}

/// The tool_use block an upstream's first fragment of a tool call opens, its input to follow;
/// a call the upstream sent without an id gets one.
pub fn tool_use_from_chat(id: Option<String>, name: Option<String>) -> OutputBlock {
    OutputBlock::ToolUse {
        id: id.unwrap_or_else(ids::tool_use),
        name: name.unwrap_or_default(),
        input: Value::Object(serde_json::Map::new()),
    }
}

/// A tool_use block as a chat tool call, under `id`: the form its reader takes.
fn tool_call(id: String, name: String, input: &Value) -> ToolCall {
    ToolCall {
        id,
        kind: "function".to_owned(),
        function: FunctionCall {
            name,
            arguments: input.to_string(),
        },
    }
}

fn text_of(content: &StringOr<ContentPart>) -> String {
    match content {
        StringOr::String(s) => s.clone(),
        StringOr::Many(parts) => parts
            .iter()
            .filter_map(|p| match p {
                ContentPart::Text { text } => Some(text.as_str()),
                ContentPart::ImageUrl { .. } => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn user_blocks(content: StringOr<ContentPart>, i: usize) -> Result<Vec<InputBlock>, Invalid> {
    let parts = match content {
        StringOr::String(text) => return Ok(vec![InputBlock::text(text)]),
        StringOr::Many(parts) => parts,
    };
    parts
        .into_iter()
        .enumerate()
        .map(|(j, part)| match part {
            ContentPart::Text { text } => Ok(InputBlock::text(text)),
            ContentPart::ImageUrl { image_url } => Ok(InputBlock::Image {
                source: image_from_url(&image_url.url).ok_or_else(|| {
                    Invalid::new(format!(
                        "messages[{i}].content[{j}].image_url.url: expected an https URL or a base64 data URL"
                    ))
                })?,
                cache_control: None,
            }),
        })
        .collect()
}

fn assistant_blocks(
    content: Option<StringOr<ContentPart>>,
    tool_calls: Option<Vec<ToolCall>>,
    i: usize,
) -> Result<Vec<InputBlock>, Invalid> {
    let mut blocks = Vec::new();
    if let Some(text) = content.map(|c| text_of(&c)).filter(|t| !t.is_empty()) {
        blocks.push(InputBlock::text(text));
    }
    for (j, call) in tool_calls.unwrap_or_default().into_iter().enumerate() {
        let input: Value = serde_json::from_str(&call.function.arguments).map_err(|_| {
            Invalid::new(format!(
                "messages[{i}].tool_calls[{j}].function.arguments: not valid JSON"
            ))
        })?;
        blocks.push(InputBlock::ToolUse {
            id: call.id,
            name: call.function.name,
            input,
            cache_control: None,
        });
    }
    Ok(blocks)
}

fn user_to_chat(message: &Message, out: &mut Vec<ChatMessage>) {
    let blocks = match &message.content {
        Content::Text(text) => {
            out.push(ChatMessage::User {
                content: StringOr::String(text.clone()),
            });
            return;
        }
        Content::Blocks(blocks) => blocks,
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
                let text = content.as_ref().map(Content::text).unwrap_or_default();
                let text = if *is_error == Some(true) {
                    format!("Error: {text}")
                } else {
                    text
                };
                out.push(ChatMessage::Tool {
                    tool_call_id: ids::tool_call_for_upstream(tool_use_id, "call_").into_owned(),
                    content: StringOr::String(text),
                });
            }
            InputBlock::Text { text, .. } => parts.push(ContentPart::Text { text: text.clone() }),
            InputBlock::Image { source, .. } => parts.push(ContentPart::ImageUrl {
                image_url: ImageUrl {
                    url: image_to_url(source),
                },
            }),
            InputBlock::ToolUse { .. }
            | InputBlock::Thinking { .. }
            | InputBlock::RedactedThinking { .. } => {}
        }
    }
    if !parts.is_empty() {
        out.push(ChatMessage::User {
            content: StringOr::Many(parts),
        });
    }
}

fn assistant_to_chat(message: &Message) -> ChatMessage {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    match &message.content {
        Content::Text(s) => text.push(s.clone()),
        Content::Blocks(blocks) => {
            for block in blocks {
                match block {
                    InputBlock::Text { text: t, .. } => text.push(t.clone()),
                    InputBlock::ToolUse {
                        id, name, input, ..
                    } => calls.push(tool_call(
                        ids::tool_call_for_upstream(id, "call_").into_owned(),
                        name.clone(),
                        input,
                    )),
                    _ => {}
                }
            }
        }
    }
    ChatMessage::Assistant {
        content: (!text.is_empty() || calls.is_empty()).then(|| StringOr::String(text.join("\n"))),
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::openai::ChatChunk;

    fn chat(body: Value) -> ChatRequest {
        serde_json::from_value(body).expect("a valid chat request")
    }

    fn canonical(body: Value) -> Request {
        crate::wire::anthropic::translate::request_from_messages(
            serde_json::from_value(body).expect("a valid Messages request"),
        )
    }

    fn upstream_json(req: &Request) -> Value {
        serde_json::to_value(request_to_chat(req, "upstream-model")).expect("serializes")
    }

    #[test]
    fn a_tool_call_keeps_its_id_across_both_directions() {
        let (req, _) = request_from_chat(chat(json!({"model": "svc/gpt", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "18C"}]})))
        .expect("translates");
        let sent = upstream_json(&req);
        let messages = &sent["messages"];
        assert_eq!(messages[1]["tool_calls"][0]["id"], "call_abc");
        assert_eq!(
            messages[1]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Paris"}"#
        );
        assert_eq!(messages[1]["content"], Value::Null);
        assert_eq!(messages[2]["tool_call_id"], "call_abc");

        let reply = message_to_chat(vec![OutputBlock::ToolUse {
            id: "toolu_01XYZ".into(),
            name: "get_weather".into(),
            input: json!({"city": "Paris"}),
        }]);
        assert_eq!(reply.tool_calls[0].id, "call_01XYZ");
        assert_eq!(
            reply.content, None,
            "a reply of only tool calls has no text"
        );
    }

    #[test]
    fn a_streamed_tool_call_keeps_its_id_from_the_upstream_to_the_client() {
        let chunk: ChatChunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_9",
                "type":"function","function":{"name":"f","arguments":""}}]}}]}"#,
        )
        .expect("a chunk");
        let call = &chunk.choices[0].delta.tool_calls[0];
        let OutputBlock::ToolUse { id, name, .. } =
            tool_use_from_chat(call.id.clone(), call.function.name.clone())
        else {
            panic!("a tool_use block")
        };
        let start = tool_call_start_to_chat(0, &id, name);
        assert_eq!(
            serde_json::to_value(start).unwrap(),
            json!({"index": 0, "id": "call_9", "type": "function",
                   "function": {"name": "f", "arguments": ""}})
        );
        let OutputBlock::ToolUse { id, .. } = tool_use_from_chat(None, None) else {
            panic!("a tool_use block")
        };
        assert!(id.starts_with("toolu_"), "a call without an id gets one");
    }

    #[test]
    fn reasoning_effort_is_a_thinking_budget_that_stays_below_max_tokens() {
        let high = |max_tokens: Option<u32>| ReasoningEffort::High.thinking(max_tokens);
        assert!(matches!(
            high(None),
            Some(Thinking::Enabled { budget_tokens }) if budget_tokens == 16 * MIN_THINKING_BUDGET
        ));
        assert!(matches!(
            high(Some(5_000)),
            Some(Thinking::Enabled {
                budget_tokens: 4_999
            })
        ));
        assert!(
            high(Some(MIN_THINKING_BUDGET)).is_none(),
            "no room to think"
        );
        assert!(ReasoningEffort::None.thinking(None).is_none());
    }

    #[test]
    fn an_id_the_upstream_would_refuse_becomes_one_safe_id_for_call_and_result() {
        let req = canonical(json!({"model": "svc/gpt", "max_tokens": 10, "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "functions.get_weather:0",
                "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": "functions.get_weather:0", "content": "18C"}]}]}));
        let sent = upstream_json(&req);
        let call = &sent["messages"][1]["tool_calls"][0]["id"];
        assert!(
            call.as_str().is_some_and(|id| id.starts_with("call_")),
            "{call}"
        );
        assert_ne!(call, "functions.get_weather:0");
        assert_eq!(&sent["messages"][2]["tool_call_id"], call);
    }

    #[test]
    fn the_upstream_request_carries_only_what_the_canonical_request_sets_and_the_default_temperature(
    ) {
        let req = canonical(json!({"model": "svc/gpt", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(
            upstream_json(&req),
            json!({"model": "upstream-model", "max_tokens": 10, "temperature": 1.0,
                   "messages": [{"role": "user", "content": "hi"}]})
        );
    }

    #[test]
    fn an_omitted_temperature_is_sent_as_the_specs_default_except_while_thinking() {
        let req = canonical(json!({"model": "svc/gpt", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(upstream_json(&req)["temperature"], 1.0);
        let explicit = Request {
            temperature: Some(0.0),
            ..req.clone()
        };
        assert_eq!(upstream_json(&explicit)["temperature"], 0.0);
        let thinking = Request {
            thinking: Some(Thinking::Enabled {
                budget_tokens: 1024,
            }),
            max_tokens: 2048,
            ..req
        };
        assert_eq!(upstream_json(&thinking).get("temperature"), None);
    }

    #[test]
    fn every_canonical_field_reaches_the_upstream_in_chat_form() {
        let req = canonical(
            json!({"model": "svc/gpt", "max_tokens": 100, "system": "Be brief.",
            "temperature": 0.5, "top_p": 0.9, "stop_sequences": ["END"],
            "metadata": {"user_id": "u1"},
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "down", "is_error": true},
                    {"type": "text", "text": "and now?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
        );
        assert_eq!(
            upstream_json(&req),
            json!({"model": "upstream-model", "max_tokens": 100, "temperature": 0.5,
                "top_p": 0.9, "stop": ["END"], "user": "u1",
                "tools": [{"type": "function", "function": {"name": "get_weather",
                    "description": "", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": false,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "call_1",
                        "type": "function", "function": {"name": "get_weather",
                        "arguments": r#"{"city":"Paris"}"#}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "Error: down"},
                    {"role": "user", "content": [{"type": "text", "text": "and now?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
        );
    }

    #[test]
    fn an_image_keeps_its_bytes_across_both_directions() {
        for url in [
            "data:image/png;base64,iVBORw0KGgo=",
            "https://example.com/cat.png",
        ] {
            let source = image_from_url(url).expect("an image URL");
            assert_eq!(image_to_url(&source), url);
        }
        assert!(image_from_url("ftp://example.com/cat.png").is_none());
    }

    #[test]
    fn tool_choice_keeps_its_meaning_across_both_directions() {
        let named = ToolChoice::Tool {
            name: "f".into(),
            disable_parallel_tool_use: Some(true),
        };
        let any = ToolChoice::Any {
            disable_parallel_tool_use: None,
        };
        for choice in [named, any, ToolChoice::None] {
            let (chat_choice, parallel) = tool_choice_to_chat(&choice);
            let back = tool_choice_from_chat(chat_choice, parallel);
            assert_eq!(back, choice);
        }
        let (required, _) = tool_choice_to_chat(&ToolChoice::Any {
            disable_parallel_tool_use: None,
        });
        assert_eq!(serde_json::to_value(required).unwrap(), json!("required"));
    }

    #[test]
    fn parallel_tool_calls_false_without_a_tool_choice_still_allows_one_call_at_a_time() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let (req, _) = request_from_chat(chat(json!({"model": "svc/gpt", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools, "parallel_tool_calls": false})))
        .expect("translates");
        assert_eq!(
            req.tool_choice,
            Some(ToolChoice::Auto {
                disable_parallel_tool_use: Some(true)
            })
        );
        for (extra, why) in [
            (
                json!({"tools": tools, "parallel_tool_calls": true}),
                "parallel calls are the default",
            ),
            (
                json!({"parallel_tool_calls": false}),
                "no tools, nothing to call",
            ),
        ] {
            let mut body = json!({"model": "svc/gpt", "max_tokens": 16,
                "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut()
                .expect("an object")
                .extend(extra.as_object().expect("an object").clone());
            let (req, _) = request_from_chat(chat(body)).expect("translates");
            assert_eq!(req.tool_choice, None, "{why}");
        }
    }

    #[test]
    fn stop_reasons_keep_their_meaning_across_both_directions() {
        for stop in [
            StopReason::EndTurn,
            StopReason::MaxTokens,
            StopReason::ToolUse,
        ] {
            let called = stop == StopReason::ToolUse;
            assert_eq!(stop_from_chat(Some(stop_to_chat(stop)), called), stop);
        }
        assert_eq!(
            stop_to_chat(StopReason::StopSequence),
            FinishReason::Stop,
            "chat has no stop-sequence reason"
        );
        assert_eq!(
            stop_to_chat(StopReason::ModelContextWindowExceeded),
            FinishReason::Length,
            "chat has one reason for a cut answer"
        );
    }

    #[test]
    fn a_turn_that_called_a_tool_ends_in_tool_use_whatever_the_upstream_says() {
        let chunk: ChatChunk = serde_json::from_str(
            r#"{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        )
        .expect("a chunk");
        let finish = chunk.choices[0].finish_reason;
        assert_eq!(stop_from_chat(finish, true), StopReason::ToolUse);
        assert_eq!(
            stop_from_chat(Some(FinishReason::Other), false),
            StopReason::EndTurn
        );
    }

    #[test]
    fn cached_prompt_tokens_are_cache_reads_across_both_directions() {
        let tokens = TokenUsage {
            input_tokens: 10,
            output_tokens: 3,
            cache_read_input_tokens: 5,
            ..TokenUsage::default()
        };
        let chat = usage_to_chat(&BilledUsage { tokens, credits: 7 });
        assert_eq!((chat.prompt_tokens, chat.total_tokens), (15, 18));
        let wire = serde_json::to_value(chat).unwrap();
        assert_eq!(wire["prompt_tokens_details"]["cached_tokens"], 5);
        assert_eq!(wire["credits_consumed"], 7);
        let read: ChatUsage = serde_json::from_value(wire).unwrap();
        assert_eq!(usage_from_chat(&read), tokens);
    }

    #[test]
    fn cached_tokens_at_the_top_level_count_when_details_are_absent() {
        let read: ChatUsage = serde_json::from_value(
            json!({"prompt_tokens": 20, "completion_tokens": 2, "cached_tokens": 8}),
        )
        .unwrap();
        let tokens = usage_from_chat(&read);
        assert_eq!(
            (tokens.input_tokens, tokens.cache_read_input_tokens),
            (12, 8)
        );
    }

    #[test]
    fn an_upstreams_credits_are_not_read() {
        let read: ChatUsage =
            serde_json::from_value(json!({"prompt_tokens": 1, "credits_consumed": 99})).unwrap();
        assert_eq!(read.credits_consumed, 0);
    }
}
