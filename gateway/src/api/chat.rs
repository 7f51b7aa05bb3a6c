//! `POST /v1/chat/completions`: the Chat Completions format, translated into the canonical
//! Messages request and back, in JSON and in SSE chunks ending with `data: [DONE]`.
//!
//! Translation rules: `system` and `developer` messages form the system prompt; consecutive
//! messages of one role merge (tool results join the following user turn) so the canonical
//! conversation alternates; `temperature` is accepted in OpenAI's [0, 2] and values above 1
//! are clamped to 1; `required` tool choice is `any`; `reasoning_effort` is a thinking budget
//! (left out on models without thinking); thinking blocks are not shown; tool calls carry
//! `call_` ids (`ids::openai_call`), and any id a client sends back is taken as it is.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::{Stream, StreamExt};
use serde_json::{json, Value};
use time::OffsetDateTime;

use super::body::JsonBody;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::ids;
use crate::providers::ProviderEvent;
use crate::state::AppState;
use crate::turn::{self, Collected, Endpoint, Turn, TurnEvent, TurnRequest};
use crate::wire::anthropic::{
    Delta, ImageSource, InputBlock, InputMessage, MessagesRequest, Metadata, OutputBlock, Role,
    Tool, ToolChoice, Usage,
};
use crate::wire::one_or_many::StringOr;
use crate::wire::openai::{
    AssistantMessage, ChatChunk, ChatCompletion, ChatMessage, ChatRequest, ChatToolChoice,
    ChatUsage, Choice, ChunkChoice, ChunkDelta, ContentPart, FinishReason, FunctionCall,
    FunctionDelta, PromptTokensDetails, ToolCall, ToolCallDelta, ToolChoiceMode,
};
use store::usage::StopReason;

pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    JsonBody(chat): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let include_usage = chat.stream_options.is_some_and(|o| o.include_usage);
    let conversation = chat.prompt_cache_key.clone();
    let (request, open_max_tokens) = to_messages(chat)?;
    let stream = request.stream;
    let turn = turn::start(
        &state.turns(),
        &principal,
        TurnRequest {
            id: ids::chat_completion(),
            endpoint: Endpoint::ChatCompletions,
            request,
            open_max_tokens,
            anthropic_beta: None,
            conversation,
        },
    )
    .await?;
    let snapshot = turn.snapshot;
    let mut response = if stream {
        Sse::new(chunks(turn, include_usage)).into_response()
    } else {
        let (id, model) = (turn.id.clone(), turn.model.clone());
        Json(completion(id, model, turn.collect().await?)).into_response()
    };
    response.extensions_mut().insert(snapshot);
    Ok(response)
}

