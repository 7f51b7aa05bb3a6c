//! `POST /v1/chat/completions`: the Chat Completions format, translated into the
//! conversation (`gateway_core::conversation`) and back (`wire::openai::translate`, which holds the
//! rules), in JSON and in SSE chunks ending with `data: [DONE]`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use time::OffsetDateTime;

use super::sse;
use crate::edge::body::JsonBody;
use crate::error::ApiError;
use crate::state::TurnApi;
use gateway_core::auth::Principal;
use gateway_core::conversation::{Delta, OutputBlock};
use gateway_core::ids;
use gateway_core::providers::ProviderEvent;
use gateway_core::turn::{self, Collected, Endpoint, Turn, TurnEvent, TurnRequest};
use gateway_core::wire::openai::translate::{
    message_to_chat, request_from_chat, stop_to_chat, tool_call_start_to_chat, usage_to_chat,
};
use gateway_core::wire::openai::{
    ChatChunk, ChatCompletion, ChatRequest, Choice, ChunkChoice, ChunkDelta, FinishReason,
    FunctionDelta, ToolCallDelta,
};

pub async fn create(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    JsonBody(chat): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let include_usage = chat.stream_options.is_some_and(|o| o.include_usage);
    let conversation = chat.prompt_cache_key.clone();
    let (request, open_max_tokens) = request_from_chat(chat)?;
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
            unsent_input: String::new(),
        },
    )
    .await?;
    let snapshot = turn.snapshot;
    let mut response = if stream {
        sse::response(chunks(turn, include_usage))
    } else {
        let (id, model) = (turn.id.clone(), turn.model.clone());
        Json(completion(id, model, turn.collect().await?)).into_response()
    };
    response.extensions_mut().insert(snapshot);
    Ok(response)
}

fn now() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

pub(super) fn completion(id: String, model: String, done: Collected) -> ChatCompletion {
    ChatCompletion {
        id,
        object: "chat.completion",
        created: now(),
        model,
        choices: vec![Choice {
            index: 0,
            message: message_to_chat(done.content),
            finish_reason: stop_to_chat(done.stop_reason),
            logprobs: None,
        }],
        usage: usage_to_chat(&done.usage),
        system_fingerprint: None,
    }
}

fn chunks(turn: Turn, include_usage: bool) -> impl Stream<Item = Bytes> {
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
                        tool_calls: vec![tool_call_start_to_chat(ordinal, &call_id, name)],
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
                    yield chunk(ChunkDelta::default(), Some(stop_to_chat(stop_reason)));
                    if include_usage {
                        yield data(&ChatChunk {
                            id: &id,
                            object: "chat.completion.chunk",
                            created,
                            model: &model,
                            choices: Vec::new(),
                            usage: Some(usage_to_chat(&usage)),
                        });
                    }
                    yield sse::text(None, "[DONE]");
                }
                TurnEvent::Interrupted { usage } => {
                    // Told whether or not the client asked for usage chunks: it is a bill.
                    yield sse::text(None, &ApiError::interrupted_stream_json(&usage_to_chat(&usage)));
                }
                TurnEvent::Failed(error) => {
                    yield sse::text(None, &ApiError::from(error).envelope_json());
                }
            }
        }
    }
}

fn data(chunk: &ChatChunk<'_>) -> Bytes {
    sse::json(None, chunk)
}
