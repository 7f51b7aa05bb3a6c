//! The Prometheus metrics of one gateway process, served on the admin listener's `/metrics`.
//! One process-wide registry, so that any module records with a one-line call and nothing has
//! to thread a handle through the request path. Label values are bounded sets (endpoints,
//! virtual model ids, upstream names from the config, fixed kinds): never a key, an account or
//! a message id.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// What `/metrics` answers with: the OpenMetrics text format, which Prometheus reads.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    model: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    model: String,
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DimensionLabels {
    dimension: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamErrorLabels {
    upstream: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamTokenLabels {
    model: String,
    upstream: String,
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MoveLabels {
    model: String,
    from: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigLabels {
    version: String,
}

/// A circuit breaker's state, as the gauge's value: 0 closed, 1 half-open, 2 open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CircuitState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Gateway overhead is sub-millisecond to tens of milliseconds: 0.25 ms .. ~4 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
}

/// Time to first token spans a cached reply to a long thinking pause: 10 ms .. ~80 s.
fn ttft_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// A turn's own steps take tenths of a millisecond to a timeout: 0.05 ms .. ~2 s, finely
/// enough (x1.5) to tell where a millisecond of added latency went.
fn step_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 1.5, 27))
}

struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    added_latency: Histograms<ModelLabels>,
    time_to_first_token: Histograms<ModelLabels>,
    tokens: Family<TokenLabels, Counter>,
    credits: Family<ModelLabels, Counter>,
    rate_limited: Family<DimensionLabels, Counter>,
    streams_in_flight: Gauge,
    turns_in_flight: Gauge,
    upstream_errors: Family<UpstreamErrorLabels, Counter>,
    upstream_input: Family<UpstreamTokenLabels, Counter>,
    affinity_moves: Family<MoveLabels, Counter>,
    circuit_state: Family<UpstreamLabels, Gauge>,
    turn_steps: Histograms<StepLabels>,
    config: Family<ConfigLabels, Gauge>,
    ledger_partitions_awaiting_archive: Gauge,
    ledger_partitions_awaiting_close: Gauge,
    mail_queued: Gauge,
    mail_dropped: Counter,
}

