//! One model turn, whichever endpoint asked for it: resolve and validate, count input tokens,
//! admit against the key's limits, reserve the turn's maximum cost, call the provider, and
//! settle exactly once: on the final event, on a failure, on shutdown, or (when the client
//! goes away and the stream is dropped) from the drop guard, billing the input the upstream
//! was sent and the output the client saw (a stream's, as it was generated; none of a JSON
//! answer never sent): see [`cost`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::Peekable;
use futures::{Stream, StreamExt};
use serde_json::Value;
use thiserror::Error;
use tracing::Instrument;

use crds::config::{Affinity, Upstream};

use crate::auth::Principal;
use crate::conversation::{BilledUsage, CacheWrites, Delta, InputBlock, OutputBlock, Request};
use crate::limits::{Admission, AdmissionRequest, LimitError, Limiter, Snapshot, StreamSlot};
use crate::providers::{EventStream, ProviderError, ProviderEvent, Providers};
use crate::routing::breaker::Breakers;
use crate::routing::{fallback, AffinityKey, Catalog, Model, Needs, Price};
use crate::shutdown::Shutdown;
use crate::telemetry::{self, TurnTelemetry};
use crate::tokens::{TokenError, Tokenizer};
use crate::validate;
use store::ledger::{
    Ledger, LedgerError, MessageRecord, MessageStatus, NewReservation, ServedBy, Settlement,
};
use store::usage::{StopReason, TokenUsage};

mod detached;
pub mod embeddings;

pub use detached::DROPPED_MID_STEP;

/// What a turn uses: the part of the gateway's state below the edge, with the catalog as it
/// was when the turn began. Cloning it (a turn does, for its meter and its stream) is two
/// `Arc`s.
#[derive(Clone)]
pub struct Turns {
    pub catalog: Arc<Catalog>,
    services: Arc<TurnServices>,
}

/// The services of every turn, built once at start-up.
pub struct TurnServices {
    pub tokens: Tokenizer,
    pub limiter: Arc<dyn Limiter>,
    pub ledger: Arc<dyn Ledger>,
    pub providers: Arc<Providers>,
    /// The health of every upstream, which the fallback skips while its breaker is open.
    pub breakers: Breakers,
    pub shutdown: Shutdown,
}

impl Turns {
    pub fn new(catalog: Arc<Catalog>, services: Arc<TurnServices>) -> Self {
        Self { catalog, services }
    }
}

/// A turn reads its services as its own fields.
impl std::ops::Deref for Turns {
    type Target = TurnServices;
    fn deref(&self) -> &TurnServices {
        &self.services
    }
}

/// Why a turn was refused or ended early; the edge turns each into the spec's envelope.
#[derive(Debug, Error)]
pub enum TurnError {
    /// The request cannot be served as asked (400).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Validation(#[from] validate::Invalid),
    #[error(transparent)]
    Tokens(#[from] TokenError),
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The turn's events ended without its final one.
    #[error("the turn ended without its final event")]
    Unfinished,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    ChatCompletions,
    Responses,
    /// An item of a Message Batch (`/v1/messages/batches`), run by a worker.
    MessageBatches,
    /// An item of an OpenAI batch (`/v1/batches`) of `/v1/chat/completions`.
    ChatCompletionsBatches,
    /// An item of an OpenAI batch (`/v1/batches`) of `/v1/responses`.
    ResponsesBatches,
    /// `POST /v1/embeddings` ([`embeddings`]): input tokens only.
    Embeddings,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Self::Messages => "messages",
            Self::ChatCompletions => "chat_completions",
            Self::Responses => "responses",
            Self::MessageBatches => "message_batches",
            Self::ChatCompletionsBatches => "chat_completions_batches",
            Self::ResponsesBatches => "responses_batches",
            Self::Embeddings => "embeddings",
        }
    }

    /// The endpoint of a batch item of this endpoint's requests.
    fn batched(self) -> Self {
        match self {
            Self::Messages | Self::MessageBatches => Self::MessageBatches,
            Self::ChatCompletions | Self::ChatCompletionsBatches => Self::ChatCompletionsBatches,
            Self::Responses | Self::ResponsesBatches => Self::ResponsesBatches,
            // Never batched: `/v1/batches` runs chat completions and responses only.
            Self::Embeddings => Self::Embeddings,
        }
    }
}

pub struct TurnRequest {
    pub id: String,
    pub endpoint: Endpoint,
    pub request: Request,
    /// The client left max_tokens out (chat completions): the turn may produce as many tokens
    /// as the model's limits and the balance allow, and never fails only for want of a cap.
    pub open_max_tokens: bool,
    /// The Messages API client's `anthropic-beta` header, for an `anthropic` upstream.
    pub anthropic_beta: Option<String>,
    /// A conversation key the client sent outside the request body (Claude Code's session
    /// header, `prompt_cache_key`): the upstream affinity's first choice.
    pub conversation: Option<String>,
    /// Input the upstream never sees but the gateway keeps (a stored response's hosted-tool
    /// items and unread fields, as JSON text): billed as input tokens on top of the upstream's
    /// count, since it is stored. Empty on the other surfaces.
    pub unsent_input: String,
}

