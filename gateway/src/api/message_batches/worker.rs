//! The batch worker every gateway process runs: it claims items from the batch store (any
//! pod's batches: the store is shared in cluster mode) up to `--batch-concurrency` at a time,
//! runs each through the same turn as `/v1/messages` or, for an item of `/v1/batches`,
//! `/v1/chat/completions` or `/v1/responses` (routing, fallback, translation, the
//! ledger's reservation and settlement) at the batch price and outside the key's interactive
//! limits, and writes its result once. It stops claiming when the process drains; an item a
//! stopping process could not finish is left to its lease and runs again elsewhere.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use time::OffsetDateTime;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::errored;
use crate::api::batches::{self, error_result, response_result, Generated};
use crate::api::responses::{self, Unfinished};
use crate::api::{chat, messages};
use crate::error::ApiError;
use crate::state::BatchApi;
use gateway_core::auth::{identify_hash, permit, Principal};
use gateway_core::conversation::Request;
use gateway_core::ids;
use gateway_core::providers::ProviderError;
use gateway_core::shutdown::Shutdown;
use gateway_core::turn::{self, Endpoint, Turn, TurnError, TurnRequest, Turns};
use gateway_core::wire::anthropic::translate::request_from_messages;
use gateway_core::wire::anthropic::MessagesRequest;
use gateway_core::wire::openai::translate::request_from_chat;
use gateway_core::wire::openai::ChatRequest;
use store::accounts::StoreError;
use store::batches::{ClaimedItem, InputLine, ItemState, Outcome, RequestFormat};

/// How long an item whose upstream was overloaded waits before it is claimed again.
const OVERLOADED_BACKOFF: Duration = Duration::from_secs(2);
/// Batches past their retention forgotten per round of the retention sweep.
const FORGET_PER_ROUND: u32 = 100;
/// How often the retention sweep runs, or a quarter of the retention when that is shorter.
const FORGET_EVERY: Duration = Duration::from_secs(60);

/// Claims and runs items until the process drains, and sweeps the batches past their results'
/// retention.
pub async fn run(api: Arc<BatchApi>, shutdown: Shutdown) {
    tokio::spawn(forget_until(api.clone(), shutdown.draining.clone()));
    let worker = store::ids::instance();
    let slots = Arc::new(Semaphore::new(api.settings.concurrency));
    let mut swept: Option<Instant> = None;
    loop {
        let first = tokio::select! {
            () = shutdown.draining.cancelled() => return,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        if swept.is_none_or(|at| at.elapsed() >= api.settings.poll) {
            sweep(&api).await;
            swept = Some(Instant::now());
        }
        let free = 1 + slots.available_permits();
        let claimed = claim(&api, &worker, free).await;
        if claimed.is_empty() {
            drop(first);
            tokio::select! {
                () = shutdown.draining.cancelled() => return,
                () = tokio::time::sleep(api.settings.poll) => continue,
            }
        }
        let mut permit = Some(first);
        for item in claimed {
            let slot = match permit.take() {
                Some(first) => first,
                None => match slots.clone().acquire_owned().await {
                    Ok(slot) => slot,
                    Err(_) => return,
                },
            };
            let (api, worker) = (api.clone(), worker.clone());
            shutdown.tasks.spawn(run_item(api, worker, item, slot));
        }
    }
}

/// Ends the items of expired and cancelled batches that no worker holds.
async fn sweep(api: &BatchApi) {
    match api.batches.sweep(OffsetDateTime::now_utc()).await {
        Ok(0) => {}
        Ok(ended) => tracing::info!(ended, "batch items expired or cancelled"),
        Err(e) => tracing::warn!(error = %e, "could not sweep batch items"),
    }
}

/// Forgets the batches past their results' retention, and the expired uploads, every
/// [`FORGET_EVERY`] until `stop`.
/// Every pod runs it; forgetting is idempotent, so they never conflict.
async fn forget_until(api: Arc<BatchApi>, stop: CancellationToken) {
    let every = FORGET_EVERY
        .min(api.settings.results_kept / 4)
        .min(api.settings.files_expiry / 4);
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match forget_past_retention(&api).await {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(forgotten, "batches past their retention deleted"),
            Err(e) => {
                tracing::warn!(error = %e, "could not delete the batches past their retention; retrying at the next tick")
            }
        }
        let now = OffsetDateTime::now_utc();
        match api
            .batches
            .forget_expired_files(now, FORGET_PER_ROUND)
            .await
        {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(forgotten, "expired uploads deleted"),
            Err(e) => {
                tracing::warn!(error = %e, "could not delete the expired uploads; retrying at the next tick")
            }
        }
    }
}

