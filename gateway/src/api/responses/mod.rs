//! `/v1/responses`: the OpenAI Responses API as a third surface on the turn path. A request
//! becomes the conversation (`wire::responses::translate`), the turn's events
//! become output items and stream events (`output`); stored responses live in the account's
//! `ResponseStore`.
//!
//! `POST /v1/responses` (JSON, or SSE with `stream: true`), `GET /v1/responses/{id}`,
//! `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`.

mod output;

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use time::OffsetDateTime;

use self::output::{Assembler, Shape};
use crate::edge::body::{self, JsonBody};
use crate::edge::path::Path;
use crate::error::ApiError;
use crate::state::TurnApi;
use gateway_core::auth::Principal;
use gateway_core::ids;
use gateway_core::providers::ProviderError;
use gateway_core::responses_store::{
    holds_nul, json_len, without_nul, ResponseStoreError, StoredResponse,
};
use gateway_core::turn::{self, Endpoint, Turn, TurnError, TurnEvent, TurnRequest, Turns};
use gateway_core::wire::responses::translate::{self, normalized_items, Labeled};
use gateway_core::wire::responses::unsent::unsent_text;
use gateway_core::wire::responses::{
    InputItem, ResponseObject, ResponsesRequest, Sequenced, Status, StreamEvent, SummaryMode,
};

const ENCRYPTED_REASONING: &str = "reasoning.encrypted_content";

pub async fn create(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    JsonBody(raw): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let (request, answer) = prepare(&state, &principal, raw).await?;
    let stream = request.request.stream;
    let turn = turn::start(&state.turns(), &principal, request).await?;
    let snapshot = turn.snapshot;
    let (assembler, keep) = answer.begin(&turn);
    let mut response = if stream {
        super::sse::response(events(turn, assembler, keep))
    } else {
        Json(complete(turn, assembler, keep).await?).into_response()
    };
    response.extensions_mut().insert(snapshot);
    Ok(response)
}

/// An item of a batch of `/v1/batches` whose endpoint is `/v1/responses`: the response
/// [`create`] answers the same body with, never streamed, its turn started by `start` (the
/// batch's lane and price).
pub async fn batch_item<F, Fut>(
    state: &Arc<TurnApi>,
    principal: &Principal,
    raw: Value,
    start: F,
) -> Result<ResponseObject, Unfinished>
where
    F: FnOnce(TurnRequest) -> Fut,
    Fut: std::future::Future<Output = Result<Turn, TurnError>>,
{
    let (mut request, answer) = prepare(state, principal, raw)
        .await
        .map_err(Unfinished::Failed)?;
    request.request.stream = false;
    let turn = start(request).await.map_err(|e| match e {
        TurnError::Provider(ProviderError::ShuttingDown) => Unfinished::Interrupted,
        TurnError::Provider(ProviderError::Overloaded { .. }) => Unfinished::Overloaded,
        e => Unfinished::Failed(e.into()),
    })?;
    let (assembler, keep) = answer.begin(&turn);
    complete(turn, assembler, keep).await
}

/// Why a JSON response has no answer.
pub enum Unfinished {
    /// Shutdown cut its turn before it ended: nothing was billed, it may run again.
    Interrupted,
    /// Its upstream was overloaded before any output: nothing was billed, it may run again.
    Overloaded,
    Failed(ApiError),
}

impl From<Unfinished> for ApiError {
    fn from(unfinished: Unfinished) -> Self {
        match unfinished {
            Unfinished::Interrupted => ProviderError::ShuttingDown.into(),
            Unfinished::Overloaded => ProviderError::overloaded().into(),
            Unfinished::Failed(error) => error,
        }
    }
}

/// Whether a batch item's body is a request [`create`] would run, as far as is known before
/// it runs (a `previous_response_id` is looked up then).
pub fn check_batch_body(state: &TurnApi, turns: &Turns, raw: Value) -> Result<(), ApiError> {
    let req: ResponsesRequest = body::from_value(raw)?;
    let items = translate::labeled_input(&req);
    let thinking_capable = turns
        .catalog
        .model(&req.model)
        .is_some_and(|m| m.config.capabilities.thinking);
    let translated = translate::translate(&req, items, thinking_capable, &state.reasoning_seal)?;
    turn::check(turns, &translated.request)?;
    Ok(())
}

/// What the turn of a response needs, and what its answer is built from once it started.
struct Answer {
    id: String,
    req: ResponsesRequest,
    raw: Value,
    store: bool,
    shape: Shape,
    keep: Option<Keep>,
}

impl Answer {
    fn begin(self, turn: &Turn) -> (Assembler, Option<Keep>) {
        let response = in_progress(self.id, &turn.model, &self.req, &self.raw, self.store);
        (Assembler::new(response, self.shape), self.keep)
    }
}

