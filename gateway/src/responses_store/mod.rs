//! Stored responses of the Responses API (`store: true`): the response object and the input
//! items it answered, kept for `GET /v1/responses/{id}`, its `input_items`, `DELETE` and
//! `previous_response_id`, for a retention period (30 days by default, as OpenAI keeps them).
//!
//! Two implementations behind one trait, chosen at start-up like the other stores:
//! [`MemoryResponseStore`] (standalone and cluster mode without a database: bounded in count
//! and bytes, oldest evicted first) and [`PostgresResponseStore`] (shared by every pod, purged
//! periodically). Both pass the same contract suite (`tests/tests/responses_store.rs`). A
//! response is only ever seen by the account that stored it: another account's id reads as
//! absent.

mod memory;
mod postgres;

use std::time::Duration;

use async_trait::async_trait;
use thiserror::Error;
use time::OffsetDateTime;

pub use memory::{MemoryLimits, MemoryResponseStore};
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

    pub fn postgres(db: Database, retention: Retention) -> Self {
        Self::Postgres(Arc::new(PostgresResponseStore::new(db, retention)))
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

    async fn purge_expired(&self) -> Result<u64, StoreError> {
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
    pub response: serde_json::Value,
    pub input_items: Vec<serde_json::Value>,
}

#[derive(Debug, Error)]
pub enum StoreError {
    /// One response larger than the whole in-process store may hold.
    #[error("the response is {size} bytes, more than the {limit} bytes responses may take")]
    TooLarge { size: usize, limit: usize },
    /// The id is stored already, for another account (ids are random: never in practice).
    #[error("response id `{0}` is taken")]
    IdTaken(String),
    #[error("response store unavailable: {0}")]
    Unavailable(String),
}

#[async_trait]
pub trait ResponseStore: Send + Sync {
    async fn put(&self, stored: StoredResponse) -> Result<(), StoreError>;
    /// `None` for an unknown id, another account's, or one past the retention period.
    async fn get(&self, account_id: &str, id: &str) -> Result<Option<StoredResponse>, StoreError>;
    /// Whether a response of this account was deleted.
    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, StoreError>;
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

/// The bytes a stored response takes, as its JSON text.
fn size_of(stored: &StoredResponse) -> usize {
    let json = |v: &serde_json::Value| serde_json::to_vec(v).map_or(0, |b| b.len());
    stored.id.len()
        + stored.account_id.len()
        + json(&stored.response)
        + stored.input_items.iter().map(json).sum::<usize>()
}