pub enum TurnEvent {
    Provider(ProviderEvent),
    Finished {
        stop_reason: StopReason,
        stop_sequence: Option<String>,
        usage: BilledUsage,
    },
    /// The shutdown grace period ran out before the turn ended: its stream stops here, billed
    /// what it sent (`usage`, told to the client in its last event, since a retry is billed
    /// again). A JSON turn's client received nothing: it is billed nothing and gets 503.
    Interrupted {
        usage: BilledUsage,
    },
    Failed(TurnError),
}

pub struct Turn {
    pub id: String,
    /// The virtual model id the client asked for; the only model name it ever sees.
    pub model: String,
    /// The prompt side of the usage as known when the turn starts: the upstream's own counts
    /// (cache tokens included) when it reports them up front, else the gateway's count.
    pub prompt: TokenUsage,
    pub snapshot: Snapshot,
    pub events: Pin<Box<dyn Stream<Item = TurnEvent> + Send>>,
}

/// A whole turn gathered for a non-streaming response.
pub struct Collected {
    pub content: Vec<OutputBlock>,
    pub stop_reason: StopReason,
    pub stop_sequence: Option<String>,
    pub usage: BilledUsage,
}

/// A turn, in the order of the spec's steps: resolve the model, validate, count the input,
/// check it fits the context window, choose the served model, admit, open the meter, reserve,
/// call an upstream, then read the prompt's usage. The events it returns stream the answer and
/// settle it ([`metered`]).
pub async fn start(
    state: &Turns,
    principal: &Principal,
    turn: TurnRequest,
) -> Result<Turn, TurnError> {
    begin(state, principal, turn, Lane::Interactive).await
}

/// How a turn is let in and priced.
#[derive(Clone, Debug)]
enum Lane {
    /// Against the key's RPM, TPM and stream slots, at the route's price.
    Interactive,
    /// A batch item: it takes nothing of the key's interactive limits (a batch's own
    /// workers bound it) and costs its route's batch price ratio of the interactive price,
    /// `default_price_percent` where the route sets none. Its ledger row names its batch.
    Batch {
        default_price_percent: u32,
        batch_id: String,
    },
}

/// A Message Batch item's turn ([`start`] otherwise): not streamed, never admitted against the
/// key's interactive limits, billed at the served route's batch price ratio of its price
/// (`default_price_percent` where it sets none), its ledger row naming `batch_id`.
pub async fn start_batch_item(
    state: &Turns,
    principal: &Principal,
    mut turn: TurnRequest,
    batch_id: &str,
    default_price_percent: u32,
) -> Result<Turn, TurnError> {
    turn.request.stream = false;
    turn.endpoint = turn.endpoint.batched();
    let lane = Lane::Batch {
        default_price_percent,
        batch_id: batch_id.to_owned(),
    };
    begin(state, principal, turn, lane).await
}

/// What [`start`] checks of a request before it costs anything: its model exists and the
/// request is valid for it. A Message Batch checks each of its requests so at creation.
pub fn check(state: &Turns, request: &Request) -> Result<(), TurnError> {
    let requested = resolve_model(state, &request.model)?;
    validate::request(request, &requested.id, &requested.config, false)?;
    Ok(())
}

async fn begin(
    state: &Turns,
    principal: &Principal,
    turn: TurnRequest,
    lane: Lane,
) -> Result<Turn, TurnError> {
    let TurnRequest {
        id,
        endpoint,
        request,
        open_max_tokens,
        anthropic_beta,
        conversation,
        unsent_input,
    } = turn;
    let requested = resolve_model(state, &request.model)?;
    let telemetry = TurnTelemetry::begin(&id, &requested.id, request.max_tokens, request.stream);
    validate::request(&request, &requested.id, &requested.config, open_max_tokens)?;
    let end_user = end_user(&request);
    if let Some(end_user) = &end_user {
        telemetry.end_user(end_user);
    }
    let (mut request, input) = count_input(state, request, unsent_input).await?;
    telemetry.input_tokens(input.billed());
    check_context_window(&requested, input.sent)?;
    let served = choose_served_model(state, &requested, &request, input.sent, open_max_tokens)?;
    let asked = if open_max_tokens {
        served.config.max_output_tokens
    } else {
        request.max_tokens
    };
    let room = window_room(&served, input.sent);
    request.max_tokens = asked.min(room);

    let (admission, price) = match &lane {
        Lane::Interactive => {
            let admission = telemetry
                .step(
                    "admission",
                    admit(state, principal, input.billed(), request.stream),
                )
                .await;
            (telemetry.admission(admission)?, served.price)
        }
        Lane::Batch {
            default_price_percent,
            ..
        } => {
            let unadmitted = Admission {
                snapshot: Snapshot::default(),
                stream_slot: None,
            };
            let per_million = served
                .config
                .batch_price_per_million
                .unwrap_or(default_price_percent.saturating_mul(10_000));
            (unadmitted, served.price.per_million(per_million))
        }
    };
    let (admitted, batch_id) = match lane {
        Lane::Interactive => (true, None),
        Lane::Batch { batch_id, .. } => (false, Some(batch_id)),
    };
    let mut meter = Meter {
        state: state.clone(),
        turn: OpenTurn {
            key_id: principal.key.id.clone(),
            admitted,
            stream_slot: admission.stream_slot,
            message_id: id.clone(),
            price,
            input,
            usage: TokenUsage {
                input_tokens: input.billed(),
                ..TokenUsage::default()
            },
            generated: String::new(),
            delivered_as_generated: request.stream,
            reserved_since: None,
            served_by: None,
            capped_by_window: false,
            telemetry,
        },
    };

    let plan = served.plan(|| AffinityKey::of(conversation.as_deref(), &request));
    let Some(upstream) = plan.first() else {
        meter.release().await;
        return Err(ProviderError::Unavailable.into());
    };
    let caching = request.cache_writes();
    let (floor, ceiling) = credits_to_reserve(&price, input, &request, caching, open_max_tokens);
    let reservation = NewReservation {
        record: MessageRecord {
            batch_id,
            end_user,
            ..message_record(
                &id,
                principal,
                endpoint,
                &requested,
                &served,
                upstream,
                request.stream,
            )
        },
        spend_cap: principal.spend_cap,
        min: floor,
        max: ceiling,
    };
    let reserved = meter.reserve(reservation).await?;
    if open_max_tokens {
        request.max_tokens = price
            .affordable_output(reserved, input.billed(), request.max_tokens, caching)
            .max(1);
    }
    validate::fit_thinking(&mut request, &served.config);
    // The window, not the client's max_tokens (nor the balance), is what cuts a generation
    // stopped at the max_tokens sent.
    meter.turn.capped_by_window = request.max_tokens == room && room < asked;

    let stream = request.stream;
    let attempt = fallback::Attempt {
        model: &served.id,
        plan: &plan,
        request: Arc::new(request),
        anthropic_beta: anthropic_beta.as_deref(),
        input_tokens: input.sent,
    };
    let mut events = call_upstream(state, &mut meter, &served, attempt, stream).await?;
    let prompt = read_prompt_usage(&mut meter, &mut events).await;
    Ok(Turn {
        id,
        model: requested.id.clone(),
        prompt,
        snapshot: admission.snapshot,
        events: Box::pin(metered(state.clone(), Box::pin(events), meter)),
    })
}

