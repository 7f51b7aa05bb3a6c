//! The spans and metrics of one model turn (the turn itself is `turn.rs`). The request
//! span (opened by [`super::request`]) gets the turn's attributes, named after the
//! OpenTelemetry GenAI semantic conventions where one applies (`gen_ai.*`) and `svc.*`
//! otherwise; child spans cover admission, reservation, the upstream call and the settlement.
//! No attribute ever holds a key, a prompt or a completion: only ids, model names, counts and
//! credits.

use std::future::Future;
use std::time::Instant;

use opentelemetry::trace::Status;
use opentelemetry::{Array, StringValue, Value};
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::metrics::{self, InFlight};
use super::request::CONTEXT;
use crate::limits::LimitError;
use crate::providers::ProviderError;
use store::ledger::MessageStatus;
use store::usage::{StopReason, TokenUsage};

/// Travels with the turn (inside its meter) until it is settled.
pub struct TurnTelemetry {
    request: Span,
    model: String,
    arrived: Instant,
    upstream: Option<Upstream>,
    stream: Option<InFlight>,
    /// Counted while the turn holds credits.
    reserved: Option<InFlight>,
}

struct Upstream {
    name: String,
    span: Span,
    called: Instant,
    first_event: bool,
}

impl Default for TurnTelemetry {
    fn default() -> Self {
        Self {
            request: Span::none(),
            model: String::new(),
            arrived: Instant::now(),
            upstream: None,
            stream: None,
            reserved: None,
        }
    }
}

fn int(n: impl Into<u64>) -> i64 {
    i64::try_from(n.into()).unwrap_or(i64::MAX)
}

impl TurnTelemetry {
    /// Starts a turn's telemetry in the current request: `id` is the message id the client
    /// gets, `model` the virtual model asked for.
    pub fn begin(id: &str, model: &str, max_tokens: u32, stream: bool) -> Self {
        let arrived = CONTEXT
            .try_with(|c| {
                let _ = c.turn.set((id.to_owned(), model.to_owned()));
                c.arrived
            })
            .unwrap_or_else(|_| Instant::now());
        let request = Span::current();
        request.set_attribute("gen_ai.operation.name", "chat");
        request.set_attribute("gen_ai.response.id", id.to_owned());
        request.set_attribute("svc.message_id", id.to_owned());
        request.set_attribute("gen_ai.request.model", model.to_owned());
        request.set_attribute("gen_ai.request.max_tokens", i64::from(max_tokens));
        request.set_attribute("svc.stream", stream);
        Self {
            request,
            model: model.to_owned(),
            arrived,
            upstream: None,
            stream: None,
            reserved: None,
        }
    }

    /// Runs one step of the turn in a child span of the request, and records its duration.
    pub async fn step<F: Future>(&self, name: &'static str, step: F) -> F::Output {
        let started = Instant::now();
        let out = step
            .instrument(tracing::info_span!(parent: &self.request, "step", otel.name = name))
            .await;
        metrics::turn_step(name, started.elapsed());
        out
    }

    /// Records the admission's outcome and passes it on.
    pub fn admission<T>(&self, result: Result<T, LimitError>) -> Result<T, LimitError> {
        let outcome = match &result {
            Ok(_) => "admitted",
            Err(LimitError::Exceeded { dimension, .. }) => {
                self.request
                    .set_attribute("svc.rate_limit.dimension", dimension.label());
                "rate_limited"
            }
            Err(LimitError::Unavailable(_)) => "limiter_unavailable",
        };
        self.request.set_attribute("svc.admission", outcome);
        result
    }

    /// The end user the client named (`metadata.user_id`, `user`, `safety_identifier`), as
    /// OpenTelemetry's `enduser.id`: on the span only, never a metric label (one series per
    /// end user would be unbounded).
    pub fn end_user(&self, id: &str) {
        self.request.set_attribute("enduser.id", id.to_owned());
    }

    pub fn input_tokens(&self, estimate: u32) {
        self.request
            .set_attribute("svc.input_tokens.estimated", i64::from(estimate));
    }

    pub fn reserved(&mut self, credits: u64) {
        self.request
            .set_attribute("svc.credits.reserved", int(credits));
        self.reserved = Some(metrics::turn_reserved());
    }