/// The canonical request, and whether max_tokens was left open.
fn to_messages(chat: ChatRequest) -> Result<(MessagesRequest, bool), ApiError> {
    if chat.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "n: only 1 choice per request is supported",
        ));
    }
    if chat.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(ApiError::invalid("temperature: must be between 0 and 2"));
    }
    let mut system: Vec<String> = Vec::new();
    let mut messages: Vec<InputMessage> = Vec::new();
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
                    content: Some(StringOr::String(text_of(&content))),
                    is_error: None,
                    cache_control: None,
                }],
            ),
        };
        InputMessage::append(&mut messages, role, blocks);
    }
    let tools = chat
        .tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind != "function" {
                return Err(ApiError::invalid(format!(
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
    let disable_parallel_tool_use = chat.parallel_tool_calls.map(|p| !p);
    let tool_choice = chat.tool_choice.map(|c| match c {
        ChatToolChoice::Mode(ToolChoiceMode::None) => ToolChoice::None,
        ChatToolChoice::Mode(ToolChoiceMode::Auto) => ToolChoice::Auto {
            disable_parallel_tool_use,
        },
        ChatToolChoice::Mode(ToolChoiceMode::Required) => ToolChoice::Any {
            disable_parallel_tool_use,
        },
        ChatToolChoice::Named { function } => ToolChoice::Tool {
            name: function.name,
            disable_parallel_tool_use,
        },
    });
    let max_tokens = chat.max_completion_tokens.or(chat.max_tokens);
    let request = MessagesRequest {
        model: chat.model,
        max_tokens: max_tokens.unwrap_or(0),
        messages,
        system: (!system.is_empty()).then(|| StringOr::String(system.join("\n"))),
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
        metadata: chat.user.map(|user_id| Metadata {
            user_id: Some(user_id),
        }),
    };
    Ok((request, max_tokens.is_none()))
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

fn user_blocks(content: StringOr<ContentPart>, i: usize) -> Result<Vec<InputBlock>, ApiError> {
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
                source: ImageSource::from_url(&image_url.url).ok_or_else(|| {
                    ApiError::invalid(format!(
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
) -> Result<Vec<InputBlock>, ApiError> {
    let mut blocks = Vec::new();
    if let Some(text) = content.map(|c| text_of(&c)).filter(|t| !t.is_empty()) {
        blocks.push(InputBlock::text(text));
    }
    for (j, call) in tool_calls.unwrap_or_default().into_iter().enumerate() {
        let input: Value = serde_json::from_str(&call.function.arguments).map_err(|_| {
            ApiError::invalid(format!(
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

fn finish_reason(stop: StopReason) -> FinishReason {
    match stop {
        StopReason::EndTurn | StopReason::StopSequence => FinishReason::Stop,
        StopReason::MaxTokens => FinishReason::Length,
        StopReason::ToolUse => FinishReason::ToolCalls,
    }
}

fn chat_usage(usage: &Usage) -> ChatUsage {
    let t = &usage.tokens;
    let prompt = t.input_tokens + t.cache_creation_input_tokens + t.cache_read_input_tokens;
    ChatUsage {
        prompt_tokens: prompt,
        completion_tokens: t.output_tokens,
        total_tokens: prompt + t.output_tokens,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: t.cache_read_input_tokens,
        },
        credits_consumed: usage.credits_consumed.unwrap_or_default(),
    }
}

fn now() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

fn completion(id: String, model: String, done: Collected) -> ChatCompletion {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in done.content {
        match block {
            OutputBlock::Text { text: t } => text.push_str(&t),
            OutputBlock::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id: ids::openai_call(&id),
                kind: "function".to_owned(),
                function: FunctionCall {
                    name,
                    arguments: input.to_string(),
                },
            }),
            OutputBlock::Thinking { .. } => {}
        }
    }
    ChatCompletion {
        id,
        object: "chat.completion",
        created: now(),
        model,
        choices: vec![Choice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
                tool_calls,
                refusal: None,
            },
            finish_reason: finish_reason(done.stop_reason),
            logprobs: None,
        }],
        usage: chat_usage(&done.usage),
        system_fingerprint: None,
    }
}

fn chunks(turn: Turn, include_usage: bool) -> impl Stream<Item = Result<Event, Infallible>> {
    let Turn {
        id,
        model,
        mut events,
        ..
    } = turn;
    let created = now();
    async_stream::stream! {
        let chunk = |delta: ChunkDelta, finish_reason: Option<FinishReason>| {
            data(&ChatChunk {
                id: &id,
                object: "chat.completion.chunk",
                created,
                model: &model,
                choices: vec![ChunkChoice { index: 0, delta, finish_reason, logprobs: None }],
                usage: None,
            })
        };
        yield chunk(ChunkDelta { role: Some("assistant"), content: Some(String::new()), ..ChunkDelta::default() }, None);
        // Block index -> tool call ordinal.
        let mut tool_index: HashMap<usize, u32> = HashMap::new();
        while let Some(event) = events.next().await {
            match event {
                TurnEvent::Provider(ProviderEvent::BlockStart { index, block: OutputBlock::ToolUse { id: call_id, name, .. } }) => {
                    let ordinal = tool_index.len() as u32;
                    tool_index.insert(index, ordinal);
                    yield chunk(ChunkDelta {
                        tool_calls: vec![ToolCallDelta {
                            index: ordinal,
                            id: Some(ids::openai_call(&call_id)),
                            kind: Some("function"),
                            function: FunctionDelta { name: Some(name), arguments: String::new() },
                        }],
                        ..ChunkDelta::default()
                    }, None);
                }
                TurnEvent::Provider(ProviderEvent::BlockDelta { delta: Delta::Text { text }, .. }) => {
                    yield chunk(ChunkDelta { content: Some(text), ..ChunkDelta::default() }, None);
                }
                TurnEvent::Provider(ProviderEvent::BlockDelta { index, delta: Delta::InputJson { partial_json } }) => {
                    if let Some(&ordinal) = tool_index.get(&index) {
                        yield chunk(ChunkDelta {
                            tool_calls: vec![ToolCallDelta {
                                index: ordinal,
                                id: None,
                                kind: None,
                                function: FunctionDelta { name: None, arguments: partial_json },
                            }],
                            ..ChunkDelta::default()
                        }, None);
                    }
                }
                TurnEvent::Provider(_) => {}
                TurnEvent::Finished { stop_reason, usage, .. } => {
                    yield chunk(ChunkDelta::default(), Some(finish_reason(stop_reason)));
                    if include_usage {
                        yield data(&ChatChunk {
                            id: &id,
                            object: "chat.completion.chunk",
                            created,
                            model: &model,
                            choices: Vec::new(),
                            usage: Some(chat_usage(&usage)),
                        });
                    }
                    yield Ok(Event::default().data("[DONE]"));
                }
                TurnEvent::Failed(error) => {
                    yield Ok(Event::default().data(ApiError::from(error).envelope_json()));
                }
            }
        }
    }
}

fn data(chunk: &ChatChunk<'_>) -> Result<Event, Infallible> {
    Ok(Event::default().data(serde_json::to_string(chunk).unwrap_or_default()))
}
