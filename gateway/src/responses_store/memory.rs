//! The in-process store: one map under one lock (every call is a few map operations, never
//! awaited while held), bounded in count and in bytes, the oldest put evicted first, and
//! responses past retention invisible at once and purged as puts and the timer come by.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{size_of, to_micros, ResponseStore, Retention, StoreError, StoredResponse};

#[derive(Clone, Copy, Debug)]
pub struct MemoryLimits {
    pub max_responses: usize,
    pub max_bytes: usize,
    pub retention: Retention,
}

impl Default for MemoryLimits {
    /// 10,000 responses, 256 MiB, 30 days.
    fn default() -> Self {
        Self {
            max_responses: 10_000,
            max_bytes: 256 * 1024 * 1024,
            retention: Retention::hours(Retention::DEFAULT_HOURS),
        }
    }
}

pub struct MemoryResponseStore {
    limits: MemoryLimits,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Entry>,
    /// Put order: sequence number -> id, the oldest first.
    order: BTreeMap<u64, String>,
    next: u64,
    bytes: usize,
}

struct Entry {
    stored: StoredResponse,
    seq: u64,
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.by_id.remove(id)?;
        self.order.remove(&entry.seq);
        self.bytes -= entry.bytes;
        Some(entry)
    }

    fn evict_oldest(&mut self) {
        if let Some((_, id)) = self.order.pop_first() {
            if let Some(entry) = self.by_id.remove(&id) {
                self.bytes -= entry.bytes;
            }
        }
    }
}

impl MemoryResponseStore {
    pub fn new(limits: MemoryLimits) -> Self {
        Self {
            limits,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the maps half-updated: each call's updates hold no
        // await and do not panic, so a poisoned lock's data is still whole.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the responses past retention; returns how many.
    pub fn purge_expired(&self) -> usize {
        let cutoff = self.limits.retention.cutoff(OffsetDateTime::now_utc());
        let mut inner = self.lock();
        let expired: Vec<String> = inner
            .by_id
            .iter()
            .filter(|(_, e)| e.stored.created_at <= cutoff)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            inner.remove(id);
        }
        expired.len()
    }

    pub fn retention(&self) -> Retention {
        self.limits.retention
    }

    /// Responses held now, and their bytes.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.by_id.len(), inner.bytes)
    }
}

#[async_trait]
impl ResponseStore for MemoryResponseStore {
    async fn put(&self, mut stored: StoredResponse) -> Result<(), StoreError> {
        stored.created_at = to_micros(stored.created_at);
        let bytes = size_of(&stored);
        let limit = self.limits.max_bytes;
        if bytes > limit {
            return Err(StoreError::TooLarge { size: bytes, limit });
        }
        let mut inner = self.lock();
        if let Some(existing) = inner.by_id.get(&stored.id) {
            if existing.stored.account_id != stored.account_id {
                return Err(StoreError::IdTaken(stored.id));
            }
            let id = stored.id.clone();
            inner.remove(&id);
        }
        while !inner.by_id.is_empty()
            && (inner.by_id.len() >= self.limits.max_responses.max(1)
                || inner.bytes + bytes > limit)
        {
            inner.evict_oldest();
        }
        let seq = inner.next;
        inner.next += 1;
        inner.order.insert(seq, stored.id.clone());
        inner.bytes += bytes;
        inner
            .by_id
            .insert(stored.id.clone(), Entry { stored, seq, bytes });
        Ok(())
    }

    async fn get(&self, account_id: &str, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let cutoff = self.limits.retention.cutoff(OffsetDateTime::now_utc());
        let inner = self.lock();
        Ok(inner
            .by_id
            .get(id)
            .map(|e| &e.stored)
            .filter(|s| s.account_id == account_id && s.created_at > cutoff)
            .cloned())
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let owned = inner
            .by_id
            .get(id)
            .is_some_and(|e| e.stored.account_id == account_id);
        Ok(owned && inner.remove(id).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn response(id: &str, text: &str) -> StoredResponse {
        StoredResponse {
            id: id.to_owned(),
            account_id: "acct_a".to_owned(),
            created_at: OffsetDateTime::now_utc(),
            response: json!({"id": id, "output_text": text}),
            input_items: vec![json!({"type": "message", "role": "user", "content": text})],
        }
    }

    #[tokio::test]
    async fn past_the_count_limit_the_oldest_response_is_evicted() {
        let store = MemoryResponseStore::new(MemoryLimits {
            max_responses: 2,
            ..MemoryLimits::default()
        });
        for id in ["resp_1", "resp_2", "resp_3"] {
            store.put(response(id, "hello")).await.unwrap();
        }
        assert_eq!(store.get("acct_a", "resp_1").await.unwrap(), None);
        assert!(store.get("acct_a", "resp_2").await.unwrap().is_some());
        assert!(store.get("acct_a", "resp_3").await.unwrap().is_some());
        assert_eq!(store.usage().0, 2);
    }

    #[tokio::test]
    async fn past_the_byte_limit_the_oldest_responses_are_evicted_and_one_too_large_is_refused() {
        let one = size_of(&response("resp_1", &"x".repeat(1000)));
        let store = MemoryResponseStore::new(MemoryLimits {
            max_bytes: one * 2 + one / 2,
            ..MemoryLimits::default()
        });
        for id in ["resp_1", "resp_2", "resp_3"] {
            store.put(response(id, &"x".repeat(1000))).await.unwrap();
        }
        assert_eq!(store.get("acct_a", "resp_1").await.unwrap(), None);
        assert!(store.get("acct_a", "resp_3").await.unwrap().is_some());
        let (count, bytes) = store.usage();
        assert_eq!(count, 2);
        assert!(bytes <= one * 2 + one / 2, "{bytes}");
        let huge = response("resp_big", &"x".repeat(one * 3));
        assert!(matches!(
            store.put(huge).await,
            Err(StoreError::TooLarge { .. })
        ));
        assert!(store.get("acct_a", "resp_3").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_purge_frees_the_responses_past_retention() {
        let retention = Retention::hours(1);
        let store = MemoryResponseStore::new(MemoryLimits {
            retention,
            ..MemoryLimits::default()
        });
        let mut old = response("resp_old", "hello");
        old.created_at = OffsetDateTime::now_utc() - time::Duration::hours(2);
        store.put(old).await.unwrap();
        store.put(response("resp_new", "hello")).await.unwrap();
        assert_eq!(store.purge_expired(), 1);
        assert_eq!(store.usage().0, 1);
        assert!(store.get("acct_a", "resp_new").await.unwrap().is_some());
    }
}
