//! Stored responses (`store: true`, the Responses API's default): the response object as
//! returned and the input items it answered (those inherited through `previous_response_id`
//! included), kept per account so that `GET /v1/responses/{id}`, `input_items` and a later
//! `previous_response_id` find them. An id belongs to one account: another account's lookup
//! finds nothing, as if the id did not exist.
//!
//! This module holds the interface and the bounded in-process store of standalone mode.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use thiserror::Error;
use time::OffsetDateTime;

pub struct StoredResponse {
    pub id: String,
    pub account_id: String,
    pub created_at: OffsetDateTime,
    /// The response object as returned to the client.
    pub response: serde_json::Value,
    /// The input items in Responses format, including those inherited from
    /// `previous_response_id`.
    pub input_items: Vec<serde_json::Value>,
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("response store unavailable: {0}")]
    Unavailable(String),
}

#[async_trait]
pub trait ResponseStore: Send + Sync {
    async fn put(&self, stored: StoredResponse) -> Result<(), StoreError>;
    /// `None` for an unknown or expired id, and for another account's id.
    async fn get(&self, account_id: &str, id: &str) -> Result<Option<StoredResponse>, StoreError>;
    /// Whether the account had a response with this id.
    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, StoreError>;
}

/// The most bytes (of JSON) the in-process store holds, whatever the count: a stored response
/// carries every inherited input item, images included, so a few long conversations could
/// otherwise take the process' memory.
pub const MAX_MEMORY_BYTES: usize = 256 * 1024 * 1024;

/// At most `capacity` responses and [`MAX_MEMORY_BYTES`], each kept for `retention`; the
/// oldest go first when full.
pub struct MemoryResponseStore {
    capacity: usize,
    max_bytes: usize,
    retention: Duration,
    inner: Mutex<Memory>,
}

#[derive(Default)]
struct Memory {
    by_id: HashMap<String, (StoredResponse, usize)>,
    /// Ids in insertion order, for eviction; deleted ids are skipped when reached.
    order: VecDeque<String>,
    bytes: usize,
}

impl MemoryResponseStore {
    pub fn new(capacity: usize, retention: Duration) -> Self {
        Self::bounded(capacity, MAX_MEMORY_BYTES, retention)
    }

    pub fn bounded(capacity: usize, max_bytes: usize, retention: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            max_bytes,
            retention,
            inner: Mutex::new(Memory::default()),
        }
    }

    fn expired(&self, stored: &StoredResponse, now: OffsetDateTime) -> bool {
        now - stored.created_at >= self.retention
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters (at worst an id in `order` with no entry), so a poisoned lock is used as is.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl ResponseStore for MemoryResponseStore {
    async fn put(&self, stored: StoredResponse) -> Result<(), StoreError> {
        let size = size_of(&stored);
        if size > self.max_bytes {
            tracing::warn!(id = %stored.id, size, "a response too large to store was not stored");
            return Ok(());
        }
        let now = OffsetDateTime::now_utc();
        let mut memory = self.lock();
        let Memory {
            by_id,
            order,
            bytes,
        } = &mut *memory;
        while let Some(oldest) = order.front() {
            let full = by_id.len() >= self.capacity || *bytes + size > self.max_bytes;
            let stale = by_id
                .get(oldest)
                .is_none_or(|(s, _)| full || self.expired(s, now));
            if !stale {
                break;
            }
            if let Some((_, freed)) = order.pop_front().and_then(|id| by_id.remove(&id)) {
                *bytes -= freed;
            }
        }
        order.push_back(stored.id.clone());
        *bytes += size;
        if let Some((_, replaced)) = by_id.insert(stored.id.clone(), (stored, size)) {
            *bytes -= replaced;
        }
        Ok(())
    }

    async fn get(&self, account_id: &str, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let now = OffsetDateTime::now_utc();
        let memory = self.lock();
        Ok(memory
            .by_id
            .get(id)
            .map(|(s, _)| s)
            .filter(|s| s.account_id == account_id && !self.expired(s, now))
            .map(|s| StoredResponse {
                id: s.id.clone(),
                account_id: s.account_id.clone(),
                created_at: s.created_at,
                response: s.response.clone(),
                input_items: s.input_items.clone(),
            }))
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, StoreError> {
        let now = OffsetDateTime::now_utc();
        let mut memory = self.lock();
        let owned = memory
            .by_id
            .get(id)
            .is_some_and(|(s, _)| s.account_id == account_id && !self.expired(s, now));
        if let Some((_, freed)) = owned.then(|| memory.by_id.remove(id)).flatten() {
            memory.bytes -= freed;
        }
        Ok(owned)
    }
}

/// The JSON size of a stored response, for the memory bound.
fn size_of(stored: &StoredResponse) -> usize {
    let json = |v: &serde_json::Value| serde_json::to_vec(v).map(|b| b.len()).unwrap_or(0);
    json(&stored.response) + stored.input_items.iter().map(json).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(id: &str, account: &str) -> StoredResponse {
        StoredResponse {
            id: id.into(),
            account_id: account.into(),
            created_at: OffsetDateTime::now_utc(),
            response: json!({"id": id}),
            input_items: Vec::new(),
        }
    }

    #[tokio::test]
    async fn another_accounts_id_is_not_found_and_cannot_be_deleted() {
        let store = MemoryResponseStore::new(10, Duration::from_secs(60));
        store.put(stored("resp_a", "acct_1")).await.unwrap();
        assert!(store.get("acct_2", "resp_a").await.unwrap().is_none());
        assert!(!store.delete("acct_2", "resp_a").await.unwrap());
        assert!(store.get("acct_1", "resp_a").await.unwrap().is_some());
        assert!(store.delete("acct_1", "resp_a").await.unwrap());
        assert!(store.get("acct_1", "resp_a").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_full_store_forgets_its_oldest_response_first() {
        let store = MemoryResponseStore::new(2, Duration::from_secs(60));
        for id in ["resp_1", "resp_2", "resp_3"] {
            store.put(stored(id, "acct")).await.unwrap();
        }
        assert!(store.get("acct", "resp_1").await.unwrap().is_none());
        assert!(store.get("acct", "resp_2").await.unwrap().is_some());
        assert!(store.get("acct", "resp_3").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_store_past_its_byte_budget_forgets_its_oldest_response_first() {
        let one = size_of(&stored("resp_1", "acct"));
        let store = MemoryResponseStore::bounded(10, 2 * one, Duration::from_secs(60));
        for id in ["resp_1", "resp_2", "resp_3"] {
            store.put(stored(id, "acct")).await.unwrap();
        }
        assert!(store.get("acct", "resp_1").await.unwrap().is_none());
        assert!(store.get("acct", "resp_3").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_response_past_its_retention_is_gone() {
        let store = MemoryResponseStore::new(10, Duration::ZERO);
        store.put(stored("resp_1", "acct")).await.unwrap();
        assert!(store.get("acct", "resp_1").await.unwrap().is_none());
    }
}