/// Deletes a round of ended batches created longer ago than the retention: their output and
/// error files first, then their items and the batch (a round cut short is done again whole
/// by the next). Their ledger rows stay: the money record outlives the batch it names.
async fn forget_past_retention(api: &BatchApi) -> Result<usize, StoreError> {
    let cutoff = OffsetDateTime::now_utc() - api.settings.results_kept;
    let ids = api.batches.ended_before(cutoff, FORGET_PER_ROUND).await?;
    let files: Vec<String> = ids.iter().flat_map(|id| Generated::ids_of(id)).collect();
    api.files.forget_generated(&files).await?;
    for id in &ids {
        api.batches.forget(id).await?;
    }
    Ok(ids.len())
}

async fn claim(api: &BatchApi, worker: &str, free: usize) -> Vec<ClaimedItem> {
    let now = OffsetDateTime::now_utc();
    let limit = u32::try_from(free).unwrap_or(u32::MAX);
    match api
        .batches
        .claim(worker, limit, now, now + api.settings.lease)
        .await
    {
        Ok(claimed) => claimed,
        Err(e) => {
            tracing::warn!(error = %e, "could not claim batch items");
            Vec::new()
        }
    }
}

/// Runs one item and writes its result, holding its slot until then.
async fn run_item(
    api: Arc<BatchApi>,
    worker: String,
    item: ClaimedItem,
    _slot: OwnedSemaphorePermit,
) {
    let outcome = match execute(&api, &item).await {
        Ran::Ended(outcome) => outcome,
        Ran::Interrupted => {
            tracing::info!(batch = %item.batch_id, index = item.index, "batch item interrupted by shutdown; it runs again after its lease");
            return;
        }
        Ran::Overloaded => return put_back(&api, &worker, &item).await,
    };
    let now = OffsetDateTime::now_utc();
    match api
        .batches
        .finish(&worker, &item.batch_id, item.index, outcome, now)
        .await
    {
        Ok(true) => {
            if RequestFormat::OPENAI.contains(&item.format) {
                record_files_once_ended(&api, &item).await;
            }
        }
        Ok(false) => {
            tracing::warn!(batch = %item.batch_id, index = item.index, "batch item's lease ran out before it ended; its result was not written")
        }
        Err(e) => {
            tracing::error!(error = %e, batch = %item.batch_id, index = item.index, "could not write a batch item's result; it runs again after its lease")
        }
    }
}

/// Gives an item whose upstream was overloaded back to the queue, claimed again after
/// [`OVERLOADED_BACKOFF`] (up to its batch's expiry, when the sweep ends it `expired`).
async fn put_back(api: &BatchApi, worker: &str, item: &ClaimedItem) {
    let until = OffsetDateTime::now_utc() + OVERLOADED_BACKOFF;
    match api
        .batches
        .put_back(worker, &item.batch_id, item.index, until)
        .await
    {
        Ok(_) => {
            tracing::info!(batch = %item.batch_id, index = item.index, "batch item's upstream overloaded; it runs again later")
        }
        Err(e) => {
            tracing::warn!(error = %e, batch = %item.batch_id, index = item.index, "could not give back a batch item; it runs again after its lease")
        }
    }
}

/// Records an OpenAI batch's output and error files (their size, for `/v1/files`) when the
/// item just ended was its last; a batch ended otherwise (cancel, expiry) has them recorded
/// when it is next retrieved.
async fn record_files_once_ended(api: &BatchApi, item: &ClaimedItem) {
    let recorded = match api.batches.processing(&item.batch_id).await {
        Ok(true) => Ok(()),
        Ok(false) => batches::record_ended(api, &item.account_id, &item.batch_id).await,
        Err(e) => Err(e.into()),
    };
    if let Err(e) = recorded {
        tracing::warn!(error = %e.message, batch = %item.batch_id, "could not record a batch's output files; they are recorded when it is retrieved");
    }
}

/// What running an item came to.
enum Ran {
    Ended(Outcome),
    /// Shutdown cut its turn (nothing was billed for it: the answer was never delivered); it
    /// runs again after its lease.
    Interrupted,
    /// Its upstream answered overloaded (429, 529) before any output: nothing was billed, and
    /// it goes back to the queue for [`OVERLOADED_BACKOFF`], not errored.
    Overloaded,
}