impl Metrics {
    fn new() -> Self {
        let mut m = Self {
            registry: Registry::default(),
            requests: Family::default(),
            added_latency: Family::new_with_constructor(latency_histogram),
            time_to_first_token: Family::new_with_constructor(ttft_histogram),
            tokens: Family::default(),
            credits: Family::default(),
            rate_limited: Family::default(),
            streams_in_flight: Gauge::default(),
            turns_in_flight: Gauge::default(),
            upstream_errors: Family::default(),
            upstream_input: Family::default(),
            affinity_moves: Family::default(),
            circuit_state: Family::default(),
            turn_steps: Family::new_with_constructor(step_histogram),
            config: Family::default(),
            ledger_partitions_awaiting_archive: Gauge::default(),
            ledger_partitions_awaiting_close: Gauge::default(),
            mail_queued: Gauge::default(),
            mail_dropped: Counter::default(),
        };
        // Exported at 0 from the start, so a rate over them sees the first 429.
        for dimension in ["requests", "input_tokens", "streams"] {
            let _ = m.rate_limited.get_or_create(&DimensionLabels { dimension });
        }
        let r = &mut m.registry;
        r.register(
            "gateway_requests",
            "Requests answered, by endpoint, virtual model and HTTP status",
            m.requests.clone(),
        );
        r.register(
            "gateway_added_latency_seconds",
            "Time the gateway spends on a model request before calling the upstream",
            m.added_latency.clone(),
        );
        r.register(
            "gateway_time_to_first_token_seconds",
            "From the request's arrival to the first event of the upstream",
            m.time_to_first_token.clone(),
        );
        r.register(
            "gateway_tokens",
            "Tokens billed, by virtual model and type (input, output, cache_read, cache_creation)",
            m.tokens.clone(),
        );
        r.register(
            "gateway_credits_billed",
            "Credits billed, by virtual model",
            m.credits.clone(),
        );
        r.register(
            "gateway_rate_limited",
            "Requests refused with 429, by the dimension that refused",
            m.rate_limited.clone(),
        );
        r.register(
            "gateway_streams_in_flight",
            "Streaming turns open in this process",
            m.streams_in_flight.clone(),
        );
        r.register(
            "gateway_turns_in_flight",
            "Model turns holding credits (reserved, not yet settled) in this process",
            m.turns_in_flight.clone(),
        );
        r.register(
            "gateway_cpu_jobs_running",
            "CPU-bound jobs (large requests parsed and counted, images decoded, passwords hashed) running on blocking threads",
            crate::cpu::JOBS.running.clone(),
        );
        r.register(
            "gateway_cpu_jobs_started",
            "CPU-bound jobs started on blocking threads",
            crate::cpu::JOBS.started.clone(),
        );
        r.register(
            "gateway_cpu_jobs_abandoned",
            "CPU-bound jobs stopped early because their caller left (a client that hung up)",
            crate::cpu::JOBS.abandoned.clone(),
        );
        r.register(
            "gateway_upstream_errors",
            "Failed upstream calls, by upstream and kind",
            m.upstream_errors.clone(),
        );
        r.register(
            "gateway_upstream_input_tokens",
            "Input tokens by virtual model, serving upstream and type (uncached, cache_read, cache_creation): the prompt cache's share per upstream",
            m.upstream_input.clone(),
        );
        r.register(
            "gateway_affinity_moves",
            "Turns of a conversation served by another upstream than its own (it was failing or its breaker open), by model, from and to",
            m.affinity_moves.clone(),
        );
        r.register(
            "gateway_upstream_circuit_state",
            "Circuit breaker state per upstream: 0 closed, 1 half-open, 2 open",
            m.circuit_state.clone(),
        );
        // Redis and Postgres calls and the ledger's batches: the store crate's families.
        store::metrics::register(r);
        r.register(
            "gateway_turn_step_duration_seconds",
            "Time a model turn spends in each of the gateway's own steps (admission, reservation, settle)",
            m.turn_steps.clone(),
        );
        r.register(
            "gateway_config_info",
            "The version of the compiled configuration in use (value 1)",
            m.config.clone(),
        );
        r.register(
            "gateway_ledger_partitions_awaiting_archive",
            "Ledger days older than the retention still in Postgres after the last retention run (no archive configured, or their export failed)",
            m.ledger_partitions_awaiting_archive.clone(),
        );
        r.register(
            "gateway_ledger_partitions_awaiting_close",
            "Ledger days the retention keeps that are due to be closed (a week past final) and not closed yet after the last retention run",
            m.ledger_partitions_awaiting_close.clone(),
        );
        r.register(
            "gateway_mail_queued",
            "Dashboard mails handed to the SMTP server's queue and not yet sent or given up",
            m.mail_queued.clone(),
        );
        r.register(
            "gateway_mail_dropped",
            "Dashboard mails dropped because the SMTP queue was full",
            m.mail_dropped.clone(),
        );
        m
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The exposition text of every metric.
pub fn render() -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &METRICS.registry);
    out
}

pub fn request(endpoint: &'static str, model: &str, status: u16) {
    METRICS
        .requests
        .get_or_create(&RequestLabels {
            endpoint,
            model: model.to_owned(),
            status,
        })
        .inc();
}

pub fn added_latency(model: &str, elapsed: Duration) {
    METRICS
        .added_latency
        .get_or_create(&model_labels(model))
        .observe(elapsed.as_secs_f64());
}

pub fn time_to_first_token(model: &str, elapsed: Duration) {
    METRICS
        .time_to_first_token
        .get_or_create(&model_labels(model))
        .observe(elapsed.as_secs_f64());
}

/// Adds a turn's billed tokens of one type (`input`, `output`, `cache_read`, `cache_creation`).
pub fn tokens(model: &str, kind: &'static str, count: u64) {
    if count > 0 {
        METRICS
            .tokens
            .get_or_create(&TokenLabels {
                model: model.to_owned(),
                r#type: kind,
            })
            .inc_by(count);
    }
}

pub fn credits(model: &str, billed: u64) {
    METRICS
        .credits
        .get_or_create(&model_labels(model))
        .inc_by(billed);
}

/// A 429, by dimension: `requests`, `input_tokens` or `streams`.
pub fn rate_limited(dimension: &'static str) {
    METRICS
        .rate_limited
        .get_or_create(&DimensionLabels { dimension })
        .inc();
}