/// A Responses request as its turn's request, with what its answer is built from.
async fn prepare(
    state: &Arc<TurnApi>,
    principal: &Principal,
    raw: Value,
) -> Result<(TurnRequest, Answer), ApiError> {
    let req: ResponsesRequest = body::from_value(raw.clone())?;
    let account_id = principal.account.id.clone();
    // Postgres keeps no U+0000 in text or jsonb: a request that would store one, or look one
    // up, is refused before any store call or turn (else a 503 after the turn was billed).
    if (req.store.unwrap_or(true) || req.previous_response_id.is_some()) && holds_nul(&raw) {
        return Err(ApiError::invalid(
            "a string in the request holds U+0000 (NUL), which a stored response cannot keep: remove it, or send `store: false` without `previous_response_id`",
        ));
    }

    // The conversation so far: a stored response's input and output, then this input.
    let mut inherited: Vec<Value> = Vec::new();
    if let Some(previous) = &req.previous_response_id {
        let stored = state
            .responses
            .get(&account_id, previous)
            .await?
            .ok_or_else(|| unknown_response("previous_response_id", previous))?;
        inherited = stored.input_items;
        if let Some(output) = stored.response.get("output").and_then(Value::as_array) {
            inherited.extend(output.iter().cloned());
        }
    }
    let mut items: Vec<Labeled> = Vec::new();
    for (i, item) in inherited.iter().enumerate() {
        let item: InputItem = body::from_value(item.clone()).map_err(|_| {
            tracing::error!(index = i, "a stored response item does not parse");
            ApiError::internal()
        })?;
        items.push(Labeled {
            path: "previous_response_id".to_owned(),
            item,
        });
    }
    items.extend(translate::labeled_input(&req));

    let thinking_capable = state
        .catalog()
        .model(&req.model)
        .is_some_and(|m| m.config.capabilities.thinking);
    let translated = translate::translate(&req, items, thinking_capable, &state.reasoning_seal)?;
    let id = ids::response();
    let store = req.store.unwrap_or(true);
    let mut input_items = inherited;
    input_items.extend(normalized_items(raw.get("input").unwrap_or(&Value::Null)));
    // What is stored and never sent is billed as input; a response whose input alone is past
    // the account's quota is refused before anything is billed.
    let unsent_input = if store {
        state.responses.quota().admit(json_len(&input_items))?;
        unsent_text(&raw, &translated.skipped)
    } else {
        String::new()
    };
    let summary = req
        .reasoning
        .as_ref()
        .and_then(|r| r.summary.or(r.generate_summary))
        .is_some_and(|s| s != SummaryMode::None);
    let shape = Shape {
        summary,
        encrypted_content: req.include.iter().any(|i| i == ENCRYPTED_REASONING),
        names: translated.names,
        sealer: state.reasoning_seal.clone(),
        tokens: state.tokens,
    };
    let request = TurnRequest {
        id: id.clone(),
        endpoint: Endpoint::Responses,
        request: translated.request,
        open_max_tokens: translated.open_max_tokens,
        anthropic_beta: None,
        conversation: req.prompt_cache_key.clone(),
        unsent_input,
    };
    let keep = store.then(|| Keep {
        state: state.clone(),
        account_id,
        input_items,
    });
    let answer = Answer {
        id,
        req,
        raw,
        store,
        shape,
        keep,
    };
    Ok((request, answer))
}