/// A turn's input tokens: what the upstream is sent, and what the gateway keeps without
/// sending it ([`TurnRequest::unsent_input`]).
#[derive(Clone, Copy, Debug, Default)]
struct Input {
    sent: u32,
    unsent: u32,
}

impl Input {
    /// The model's context holds what is sent; the bill covers what is stored too.
    fn billed(self) -> u32 {
        self.sent.saturating_add(self.unsent)
    }
}

/// Counts the request's tokens and the unsent input's, off the async workers when large.
async fn count_input(
    state: &Turns,
    request: Request,
    unsent_input: String,
) -> Result<(Request, Input), TurnError> {
    let (request, sent) = state.tokens.count_request_off_workers(request).await?;
    let unsent = count_unsent(state.tokens, unsent_input).await?;
    Ok((request, Input { sent, unsent }))
}

/// The input must leave room in the model's context window for at least one output token.
/// max_tokens need not fit beside it: as the Messages API does, a turn is admitted whatever its
/// max_tokens and its generation capped to the room left ([`window_room`]), ending with
/// `model_context_window_exceeded` when it fills it. The input is the gateway's count (an
/// estimate of the upstream's own: see [`crate::tokens`]).
fn check_context_window(requested: &Model, sent_tokens: u32) -> Result<(), TurnError> {
    let context = requested.config.context_window;
    if sent_tokens >= context {
        return Err(TurnError::Invalid(format!(
            "messages: the input is {sent_tokens} tokens, past the context window of {context} tokens of {}",
            requested.id
        )));
    }
    Ok(())
}

/// The output tokens the served model's context window has room for beside the input: the
/// most a turn's generation may take, whatever its max_tokens.
fn window_room(served: &Model, sent_tokens: u32) -> u32 {
    served.config.context_window.saturating_sub(sent_tokens)
}

/// The served model: the requested one, or the one behind a virtual model that meets what the
/// request needs.
fn choose_served_model(
    state: &Turns,
    requested: &Arc<Model>,
    request: &Request,
    sent_tokens: u32,
    open_max_tokens: bool,
) -> Result<Arc<Model>, TurnError> {
    let needs = needs(request, requested, sent_tokens, open_max_tokens);
    state
        .catalog
        .serving_model(requested, &needs)
        .ok_or_else(|| {
            TurnError::Invalid(format!(
                "model: no model behind {} can serve this request",
                requested.id
            ))
        })
}

/// The least and the most a reservation holds: the turn's most possible cost, or with an open
/// max_tokens at least one output token's worth (the reservation takes what the balance
/// allows in between, and the turn's max_tokens follows).
fn credits_to_reserve(
    price: &Price,
    input: Input,
    request: &Request,
    caching: CacheWrites,
    open_max_tokens: bool,
) -> (u64, u64) {
    let ceiling = price.ceiling(input.billed(), request.max_tokens, caching);
    let floor = if open_max_tokens {
        price.ceiling(input.billed(), 1, caching)
    } else {
        ceiling
    };
    (floor, ceiling)
}

/// The end user the request names (validated: at most `MAX_END_USER` bytes), as its row
/// keeps it; an empty one names nobody.
fn end_user(request: &Request) -> Option<String> {
    request
        .metadata
        .as_ref()
        .and_then(|m| m.user_id.as_deref())
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
}