    /// The upstream call starts: everything until now was the gateway's own latency. Returns
    /// the upstream span, which covers the fallback through the model's upstreams and lasts
    /// until the serving upstream's last event.
    pub fn calling(&mut self, stream: bool) -> Span {
        metrics::added_latency(&self.model, self.arrived.elapsed());
        let span = tracing::info_span!(
            parent: &self.request,
            "upstream",
            otel.name = "upstream call",
            otel.kind = "client",
        );
        self.upstream = Some(Upstream {
            name: String::new(),
            span: span.clone(),
            called: Instant::now(),
            first_event: false,
        });
        if stream {
            self.stream = Some(metrics::stream_opened());
        }
        span
    }

    /// The upstream that answered (after any fallback) and the model it serves.
    pub fn upstream_selected(&mut self, served_model: &str, name: &str) {
        self.request
            .set_attribute("gen_ai.response.model", served_model.to_owned());
        self.request.set_attribute("svc.upstream", name.to_owned());
        if let Some(upstream) = self.upstream.as_mut() {
            upstream.span.set_attribute("svc.upstream", name.to_owned());
            upstream
                .span
                .set_attribute("gen_ai.request.model", served_model.to_owned());
            name.clone_into(&mut upstream.name);
        }
    }

    /// An event came from the upstream; the first one gives the time to first token.
    pub fn upstream_event(&mut self) {
        let Some(upstream) = self.upstream.as_mut().filter(|u| !u.first_event) else {
            return;
        };
        upstream.first_event = true;
        let ttft = self.arrived.elapsed();
        metrics::time_to_first_token(&self.model, ttft);
        upstream.span.set_attribute(
            "svc.upstream.time_to_first_token_ms",
            int(u64::try_from(upstream.called.elapsed().as_millis()).unwrap_or(u64::MAX)),
        );
        self.request.set_attribute(
            "svc.time_to_first_token_ms",
            int(u64::try_from(ttft.as_millis()).unwrap_or(u64::MAX)),
        );
    }

    /// The turn failed upstream: before the first event (every attempt failed; each was
    /// counted by the fallback) or mid-stream (counted here, against the serving upstream).
    pub fn upstream_failed(&self, error: &ProviderError) {
        let kind = error.kind();
        if let Some(upstream) = &self.upstream {
            if !upstream.name.is_empty() {
                metrics::upstream_error(&upstream.name, kind);
            }
            upstream.span.set_status(Status::error(kind));
        }
        self.request.set_attribute("svc.upstream.error", kind);
    }

    /// The turn is settled: bills and usage go to the span and the counters, and the upstream
    /// span and the stream gauge end here.
    pub fn settled(
        &mut self,
        status: MessageStatus,
        usage: &TokenUsage,
        billed: u64,
        stop_reason: Option<StopReason>,
    ) {
        let upstream = self.upstream.take();
        self.stream = None;
        self.reserved = None;
        let status = status.as_str();
        let model = &self.model;
        if let Some(upstream) = upstream.filter(|u| !u.name.is_empty()) {
            metrics::upstream_input(
                model,
                &upstream.name,
                usage.input_tokens,
                usage.cache_read_input_tokens,
                usage.cache_creation_input_tokens,
            );
        }
        metrics::tokens(model, "input", usage.input_tokens.into());
        metrics::tokens(model, "output", usage.output_tokens.into());
        metrics::tokens(model, "cache_read", usage.cache_read_input_tokens.into());
        metrics::tokens(
            model,
            "cache_creation",
            usage.cache_creation_input_tokens.into(),
        );
        metrics::credits(model, billed);
        let span = &self.request;
        span.set_attribute("svc.status", status);
        span.set_attribute("svc.credits.billed", int(billed));
        span.set_attribute("gen_ai.usage.input_tokens", i64::from(usage.input_tokens));
        span.set_attribute("gen_ai.usage.output_tokens", i64::from(usage.output_tokens));
        span.set_attribute(
            "gen_ai.usage.cache_read.input_tokens",
            i64::from(usage.cache_read_input_tokens),
        );
        span.set_attribute(
            "gen_ai.usage.cache_creation.input_tokens",
            i64::from(usage.cache_creation_input_tokens),
        );
        if let Some(reason) = stop_reason {
            let reason = match reason {
                StopReason::EndTurn => "end_turn",
                StopReason::MaxTokens => "max_tokens",
                StopReason::StopSequence => "stop_sequence",
                StopReason::ToolUse => "tool_use",
                StopReason::ModelContextWindowExceeded => "model_context_window_exceeded",
            };
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                Value::Array(Array::String(vec![StringValue::from(reason)])),
            );
        }
    }
}