/// What running the item came to.
async fn execute(api: &BatchApi, item: &ClaimedItem) -> Ran {
    let turns = api.turns.turns();
    let principal = match principal(api, &turns.catalog, item).await {
        Ok(principal) => principal,
        Err(e) => {
            return Ran::Ended(match item.format {
                RequestFormat::Messages => ended_with(&e, None),
                RequestFormat::ChatCompletions => {
                    openai_ended_with(&e, &ids::chat_completion(), None)
                }
                RequestFormat::Responses => openai_ended_with(&e, &ids::response(), None),
            })
        }
    };
    // An item of `/v1/batches` reads its request from its line of the input file.
    let read;
    let item = match &item.line {
        None => item,
        Some(line) => match body_of(api, item, line).await {
            Ok(Some(params)) => {
                read = ClaimedItem {
                    params,
                    ..item.clone()
                };
                &read
            }
            Ok(None) => {
                let gone = ApiError::invalid(format!(
                    "input_file_id: the batch's input file `{}` is gone; this request could not be read",
                    line.file_id
                ));
                let id = match item.format {
                    RequestFormat::Responses => ids::response(),
                    _ => ids::chat_completion(),
                };
                return Ran::Ended(openai_ended_with(&gone, &id, None));
            }
            Err(e) => {
                tracing::warn!(error = %e, batch = %item.batch_id, index = item.index, "could not read a batch item's input line; it runs again after its lease");
                return Ran::Interrupted;
            }
        },
    };
    match item.format {
        RequestFormat::Messages => execute_message(api, &turns, &principal, item).await,
        RequestFormat::ChatCompletions => execute_chat(api, &turns, &principal, item).await,
        RequestFormat::Responses => execute_response(api, &turns, &principal, item).await,
    }
}

/// A Messages API item: its result is `succeeded` with the message, or `errored`.
async fn execute_message(
    api: &BatchApi,
    turns: &Turns,
    principal: &Principal,
    item: &ClaimedItem,
) -> Ran {
    let request = match serde_json::from_str::<MessagesRequest>(&item.params) {
        Ok(request) => request_from_messages(request),
        Err(e) => return Ran::Ended(ended_with(&ApiError::invalid(format!("params: {e}")), None)),
    };
    let id = ids::message();
    let request = turn_request(&id, Endpoint::Messages, request, false);
    let started = start(api, turns, principal, item, request);
    let message = match started.await {
        Ok(turn) => messages::collect(turn).await,
        Err(TurnError::Provider(ProviderError::Overloaded { .. })) => return Ran::Overloaded,
        Err(e) => Err(e),
    };
    match message {
        Ok(message) => Ran::Ended(Outcome {
            state: ItemState::Succeeded,
            result: json!({"type": "succeeded", "message": message}).to_string(),
            message_id: Some(id),
        }),
        Err(TurnError::Provider(ProviderError::ShuttingDown)) => Ran::Interrupted,
        Err(e) => Ran::Ended(ended_with(&ApiError::from(e), Some(id))),
    }
}

/// A Chat Completions item (`/v1/batches`): its result is the response
/// `/v1/chat/completions` would have answered, a completion or an error envelope.
async fn execute_chat(
    api: &BatchApi,
    turns: &Turns,
    principal: &Principal,
    item: &ClaimedItem,
) -> Ran {
    let id = ids::chat_completion();
    let request = match serde_json::from_str::<ChatRequest>(&item.params) {
        Ok(chat) => request_from_chat(chat).map_err(ApiError::from),
        Err(e) => Err(ApiError::invalid(format!("body: {e}"))),
    };
    let (request, open_max_tokens) = match request {
        Ok(request) => request,
        Err(e) => return Ran::Ended(openai_ended_with(&e, &id, None)),
    };
    let request = turn_request(&id, Endpoint::ChatCompletions, request, open_max_tokens);
    let started = start(api, turns, principal, item, request);
    let completion = match started.await {
        Ok(turn) => {
            let model = turn.model.clone();
            turn.collect()
                .await
                .map(|done| chat::completion(id.clone(), model, done))
        }
        Err(TurnError::Provider(ProviderError::Overloaded { .. })) => return Ran::Overloaded,
        Err(e) => Err(e),
    };
    match completion {
        Ok(completion) => Ran::Ended(Outcome {
            state: ItemState::Succeeded,
            result: response_result(200, &id, &completion),
            message_id: Some(id),
        }),
        Err(TurnError::Provider(ProviderError::ShuttingDown)) => Ran::Interrupted,
        Err(e) => Ran::Ended(openai_ended_with(&ApiError::from(e), &id, Some(id.clone()))),
    }
}