/// The ledger row a reservation writes, naming the first upstream of the plan (the settlement
/// names another if fallback moved past it).
fn message_record(
    id: &str,
    principal: &Principal,
    endpoint: Endpoint,
    requested: &Model,
    served: &Model,
    upstream: &Upstream,
    stream: bool,
) -> MessageRecord {
    MessageRecord {
        id: id.to_owned(),
        account_id: principal.account.id.clone(),
        key_id: principal.key.id.clone(),
        model: requested.id.clone(),
        served_model: served.id.clone(),
        provider: provider_name(upstream),
        upstream: upstream.name.clone(),
        upstream_model: upstream.model.clone(),
        endpoint: endpoint.name(),
        stream,
        // The instant the id was minted at: the row's day partition, found again from the id.
        created_at: crate::ids::message_id::created_at(id)
            .unwrap_or_else(time::OffsetDateTime::now_utc),
        ..MessageRecord::default()
    }
}

/// Calls the plan's upstreams in turn until one answers; the meter records which (a failure
/// settles the turn as failed).
async fn call_upstream(
    state: &Turns,
    meter: &mut Meter,
    served: &Model,
    attempt: fallback::Attempt<'_>,
    stream: bool,
) -> Result<Peekable<EventStream>, TurnError> {
    let plan = attempt.plan;
    let upstream_span = meter.turn.telemetry.calling(stream);
    match fallback::start(&state.providers, &state.breakers, attempt)
        .instrument(upstream_span)
        .await
    {
        Ok((events, upstream)) => {
            meter
                .turn
                .telemetry
                .upstream_selected(&served.id, &upstream.name);
            let home = &plan[0].name;
            if served.config.affinity == Affinity::Conversation && *home != upstream.name {
                telemetry::metrics::affinity_moved(&served.id, home, &upstream.name);
            }
            meter.turn.served_by = Some(ServedBy {
                provider: provider_name(upstream),
                upstream: upstream.name.clone(),
                upstream_model: upstream.model.clone(),
            });
            Ok(events.peekable())
        }
        Err(e) => {
            meter.turn.telemetry.upstream_failed(&e);
            meter.settle(MessageStatus::Failed, None).await;
            Err(e.into())
        }
    }
}

/// The prompt side of the usage: the upstream's own counts when its first event reports them
/// (that event is consumed), else the gateway's count.
async fn read_prompt_usage(meter: &mut Meter, events: &mut Peekable<EventStream>) -> TokenUsage {
    if let Some(Ok(ProviderEvent::Started { usage })) = Pin::new(&mut *events).peek().await {
        meter.turn.usage = meter.with_unsent(*usage);
        events.next().await;
    }
    meter.turn.usage
}

/// Admits the turn against its key's limits (see [`detached`]: an admission that lands for a
/// turn already gone is finished at once).
async fn admit(
    state: &Turns,
    principal: &Principal,
    input_tokens: u32,
    stream: bool,
) -> Result<Admission, LimitError> {
    let limiter = state.limiter.clone();
    let (key, limits) = (principal.key.id.clone(), principal.limits);
    let request = AdmissionRequest {
        input_tokens: input_tokens.into(),
        stream,
        count_request: principal.request_count.take(),
    };
    let undo = {
        let (limiter, key) = (limiter.clone(), key.clone());
        move |admitted: Result<Admission, LimitError>| async move {
            if let Ok(admission) = admitted {
                end_admission(limiter, key, admission.stream_slot, input_tokens.into(), 0).await;
            }
        }
    };
    let admit = async move { limiter.admit(&key, &limits, request).await };
    detached::finish_or_undo(&state.shutdown.tasks, admit, undo).await
}

/// Ends an admission: gives its stream slot back and corrects the window's token count from
/// the estimate to the actual input tokens.
async fn end_admission(
    limiter: Arc<dyn Limiter>,
    key: String,
    stream_slot: Option<StreamSlot>,
    estimate: u64,
    actual: u64,
) {
    if let Err(e) = limiter.finish(&key, stream_slot, estimate, actual).await {
        tracing::warn!(error = %e, "could not finish an admission");
    }
}

/// Reserves the turn's credits (see [`detached`]: a reservation that lands for a turn already
/// gone is released at once, its row `client_disconnected`, billed nothing).
async fn reserve(state: &Turns, r: NewReservation) -> Result<u64, LedgerError> {
    let ledger = state.ledger.clone();
    let undo = {
        let (ledger, message_id) = (ledger.clone(), r.record.id.clone());
        move |reserved: Result<u64, LedgerError>| async move {
            if reserved.is_err() {
                return;
            }
            let release = Settlement::nothing(message_id, MessageStatus::ClientDisconnected);
            if let Err(e) = ledger.settle(release).await {
                tracing::warn!(error = %e, "could not release the reservation of a turn whose client left; the reaper will");
            }
        }
    };
    let reserve = async move { ledger.reserve(r).await };
    detached::finish_or_undo(&state.shutdown.tasks, reserve, undo).await
}