/// Counts an open stream until the returned guard is dropped.
pub fn stream_opened() -> InFlight {
    InFlight::count(&METRICS.streams_in_flight)
}

/// Counts a turn holding credits (reserved, not yet settled) until the returned guard is
/// dropped.
pub fn turn_reserved() -> InFlight {
    InFlight::count(&METRICS.turns_in_flight)
}

/// Counts a mail in the SMTP queue (waiting or being sent) until the guard is dropped.
pub fn mail_queued() -> InFlight {
    InFlight::count(&METRICS.mail_queued)
}

/// A mail dropped because the SMTP queue was full.
pub fn mail_dropped() {
    METRICS.mail_dropped.inc();
}

/// The mails in the SMTP queue now.
pub fn mails_queued() -> i64 {
    METRICS.mail_queued.get()
}

/// One unit of a gauge of things in flight, given back when dropped.
pub struct InFlight(&'static Gauge);

impl InFlight {
    fn count(gauge: &'static Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A failed upstream call; `kind` is a fixed word (`timeout`, `overloaded`, `error`, ...).
pub fn upstream_error(upstream: &str, kind: &'static str) {
    METRICS
        .upstream_errors
        .get_or_create(&UpstreamErrorLabels {
            upstream: upstream.to_owned(),
            kind,
        })
        .inc();
}

/// A settled turn's input tokens at the upstream that served it, by type.
pub fn upstream_input(
    model: &str,
    upstream: &str,
    uncached: u32,
    cache_read: u32,
    cache_creation: u32,
) {
    for (kind, count) in [
        ("uncached", uncached),
        ("cache_read", cache_read),
        ("cache_creation", cache_creation),
    ] {
        if count > 0 {
            METRICS
                .upstream_input
                .get_or_create(&UpstreamTokenLabels {
                    model: model.to_owned(),
                    upstream: upstream.to_owned(),
                    r#type: kind,
                })
                .inc_by(count.into());
        }
    }
}

/// A conversation's turn went to a fallback instead of its own upstream.
pub fn affinity_moved(model: &str, from: &str, to: &str) {
    METRICS
        .affinity_moves
        .get_or_create(&MoveLabels {
            model: model.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
        })
        .inc();
}

/// For the provider adapters' circuit breakers: the state each upstream is in now.
pub fn circuit_state(upstream: &str, state: CircuitState) {
    METRICS
        .circuit_state
        .get_or_create(&UpstreamLabels {
            upstream: upstream.to_owned(),
        })
        .set(state as i64);
}

/// The ledger days older than the retention that the last run kept.
pub fn ledger_partitions_awaiting_archive(days: usize) {
    METRICS
        .ledger_partitions_awaiting_archive
        .set(i64::try_from(days).unwrap_or(i64::MAX));
}

/// The ledger days kept, due to be closed and not closed after the last run.
pub fn ledger_partitions_awaiting_close(days: usize) {
    METRICS
        .ledger_partitions_awaiting_close
        .set(i64::try_from(days).unwrap_or(i64::MAX));
}

/// One of a turn's own steps (`admission`, `reservation`, `settle`) took `elapsed`.
pub fn turn_step(step: &'static str, elapsed: Duration) {
    METRICS
        .turn_steps
        .get_or_create(&StepLabels { step })
        .observe(elapsed.as_secs_f64());
}

/// The configuration now in use; the previous version's series is removed.
pub fn config_version(version: &str) {
    METRICS.config.clear();
    METRICS
        .config
        .get_or_create(&ConfigLabels {
            version: version.to_owned(),
        })
        .set(1);
}

fn model_labels(model: &str) -> ModelLabels {
    ModelLabels {
        model: model.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_follow_prometheus_conventions() {
        request("/v1/messages", "svc/sonnet", 200);
        store::metrics::store_call("redis", "admit", Duration::from_millis(2), false);
        config_version("v1");
        config_version("v2");
        let text = render();
        assert!(text.contains(
            r#"gateway_requests_total{endpoint="/v1/messages",model="svc/sonnet",status="200"} 1"#
        ));
        assert!(text.contains(r#"gateway_store_call_errors_total{store="redis",op="admit"} 1"#));
        assert!(text.contains(r#"gateway_config_info{version="v2"} 1"#));
        assert!(!text.contains(r#"version="v1""#));
        assert!(text.ends_with("# EOF\n"));
    }
}