/// A Responses API item (`/v1/batches` of `/v1/responses`): its result is the response
/// `/v1/responses` would have answered, a response object or an error envelope.
async fn execute_response(
    api: &BatchApi,
    turns: &Turns,
    principal: &Principal,
    item: &ClaimedItem,
) -> Ran {
    let raw = match serde_json::from_str::<Value>(&item.params) {
        Ok(raw) => raw,
        Err(e) => {
            let error = ApiError::invalid(format!("body: {e}"));
            return Ran::Ended(openai_ended_with(&error, &ids::response(), None));
        }
    };
    // The id of its response, once its turn is started (its ledger row's).
    let mut started = None;
    let answered = responses::batch_item(&api.turns, principal, raw, |request| {
        started = Some(request.id.clone());
        start(api, turns, principal, item, request)
    })
    .await;
    let id = started.clone().unwrap_or_else(ids::response);
    match answered {
        Ok(response) => Ran::Ended(Outcome {
            state: ItemState::Succeeded,
            result: response_result(200, &response.id, &response),
            message_id: Some(response.id),
        }),
        Err(Unfinished::Interrupted) => Ran::Interrupted,
        Err(Unfinished::Overloaded) => Ran::Overloaded,
        Err(Unfinished::Failed(e)) => Ran::Ended(openai_ended_with(&e, &id, started)),
    }
}

fn turn_request(
    id: &str,
    endpoint: Endpoint,
    request: Request,
    open_max_tokens: bool,
) -> TurnRequest {
    TurnRequest {
        id: id.to_owned(),
        endpoint,
        request,
        open_max_tokens,
        anthropic_beta: None,
        conversation: None,
        unsent_input: String::new(),
    }
}

/// The item's turn at the batch price (`start_batch_item` makes it a batch turn, not a stream).
async fn start(
    api: &BatchApi,
    turns: &Turns,
    principal: &Principal,
    item: &ClaimedItem,
    request: TurnRequest,
) -> Result<Turn, TurnError> {
    turn::start_batch_item(
        turns,
        principal,
        request,
        &item.batch_id,
        api.settings.price_percent,
    )
    .await
}

/// The key that created the batch, checked now: a key revoked, expired or suspended since
/// runs nothing more.
async fn principal(
    api: &BatchApi,
    catalog: &gateway_core::routing::Catalog,
    item: &ClaimedItem,
) -> Result<Principal, ApiError> {
    let principal = identify_hash(api.accounts.as_ref(), catalog, &item.key_hash).await?;
    let scope = match item.format {
        RequestFormat::Messages => "messages",
        RequestFormat::ChatCompletions => "chat",
        RequestFormat::Responses => "responses",
    };
    permit(&principal, scope)?;
    Ok(principal)
}

/// An item of `/v1/batches` ended with the error its endpoint (`/v1/chat/completions` or
/// `/v1/responses`) would have answered to request `id`; `message_id` when its turn started.
fn openai_ended_with(error: &ApiError, id: &str, message_id: Option<String>) -> Outcome {
    Outcome {
        state: ItemState::Errored,
        result: error_result(error, id),
        message_id,
    }
}

fn ended_with(error: &ApiError, message_id: Option<String>) -> Outcome {
    Outcome {
        state: ItemState::Errored,
        result: errored(error),
        message_id,
    }
}

/// The request of an item read from its input file's line; `None` when the file is gone.
async fn body_of(
    api: &BatchApi,
    item: &ClaimedItem,
    line: &InputLine,
) -> Result<Option<String>, StoreError> {
    let len = u32::try_from(line.len).unwrap_or(u32::MAX);
    let text = api
        .files
        .input_range(&item.account_id, &line.file_id, line.offset, len)
        .await?;
    // A line that no longer reads as it was checked runs as what it now is: its turn's checks
    // refuse it.
    Ok(text.map(|text| batches::input::body_of_line(&text).unwrap_or_default()))
}
