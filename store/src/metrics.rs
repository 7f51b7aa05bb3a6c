//! The metrics the stores record: every call to Redis or Postgres, and the ledger's batches
//! and refusals. Process-wide, like the gateway's own, so a store records with a one-line
//! call; the gateway serves them on `/metrics` by adding them to its registry ([`register`]).
//! Label values are fixed words, never a key, an account or a message id.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LedgerLabels {
    op: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Store calls are bounded by their timeouts (250 ms by default): 0.1 ms .. ~1.6 s.
fn store_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 15))
}

/// Turns per ledger statement: 1 .. 128, the largest batch.
fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 8))
}

struct Metrics {
    store_latency: Histograms<StoreLabels>,
    store_errors: Family<StoreLabels, Counter>,
    ledger_batch: Histograms<LedgerLabels>,
    ledger_refused: Family<LedgerLabels, Counter>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    store_latency: Family::new_with_constructor(store_histogram),
    store_errors: Family::default(),
    ledger_batch: Family::new_with_constructor(batch_histogram),
    ledger_refused: Family::default(),
});

/// Adds the stores' metrics to `registry`, which then serves what the stores record (a family
/// and its clone share their series).
pub fn register(registry: &mut Registry) {
    let m = &*METRICS;
    registry.register(
        "gateway_store_call_duration_seconds",
        "Latency of calls to Redis and Postgres, by store and operation",
        m.store_latency.clone(),
    );
    registry.register(
        "gateway_store_call_errors",
        "Failed or timed-out calls to Redis and Postgres, by store and operation",
        m.store_errors.clone(),
    );
    registry.register(
        "gateway_ledger_batch_turns",
        "Turns carried by one reserve, settle or write statement (batched when Postgres is busy)",
        m.ledger_batch.clone(),
    );
    // Exported at 0 from the start, so `increase()` sees the first refusal (an alert on it
    // pages: the chart's GatewayLedgerRefusedTurns).
    for op in ["settle", "write", "void"] {
        let _ = m.ledger_refused.get_or_create(&LedgerLabels { op });
    }
    registry.register(
        "gateway_ledger_refused",
        "Turns whose ledger statement Postgres refused (a constraint), by op; never retried",
        m.ledger_refused.clone(),
    );
}

/// One call to an external store (`redis`, `postgres`): its latency, and whether it failed.
pub fn store_call(store: &'static str, op: &'static str, elapsed: Duration, ok: bool) {
    let labels = StoreLabels { store, op };
    METRICS
        .store_latency
        .get_or_create(&labels)
        .observe(elapsed.as_secs_f64());
    // The error counter exists from a store's first call, at 0: a ratio of errors to calls
    // (the chart's GatewayStoreErrors) then sees its first error, and reads 0 before it.
    let errors = METRICS.store_errors.get_or_create(&labels);
    if !ok {
        errors.inc();
    }
}

/// One ledger statement (`reserve`, `settle`, `write`) carrying `turns` turns.
pub fn ledger_batch(op: &'static str, turns: usize) {
    METRICS
        .ledger_batch
        .get_or_create(&LedgerLabels { op })
        .observe(turns as f64);
}

/// A turn's `settle`, `write` or `void` that Postgres refused (a constraint).
pub fn ledger_refused(op: &'static str) {
    METRICS
        .ledger_refused
        .get_or_create(&LedgerLabels { op })
        .inc();
}
