//! Stored responses of the Responses API (`store: true`): the response object and the input
//! items it answered, kept for `GET /v1/responses/{id}`, its `input_items`, `DELETE` and
//! `previous_response_id`, for a retention period (30 days by default, as OpenAI keeps them).
//!
//! Two implementations behind one trait, chosen at start-up like the other stores:
//! [`MemoryResponseStore`] (standalone and cluster mode without a database: bounded in bytes
//! overall) and [`PostgresResponseStore`] (shared by every pod, purged periodically). Both keep
//! each account within its [`Quota`]: past it, that account's oldest responses are evicted to
//! make room, never another account's, and one response larger than the whole quota is
//! refused. Both pass the same contract suite (`tests/tests/responses_store.rs`). A response
//! is only ever seen by the account that stored it: another account's id reads as absent.

mod memory;
mod postgres;

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use thiserror::Error;
use time::OffsetDateTime;

pub use memory::{MemoryLimits, MemoryResponseStore, ENTRY_OVERHEAD};
pub use postgres::PostgresResponseStore;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use store::db::Database;

/// The store chosen at start-up, kept concrete for its retention purge.
#[derive(Clone)]
pub enum Backend {
    Memory(Arc<MemoryResponseStore>),
    Postgres(Arc<PostgresResponseStore>),
}

impl Backend {
    pub fn memory(limits: MemoryLimits) -> Self {
        Self::Memory(Arc::new(MemoryResponseStore::new(limits)))
    }

    pub fn postgres(db: Database, retention: Retention, quota: Quota) -> Self {
        Self::Postgres(Arc::new(PostgresResponseStore::new(db, retention, quota)))
    }

    pub fn store(&self) -> Arc<dyn ResponseStore> {
        match self {
            Self::Memory(store) => store.clone(),
            Self::Postgres(store) => store.clone(),
        }
    }

    fn retention(&self) -> Retention {
        match self {
            Self::Memory(store) => store.retention(),
            Self::Postgres(store) => store.retention(),
        }
    }

    async fn purge_expired(&self) -> Result<u64, ResponseStoreError> {
        match self {
            Self::Memory(store) => Ok(store.purge_expired() as u64),
            Self::Postgres(store) => store.purge_expired().await,
        }
    }

    /// Purges the responses past retention every [`Retention::purge_every`] until `stop`.
    /// Every pod runs it; deleting what is expired is idempotent, so they never conflict.
    pub async fn purge_until(self, stop: CancellationToken) {
        let every = self.retention().purge_every();
        let mut ticks = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            match self.purge_expired().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "stored responses past retention purged"),
                Err(e) => {
                    tracing::warn!(error = %e, "stored responses purge failed; retrying at the next tick")
                }
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct StoredResponse {
    pub id: String,
    pub account_id: String,
    pub created_at: OffsetDateTime,
    pub response: Value,
    pub input_items: Vec<Value>,
}

#[derive(Debug, Error)]
pub enum ResponseStoreError {
    /// One response larger than an account's whole quota.
    #[error("the response is {size} bytes, more than the {limit} bytes an account's stored responses may take")]
    TooLarge { size: usize, limit: usize },
    /// The in-process store is full of other accounts' responses, none of which this account
    /// may evict.
    #[error("the in-process response store is full")]
    Full,
    /// The id is stored already, for another account (ids are random: never in practice).
    #[error("response id `{0}` is taken")]
    IdTaken(String),
    #[error("response store unavailable: {0}")]
    Unavailable(String),
}

#[async_trait]
pub trait ResponseStore: Send + Sync {
    async fn put(&self, stored: StoredResponse) -> Result<(), ResponseStoreError>;
    /// `None` for an unknown id, another account's, or one past the retention period.
    async fn get(
        &self,
        account_id: &str,
        id: &str,
    ) -> Result<Option<StoredResponse>, ResponseStoreError>;
    /// Whether a response of this account was deleted.
    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, ResponseStoreError>;
    /// The bytes one account's stored responses may take.
    fn quota(&self) -> Quota;
}

/// The bytes (as [`size_of`] counts them) one account's stored responses may take together;
/// past it the account's oldest are evicted, and one response larger than it is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub account_max_bytes: usize,
}

impl Default for Quota {
    /// 32 MiB: a largest request (16 MiB body) and its answer fit.
    fn default() -> Self {
        Self {
            account_max_bytes: 32 * 1024 * 1024,
        }
    }
}

impl Quota {
    /// Refuses a response that could never fit, whatever is evicted.
    pub fn admit(self, size: usize) -> Result<(), ResponseStoreError> {
        let limit = self.account_max_bytes;
        if size > limit {
            return Err(ResponseStoreError::TooLarge { size, limit });
        }
        Ok(())
    }
}

/// How long stored responses are kept.
#[derive(Clone, Copy, Debug)]
pub struct Retention(pub Duration);

impl Retention {
    pub const DEFAULT_HOURS: u64 = 720;

    pub fn hours(hours: u64) -> Self {
        Self(Duration::from_secs(hours.saturating_mul(3600)))
    }

    /// Responses created before this instant are past retention.
    pub fn cutoff(self, now: OffsetDateTime) -> OffsetDateTime {
        let keep = time::Duration::try_from(self.0).unwrap_or(time::Duration::MAX);
        now.checked_sub(keep).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// How often expired responses are purged: a hundredth of the retention, within a minute
    /// and an hour, so a purge never lags the retention by more than about 1%.
    pub fn purge_every(self) -> Duration {
        (self.0 / 100).clamp(Duration::from_secs(60), Duration::from_secs(3600))
    }
}

/// Postgres keeps microseconds; both stores keep the same precision so that what is read
/// back equals what was stored, whichever store it is.
fn to_micros(t: OffsetDateTime) -> OffsetDateTime {
    t.replace_nanosecond(t.nanosecond() / 1_000 * 1_000)
        .unwrap_or(t)
}

/// The bytes a stored response counts against its account: its compact JSON text (what the
/// in-process store holds, and Postgres keeps as jsonb), its id and account, and a fixed
/// [`ENTRY_OVERHEAD`] for the bookkeeping around each entry.
pub fn size_of(stored: &StoredResponse) -> usize {
    json_len(&(&stored.response, &stored.input_items))
        + stored.id.len()
        + stored.account_id.len()
        + ENTRY_OVERHEAD
}

/// Whether a string (or an object's key) anywhere in `value` holds U+0000, which Postgres
/// keeps in neither text nor jsonb.
pub fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(fields) => fields.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// `value` with each U+0000 in its strings and keys replaced by U+FFFD, for a store that can
/// keep no NUL: the requests that would store one are refused, but an upstream's output may
/// hold one, and its turn is billed by then.
pub fn without_nul(value: Value) -> Value {
    let replaced = |s: String| {
        if s.contains('\0') {
            s.replace('\0', "\u{FFFD}")
        } else {
            s
        }
    };
    match value {
        Value::String(s) => Value::String(replaced(s)),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nul).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (replaced(k), without_nul(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The length of a value's compact JSON text, without writing it out.
pub fn json_len(value: &impl serde::Serialize) -> usize {
    let mut counter = Counter(0);
    // Writing to a counter cannot fail, and every value here serializes.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The response and its input items as one compact JSON text.
fn compact(stored: &StoredResponse) -> Vec<u8> {
    serde_json::to_vec(&(&stored.response, &stored.input_items)).unwrap_or_default()
}