/// The response object before any output: what `response.created` shows, and what the output
/// is folded into.
fn in_progress(
    id: String,
    model: &str,
    req: &ResponsesRequest,
    raw: &Value,
    store: bool,
) -> ResponseObject {
    let echo = |field: &str, default: Value| {
        raw.get(field)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    ResponseObject {
        id,
        object: "response",
        created_at: OffsetDateTime::now_utc().unix_timestamp(),
        status: Status::InProgress,
        error: None,
        incomplete_details: None,
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        model: model.to_owned(),
        output: Vec::new(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: req.previous_response_id.clone(),
        reasoning: echo("reasoning", json!({"effort": null, "summary": null})),
        store,
        temperature: req.temperature,
        text: echo("text", json!({"format": {"type": "text"}})),
        tool_choice: echo("tool_choice", json!("auto")),
        tools: echo("tools", json!([])),
        top_p: req.top_p,
        truncation: "disabled",
        usage: None,
        user: req.user.clone(),
        metadata: req.metadata.clone().unwrap_or_default(),
        prompt_cache_key: req.prompt_cache_key.clone(),
    }
}

/// What storing a finished response needs.
struct Keep {
    state: Arc<TurnApi>,
    account_id: String,
    input_items: Vec<Value>,
}

impl Keep {
    /// Stores the response before the client sees it finished, so that it can be retrieved or
    /// continued as soon as it is. A store that fails is the client's error (503, or 413 past
    /// the quota), never a response whose id then reads as absent. The turn was generated and
    /// settled before: the error says what it was billed.
    async fn put(self, assembler: &Assembler) -> Result<(), ApiError> {
        let stored = StoredResponse {
            id: assembler.response.id.clone(),
            account_id: self.account_id,
            created_at: OffsetDateTime::now_utc(),
            // A request holding a NUL was refused (`prepare`), but the upstream's output may
            // hold one, which Postgres cannot keep: the stored copy has U+FFFD in its place.
            response: without_nul(assembler.stored()),
            input_items: self.input_items,
        };
        self.state
            .responses
            .put(stored)
            .await
            .map_err(|e| not_stored(e, assembler))
    }
}

fn not_stored(e: ResponseStoreError, assembler: &Assembler) -> ApiError {
    let credits = assembler
        .response
        .usage
        .as_ref()
        .map_or(0, |u| u.credits_consumed);
    let mut error = ApiError::from(e);
    error.message = format!(
        "{}; response {} was generated and billed {credits} credits but is not stored",
        error.message, assembler.response.id
    );
    error
}

async fn complete(
    turn: Turn,
    mut assembler: Assembler,
    keep: Option<Keep>,
) -> Result<ResponseObject, Unfinished> {
    let mut events = turn.events;
    while let Some(event) = events.next().await {
        if let TurnEvent::Interrupted { .. } = event {
            // Its client received nothing: billed nothing, and free to retry.
            return Err(Unfinished::Interrupted);
        }
        let step = assembler.step(event);
        if let Some(error) = step.failed {
            return Err(Unfinished::Failed(error));
        }
        if step.done {
            if let Some(keep) = keep {
                keep.put(&assembler).await.map_err(Unfinished::Failed)?;
            }
            return Ok(assembler.response);
        }
    }
    Err(Unfinished::Failed(ApiError::internal()))
}

fn events(
    turn: Turn,
    mut assembler: Assembler,
    mut keep: Option<Keep>,
) -> impl Stream<Item = Bytes> {
    let mut turn_events = turn.events;
    async_stream::stream! {
        let mut sequence: u64 = 0;
        for event in assembler.start() {
            yield sse(&event, &mut sequence);
        }
        while let Some(event) = turn_events.next().await {
            let mut step = assembler.step(event);
            let finished = step.done && step.failed.is_none();
            if finished {
                if let Some(keep) = keep.take() {
                    if let Err(error) = keep.put(&assembler).await {
                        // Everything but the closing `response.completed`, then the failure.
                        step.events.pop();
                        let failed = assembler.fail(error);
                        step.events.extend(failed.events);
                        step.failed = failed.failed;
                    }
                }
            }
            for event in &step.events {
                yield sse(event, &mut sequence);
            }
            // A response that tells its bill (a stream cut by shutdown, or one billed but not
            // stored) ends on `response.failed`, not on an error event without it.
            if let Some(error) = step.failed.filter(|_| assembler.response.usage.is_none()) {
                let data = error.responses_stream_error(sequence);
                sequence += 1;
                yield super::sse::text(Some("error"), &data);
            }
            if step.done {
                return;
            }
        }
    }
}

fn sse(event: &StreamEvent, sequence: &mut u64) -> Bytes {
    let frame = super::sse::json(
        Some(event.name()),
        &Sequenced {
            event,
            sequence_number: *sequence,
        },
    );
    *sequence += 1;
    frame
}

fn unknown_response(field: &str, id: &str) -> ApiError {
    ApiError::not_found(format!("{field}: no response with id `{id}`"))
}

pub async fn get(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = state
        .responses
        .get(&principal.account.id, &id)
        .await?
        .ok_or_else(|| unknown_response("id", &id))?;
    Ok(Json(stored.response))
}

pub async fn delete(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.responses.delete(&principal.account.id, &id).await? {
        return Err(unknown_response("id", &id));
    }
    Ok(Json(
        json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

#[derive(Deserialize)]
struct InputItemsQuery {
    #[serde(default)]
    order: Option<Order>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    after: Option<String>,
}

#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Order {
    Asc,
    Desc,
}

const DEFAULT_ITEMS: usize = 20;
const MAX_ITEMS: usize = 100;

/// The stored input items, newest first unless `order=asc`, `limit` (1 to 100, default 20) at a
/// time after the item id `after`.
pub async fn input_items(
    State(state): State<Arc<TurnApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(id): Path<String>,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = Query::<InputItemsQuery>::try_from_uri(&uri)
        .map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))?;
    let limit = query.limit.unwrap_or(DEFAULT_ITEMS);
    if !(1..=MAX_ITEMS).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit: must be between 1 and {MAX_ITEMS}"
        )));
    }
    let stored = state
        .responses
        .get(&principal.account.id, &id)
        .await?
        .ok_or_else(|| unknown_response("id", &id))?;
    let mut items = stored.input_items;
    if query.order.unwrap_or(Order::Desc) == Order::Desc {
        items.reverse();
    }
    let start = match &query.after {
        None => 0,
        Some(after) => {
            items
                .iter()
                .position(|item| item.get("id").and_then(Value::as_str) == Some(after.as_str()))
                .ok_or_else(|| {
                    ApiError::invalid(format!("after: no input item with id `{after}`"))
                })?
                + 1
        }
    };
    let rest = items.get(start..).unwrap_or_default();
    let page: Vec<Value> = rest.iter().take(limit).cloned().collect();
    let id_of = |item: Option<&Value>| item.and_then(|i| i.get("id")).cloned();
    Ok(Json(json!({
        "object": "list",
        "data": page,
        "first_id": id_of(page.first()),
        "last_id": id_of(page.last()),
        "has_more": rest.len() > limit,
    })))
}