/// Tokens of [`TurnRequest::unsent_input`]: counted in place when small, on a blocking
/// thread of [`crate::cpu`] otherwise, like the request itself.
async fn count_unsent(tokens: Tokenizer, text: String) -> Result<u32, TokenError> {
    if text.len() <= crate::cpu::INLINE_BYTES {
        return Ok(tokens.count(&text));
    }
    Ok(crate::cpu::run(move || tokens.count(&text)).await?)
}

/// The provider kind as the ledger names it (internal only, never sent to clients).
fn provider_name(upstream: &Upstream) -> String {
    upstream.provider.as_str().to_owned()
}

/// The model a turn asks for; an embeddings route serves no turns.
fn resolve_model(state: &Turns, id: &str) -> Result<Arc<Model>, TurnError> {
    let model = resolve_any_model(state, id)?;
    if model.config.capabilities.embeddings {
        return Err(TurnError::Invalid(format!(
            "model: {id} is an embeddings model; it serves POST /v1/embeddings only"
        )));
    }
    Ok(model)
}

fn resolve_any_model(state: &Turns, id: &str) -> Result<Arc<Model>, TurnError> {
    state.catalog.model(id).cloned().ok_or_else(|| {
        TurnError::Invalid(format!(
            "model: unknown model `{id}`; GET /v1/models lists the available ones"
        ))
    })
}

/// An open max_tokens needs room for one output token; the cap then follows the serving model.
/// A candidate with room for the whole max_tokens beside the input is preferred (see
/// [`Catalog::serving_model`]).
/// Thinking counts only where the requested model offers it (svc/auto when its route says
/// so), since elsewhere it is left out of the turn.
fn needs(request: &Request, requested: &Model, input_tokens: u32, open_max_tokens: bool) -> Needs {
    let vision = request
        .messages
        .iter()
        .any(|m| m.blocks().any(|b| matches!(b, InputBlock::Image { .. })));
    Needs {
        input_tokens,
        max_tokens: if open_max_tokens {
            1
        } else {
            request.max_tokens
        },
        whole_output: true,
        vision,
        tools: !request.tools.is_empty(),
        thinking: requested.config.capabilities.thinking && request.thinking_budget().is_some(),
    }
}

/// Passes the provider's events through, settles on the last one, renews its stream slot
/// while it runs, and ends the turn, telling its bill, when the shutdown grace period runs
/// out. A turn that finishes without any block (an empty reply: the adapters drop empty text
/// blocks, and an upstream may stream none) gets one empty text block before its end, since
/// the Messages API answers at least one block and clients read `content[0]`; it carries no
/// text, so the bill is unchanged.
fn metered(
    state: Turns,
    mut upstream: EventStream,
    mut meter: Meter,
) -> impl Stream<Item = TurnEvent> + Send {
    let renewal = state
        .limiter
        .slot_renewal()
        .filter(|_| meter.turn.stream_slot.is_some())
        .map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
    async_stream::stream! {
        let mut renewal = renewal;
        let mut any_block = false;
        loop {
            let next = tokio::select! {
                biased;
                _ = state.shutdown.expired.cancelled() => {
                    let tokens = meter.partial_usage();
                    let credits = meter.settle(MessageStatus::Interrupted, None).await;
                    yield TurnEvent::Interrupted { usage: BilledUsage { tokens, credits } };
                    return;
                }
                _ = tick(&mut renewal) => {
                    meter.renew().await;
                    continue;
                }
                next = upstream.next() => next,
            };
            match next {
                Some(Ok(ProviderEvent::Finish { stop_reason, stop_sequence, usage })) => {
                    let stop_reason = meter.turn.stop_reason(stop_reason);
                    if !any_block {
                        for event in empty_text_block() {
                            yield TurnEvent::Provider(event);
                        }
                    }
                    let usage = meter.with_unsent(usage);
                    let credits = meter.settle(MessageStatus::Completed, Some((usage, stop_reason))).await;
                    yield TurnEvent::Finished {
                        stop_reason,
                        stop_sequence,
                        usage: BilledUsage { tokens: usage, credits },
                    };
                    return;
                }
                Some(Ok(event)) => {
                    any_block |= matches!(event, ProviderEvent::BlockStart { .. });
                    meter.observe(&event);
                    yield TurnEvent::Provider(event);
                }
                Some(Err(e)) => {
                    meter.turn.telemetry.upstream_failed(&e);
                    meter.settle(MessageStatus::Failed, None).await;
                    yield TurnEvent::Failed(e.into());
                    return;
                }
                None => {
                    meter.turn.telemetry.upstream_failed(&ProviderError::Upstream);
                    meter.settle(MessageStatus::Failed, None).await;
                    yield TurnEvent::Failed(ProviderError::Upstream.into());
                    return;
                }
            }
        }
    }
}

/// The content of an empty reply: one empty text block at index 0, as the Messages API
/// streams an empty text answer.
fn empty_text_block() -> [ProviderEvent; 2] {
    [
        ProviderEvent::BlockStart {
            index: 0,
            block: OutputBlock::Text {
                text: String::new(),
            },
        },
        ProviderEvent::BlockStop { index: 0 },
    ]
}

