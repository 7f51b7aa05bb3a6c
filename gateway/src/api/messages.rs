//! `POST /v1/messages`: the Messages API, as one JSON message or as SSE events.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::sse;
use crate::edge::body::JsonBody;
use crate::error::ApiError;
use crate::state::TurnApi;
use gateway_core::auth::Principal;
use gateway_core::ids;
use gateway_core::providers::ProviderEvent;
use gateway_core::turn::{self, Endpoint, Turn, TurnError, TurnEvent, TurnRequest};
use gateway_core::wire::anthropic::translate::{
    block_to_messages, delta_to_messages, request_from_messages, usage_to_messages,
};
use gateway_core::wire::anthropic::{
    MessageDeltaBody, MessageResponse, MessagesRequest, MessagesUsage, StreamEvent,
};

pub async fn create(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<MessagesRequest>,
) -> Result<Response, ApiError> {
    let request = request_from_messages(request);
    let stream = request.stream;
    let turn = turn::start(
        &state.turns(),
        &principal,
        TurnRequest {
            id: ids::message(),
            endpoint: Endpoint::Messages,
            request,
            open_max_tokens: false,
            anthropic_beta: anthropic_beta(&headers),
            conversation: session_id(&headers),
            unsent_input: String::new(),
        },
    )
    .await?;
    let snapshot = turn.snapshot;
    let mut response = if stream {
        sse::response(events(turn))
    } else {
        Json(collect(turn).await?).into_response()
    };
    response.extensions_mut().insert(snapshot);
    Ok(response)
}

/// A whole turn as one message, as a non-streaming call (or a batch item) answers it.
pub(super) async fn collect(turn: Turn) -> Result<MessageResponse, TurnError> {
    let (id, model) = (turn.id.clone(), turn.model.clone());
    let done = turn.collect().await?;
    Ok(MessageResponse {
        id,
        kind: "message",
        role: "assistant",
        content: done.content.into_iter().map(block_to_messages).collect(),
        model,
        stop_reason: Some(done.stop_reason),
        stop_sequence: done.stop_sequence,
        usage: usage_to_messages(done.usage),
    })
}

/// The client's `anthropic-beta` features (the header may be repeated), comma-separated as
/// the Messages API takes them; only an `anthropic` upstream is sent them.
/// Claude Code's session id: every turn of one session sends the same.
fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-claude-code-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn anthropic_beta(headers: &HeaderMap) -> Option<String> {
    let features: Vec<&str> = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    (!features.is_empty()).then(|| features.join(","))
}

fn events(turn: Turn) -> impl Stream<Item = Bytes> {
    let Turn {
        id,
        model,
        prompt,
        mut events,
        ..
    } = turn;
    async_stream::stream! {
        yield frame(&StreamEvent::MessageStart {
            message: MessageResponse {
                id,
                kind: "message",
                role: "assistant",
                content: Vec::new(),
                model,
                stop_reason: None,
                stop_sequence: None,
                usage: MessagesUsage { tokens: prompt, credits_consumed: None },
            },
        });
        yield frame(&StreamEvent::Ping);
        while let Some(event) = events.next().await {
            match event {
                TurnEvent::Provider(ProviderEvent::BlockStart { index, block }) => {
                    yield frame(&StreamEvent::ContentBlockStart { index, content_block: block_to_messages(block) });
                }
                TurnEvent::Provider(ProviderEvent::BlockDelta { index, delta }) => {
                    yield frame(&StreamEvent::ContentBlockDelta { index, delta: delta_to_messages(delta) });
                }
                TurnEvent::Provider(ProviderEvent::BlockStop { index }) => {
                    yield frame(&StreamEvent::ContentBlockStop { index });
                }
                TurnEvent::Provider(ProviderEvent::Started { .. } | ProviderEvent::Finish { .. }) => {}
                TurnEvent::Finished { stop_reason, stop_sequence, usage } => {
                    yield frame(&StreamEvent::MessageDelta {
                        delta: MessageDeltaBody { stop_reason: Some(stop_reason), stop_sequence },
                        usage: usage_to_messages(usage),
                    });
                    yield frame(&StreamEvent::MessageStop);
                }
                TurnEvent::Interrupted { usage } => {
                    let data = ApiError::interrupted_stream_json(&usage_to_messages(usage));
                    yield sse::text(Some("error"), &data);
                }
                TurnEvent::Failed(error) => {
                    yield sse::text(Some("error"), &ApiError::from(error).envelope_json());
                }
            }
        }
    }
}

fn frame(event: &StreamEvent) -> Bytes {
    sse::json(Some(event.name()), event)
}