/// The next renewal tick; never, for limiters whose stream slots do not expire.
async fn tick(renewal: &mut Option<tokio::time::Interval>) {
    match renewal {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// A turn's services and what the turn holds, so that it is given back and billed exactly
/// once, however the turn ends.
struct Meter {
    state: Turns,
    turn: OpenTurn,
}

/// What a turn holds (a stream slot, a reservation) and has generated so far. The default
/// holds nothing: what a meter leaves behind once a dropped turn's settlement took it over.
#[derive(Default)]
struct OpenTurn {
    key_id: String,
    /// Admitted against the key's limits, which its end gives back (a batch item is not).
    admitted: bool,
    stream_slot: Option<StreamSlot>,
    message_id: String,
    price: Price,
    input: Input,
    usage: TokenUsage,
    /// Streamed output so far, counted only if the turn ends before the provider's usage.
    generated: String,
    /// The client receives the output as it is generated (a stream). A JSON client receives
    /// nothing until the turn completes, so a turn cut before then has given it no output to
    /// pay for (its input, once sent upstream, it pays for if it hung up: see [`cost`]).
    delivered_as_generated: bool,
    /// When its credits were reserved; `None` before, and once settled.
    reserved_since: Option<Instant>,
    /// The upstream that answered, for the ledger row (fallback may have moved past the first).
    served_by: Option<ServedBy>,
    /// The max_tokens sent upstream is the room left in the context window, below what the
    /// client asked for (or, left open, the model's max_output_tokens).
    capped_by_window: bool,
    telemetry: TurnTelemetry,
}

impl OpenTurn {
    /// Why the turn stopped, as the client is told and the ledger records it: a stop at a
    /// max_tokens the window capped is the window's (`model_context_window_exceeded`, as the
    /// Messages API ends such a turn), not the client's max_tokens.
    fn stop_reason(&self, upstream: StopReason) -> StopReason {
        match upstream {
            StopReason::MaxTokens if self.capped_by_window => {
                StopReason::ModelContextWindowExceeded
            }
            other => other,
        }
    }
}

impl Meter {
    /// The upstream's usage with the input it never saw added: that input is billed too.
    fn with_unsent(&self, mut usage: TokenUsage) -> TokenUsage {
        usage.input_tokens = usage.input_tokens.saturating_add(self.turn.input.unsent);
        usage
    }

    fn observe(&mut self, event: &ProviderEvent) {
        self.turn.telemetry.upstream_event();
        if let ProviderEvent::BlockDelta { delta, .. } = event {
            let generated = &mut self.turn.generated;
            match delta {
                Delta::Text { text } => generated.push_str(text),
                Delta::InputJson { partial_json } => generated.push_str(partial_json),
                Delta::Thinking { thinking } => generated.push_str(thinking),
                Delta::Signature { .. } => {}
            }
        }
    }

    async fn renew(&self) {
        if let Some(stream_slot) = &self.turn.stream_slot {
            if let Err(e) = self
                .state
                .limiter
                .renew(&self.turn.key_id, stream_slot)
                .await
            {
                tracing::warn!(error = %e, "could not renew a stream slot");
            }
        }
    }

    /// Reserves the turn's credits; a refusal gives the admission back.
    async fn reserve(&mut self, reservation: NewReservation) -> Result<u64, TurnError> {
        let started = Instant::now();
        let reservation = reserve(&self.state, reservation);
        match self.turn.telemetry.step("reservation", reservation).await {
            Ok(reserved) => {
                self.turn.reserved_since = Some(started);
                self.turn.telemetry.reserved(reserved);
                Ok(reserved)
            }
            Err(e) => {
                self.release().await;
                Err(e.into())
            }
        }
    }

    /// Gives back the admission when the turn ends before anything was reserved.
    async fn release(&mut self) {
        let release = self.end_admission(0);
        detached::finish(&self.state.shutdown.tasks, release).await;
    }

    /// Ends the turn's admission with `actual` input tokens; nothing for a turn not admitted.
    fn end_admission(&mut self, actual: u64) -> impl std::future::Future<Output = ()> + 'static {
        let stream_slot = self.turn.stream_slot.take();
        let (key, estimate) = (self.turn.key_id.clone(), self.turn.input.billed().into());
        let (limiter, admitted) = (self.state.limiter.clone(), self.turn.admitted);
        async move {
            if admitted {
                end_admission(limiter, key, stream_slot, estimate, actual).await;
            }
        }
    }

    /// Settles the reservation and the admission; returns the credits billed.
    async fn settle(
        &mut self,
        status: MessageStatus,
        outcome: Option<(TokenUsage, StopReason)>,
    ) -> u64 {
        let completed = outcome.is_some();
        let (usage, stop_reason) = match outcome {
            Some((usage, reason)) => (usage, Some(reason)),
            None => (self.partial_usage(), None),
        };
        self.settle_as(status, completed, usage, stop_reason).await
    }

    /// [`Meter::settle`] with the usage given: `completed` bills it whole; `stop_reason` is
    /// what the row records (none for an embeddings call, which generates nothing).
    async fn settle_as(
        &mut self,
        status: MessageStatus,
        completed: bool,
        usage: TokenUsage,
        stop_reason: Option<StopReason>,
    ) -> u64 {
        let finish = self.end_admission(usage.input_tokens.into());
        let turn = &mut self.turn;
        let cost = cost(
            &turn.price,
            &usage,
            status,
            completed,
            turn.delivered_as_generated,
        );
        let settlement = turn.reserved_since.take().map(|since| Settlement {
            message_id: turn.message_id.clone(),
            served_by: turn.served_by.take(),
            status,
            cost,
            usage,
            stop_reason,
            latency_ms: u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
        let tasks = &self.state.shutdown.tasks;
        let Some(settlement) = settlement else {
            detached::finish(tasks, finish).await;
            return 0;
        };
        // The admission (Redis) and the credits (Postgres) are independent: the turn's end
        // waits for the slower of the two, not their sum.
        let ledger = self.state.ledger.clone();
        let settle = async move { tokio::join!(finish, ledger.settle(settlement)).1 };
        let settled = turn
            .telemetry
            .step("settle", detached::finish(tasks, settle))
            .await;
        let billed = match settled {
            Ok(billed) => billed,
            Err(e) => {
                tracing::error!(error = %e, message_id = %turn.message_id, "settle failed; told 0");
                0
            }
        };
        turn.telemetry.settled(status, &usage, billed, stop_reason);
        billed
    }

    fn partial_usage(&self) -> TokenUsage {
        TokenUsage {
            output_tokens: self.state.tokens.count(&self.turn.generated),
            ..self.turn.usage
        }
    }
}

/// What a turn costs by how it ended. A completed turn: its usage. A turn that ended before its
/// end pays for the input it sent, once an upstream was sent it, and the output it received:
/// - its client left: the input (the upstream processed it and charges for it, whether or not
///   anyone reads the answer; without this a client could have any amount of input processed
///   for free by hanging up), plus, for a stream, what it generated, which its client received
///   as it was generated; a JSON answer never sent is not billed, so both kinds of hang-up
///   follow the one rule;
/// - shutdown interrupted it: a stream what it was sent (input and output, told in its last
///   event); a JSON turn nothing, since the gateway cut it, tells it 503 and its retry pays;
/// - its upstream failed: nothing (the ledger bills nothing of a failed turn).
///
/// The input is the upstream's own count once its first event reported it, else the
/// gateway's. The ledger then bills at most what was reserved (`Settlement::billed`).
fn cost(
    price: &Price,
    usage: &TokenUsage,
    status: MessageStatus,
    completed: bool,
    delivered_as_generated: bool,
) -> u64 {
    if completed || delivered_as_generated {
        price.credits(usage)
    } else if status == MessageStatus::ClientDisconnected {
        price.credits(&TokenUsage {
            output_tokens: 0,
            ..*usage
        })
    } else {
        0
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.turn.reserved_since.is_none() && self.turn.stream_slot.is_none() {
            return;
        }
        // Once the process is exiting (the settlement tracker is closed, the runtime going away)
        // nothing more can run: the reservation stays held, as after a crash, for the ledger's
        // recovery to release.
        let runtime = tokio::runtime::Handle::try_current();
        let (Ok(runtime), false) = (runtime, self.state.shutdown.tasks.is_closed()) else {
            tracing::error!(message_id = %self.turn.message_id, "turn dropped while exiting; not settled");
            return;
        };
        let mut rest = Meter {
            state: self.state.clone(),
            turn: std::mem::take(&mut self.turn),
        };
        let tasks = self.state.shutdown.tasks.clone();
        tasks.spawn_on(
            async move {
                rest.settle(MessageStatus::ClientDisconnected, None).await;
            },
            &runtime,
        );
    }
}

impl Turn {
    /// Gathers the whole turn, for non-streaming responses.
    pub async fn collect(mut self) -> Result<Collected, TurnError> {
        let mut content: Vec<OutputBlock> = Vec::new();
        let mut partial_json: Vec<String> = Vec::new();
        while let Some(event) = self.events.next().await {
            match event {
                TurnEvent::Provider(ProviderEvent::BlockStart { block, .. }) => {
                    content.push(block);
                    partial_json.push(String::new());
                }
                TurnEvent::Provider(ProviderEvent::BlockDelta { index, delta }) => {
                    if let (Some(block), Some(json)) =
                        (content.get_mut(index), partial_json.get_mut(index))
                    {
                        apply_delta(block, json, delta);
                    }
                }
                TurnEvent::Provider(ProviderEvent::BlockStop { index }) => {
                    if let (Some(OutputBlock::ToolUse { input, .. }), Some(json)) =
                        (content.get_mut(index), partial_json.get(index))
                    {
                        if !json.is_empty() {
                            *input = serde_json::from_str(json).unwrap_or(Value::Null);
                        }
                    }
                }
                TurnEvent::Provider(
                    ProviderEvent::Started { .. } | ProviderEvent::Finish { .. },
                ) => {}
                TurnEvent::Finished {
                    stop_reason,
                    stop_sequence,
                    usage,
                } => {
                    return Ok(Collected {
                        content,
                        stop_reason,
                        stop_sequence,
                        usage,
                    })
                }
                TurnEvent::Interrupted { .. } => return Err(ProviderError::ShuttingDown.into()),
                TurnEvent::Failed(e) => return Err(e),
            }
        }
        Err(TurnError::Unfinished)
    }
}

fn apply_delta(block: &mut OutputBlock, json: &mut String, delta: Delta) {
    match (block, delta) {
        (OutputBlock::Text { text }, Delta::Text { text: more }) => text.push_str(&more),
        (OutputBlock::ToolUse { .. }, Delta::InputJson { partial_json }) => {
            json.push_str(&partial_json)
        }
        (OutputBlock::Thinking { thinking, .. }, Delta::Thinking { thinking: more }) => {
            thinking.push_str(&more)
        }
        (OutputBlock::Thinking { signature, .. }, Delta::Signature { signature: s }) => {
            signature.push_str(&s)
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crds::config::{Capabilities, ModelConfig, Pricing, Route};

    use super::*;

    fn price() -> Price {
        Price::new(
            Pricing {
                input_micros_per_mtok: 3_000_000,
                output_micros_per_mtok: 15_000_000,
                ..Pricing::default()
            },
            1_000_000,
        )
    }

    fn usage() -> TokenUsage {
        TokenUsage {
            input_tokens: 1_000,
            output_tokens: 200,
            ..TokenUsage::default()
        }
    }

    #[test]
    fn a_completed_turn_costs_its_usage_streamed_or_not() {
        let full = price().credits(&usage());
        assert!(full > 0);
        let completed = MessageStatus::Completed;
        assert_eq!(cost(&price(), &usage(), completed, true, true), full);
        assert_eq!(cost(&price(), &usage(), completed, true, false), full);
    }

    #[test]
    fn a_stream_that_ends_early_costs_what_its_client_was_sent() {
        for status in [
            MessageStatus::ClientDisconnected,
            MessageStatus::Interrupted,
        ] {
            assert_eq!(
                cost(&price(), &usage(), status, false, true),
                price().credits(&usage())
            );
        }
    }

    #[test]
    fn a_json_turn_whose_client_hangs_up_costs_its_input_not_the_answer_it_never_got() {
        let input = TokenUsage {
            output_tokens: 0,
            ..usage()
        };
        let due = price().credits(&input);
        assert!(due > 0 && due < price().credits(&usage()));
        assert_eq!(
            cost(
                &price(),
                &usage(),
                MessageStatus::ClientDisconnected,
                false,
                false
            ),
            due
        );
    }

    #[test]
    fn a_json_turn_cut_by_shutdown_costs_nothing_its_retry_pays() {
        assert_eq!(
            cost(&price(), &usage(), MessageStatus::Interrupted, false, false),
            0
        );
    }

    fn model_of_context(context_window: u32) -> Model {
        Model {
            id: "svc/test".into(),
            config: ModelConfig {
                display_name: "Test".into(),
                context_window,
                max_output_tokens: 4_000,
                capabilities: Capabilities {
                    thinking: false,
                    vision: false,
                    tools: true,
                    embeddings: false,
                },
                pricing: Pricing::default(),
                route: Route::Upstreams(Vec::new()),
                affinity: Affinity::None,
                batch_price_per_million: None,
            },
            price: price(),
        }
    }

    fn asking(max_tokens: u32) -> Request {
        Request {
            max_tokens,
            ..Request::default()
        }
    }

    #[test]
    fn an_input_that_fills_the_context_window_is_refused() {
        let model = model_of_context(10_000);
        assert!(check_context_window(&model, 9_999).is_ok());
        let refused = check_context_window(&model, 10_000);
        assert!(
            matches!(&refused, Err(TurnError::Invalid(m)) if m.starts_with("messages:")),
            "{:?}",
            refused.err()
        );
    }

    #[test]
    fn generation_has_the_room_the_input_leaves_in_the_window() {
        let model = model_of_context(10_000);
        assert_eq!(window_room(&model, 6_000), 4_000);
        assert_eq!(window_room(&model, 9_999), 1);
    }

    #[test]
    fn a_stop_at_a_max_tokens_the_window_capped_is_the_windows() {
        let mut turn = OpenTurn {
            capped_by_window: true,
            ..OpenTurn::default()
        };
        assert_eq!(
            turn.stop_reason(StopReason::MaxTokens),
            StopReason::ModelContextWindowExceeded
        );
        for other in [
            StopReason::EndTurn,
            StopReason::StopSequence,
            StopReason::ToolUse,
        ] {
            assert_eq!(turn.stop_reason(other), other);
        }
        turn.capped_by_window = false;
        assert_eq!(
            turn.stop_reason(StopReason::MaxTokens),
            StopReason::MaxTokens
        );
    }

    #[test]
    fn a_turn_reserves_its_most_possible_cost_input_stored_unsent_included() {
        let input = Input {
            sent: 1_000,
            unsent: 500,
        };
        let most = price().ceiling(1_500, 200, CacheWrites::None);
        assert_eq!(
            credits_to_reserve(&price(), input, &asking(200), CacheWrites::None, false),
            (most, most)
        );
    }

    #[test]
    fn an_open_max_tokens_reserves_from_one_output_tokens_worth_up_to_the_whole_ceiling() {
        let input = Input {
            sent: 1_000,
            unsent: 0,
        };
        let (least, most) =
            credits_to_reserve(&price(), input, &asking(4_000), CacheWrites::None, true);
        assert_eq!(least, price().ceiling(1_000, 1, CacheWrites::None));
        assert_eq!(most, price().ceiling(1_000, 4_000, CacheWrites::None));
        assert!(least < most);
    }
}
