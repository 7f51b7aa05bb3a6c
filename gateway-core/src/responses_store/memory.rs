//! The in-process store: one map under one lock (every call is a few map operations, never
//! awaited while held). Each response is held as its compact JSON text, parsed again when read,
//! so that the bytes it is counted for are the memory it takes (a parsed `serde_json::Value`
//! takes several times its text). Each account is bounded by its quota and its count, its own
//! oldest evicted first; the whole store by its bytes, and when other accounts' responses fill
//! it a put is refused ([`ResponseStoreError::Full`]) rather than evicting theirs. Responses past
//! retention are invisible at once and purged by the timer.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{
    compact, size_of, to_micros, Quota, ResponseStore, ResponseStoreError, Retention,
    StoredResponse,
};

/// What each entry costs beyond its JSON text and ids: the map slots and the order index
/// (measured: a store of 10,000 one-line responses grows the heap by about this per entry).
pub const ENTRY_OVERHEAD: usize = 256;

#[derive(Clone, Copy, Debug)]
pub struct MemoryLimits {
    /// The most responses one account keeps.
    pub max_responses: usize,
    /// The most bytes all accounts' responses take together.
    pub max_bytes: usize,
    pub quota: Quota,
    pub retention: Retention,
}

impl Default for MemoryLimits {
    /// 10,000 responses an account, 256 MiB in all, 32 MiB an account, 30 days.
    fn default() -> Self {
        Self {
            max_responses: 10_000,
            max_bytes: 256 * 1024 * 1024,
            quota: Quota::default(),
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
    accounts: HashMap<String, Account>,
    next: u64,
    bytes: usize,
}

/// One account's responses: their bytes, and their ids in put order, the oldest first.
#[derive(Default)]
struct Account {
    bytes: usize,
    order: BTreeMap<u64, String>,
}

struct Entry {
    account_id: String,
    created_at: OffsetDateTime,
    /// The response and its input items, as compact JSON text.
    json: Arc<[u8]>,
    seq: u64,
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.by_id.remove(id)?;
        self.bytes -= entry.bytes;
        if let Some(account) = self.accounts.get_mut(&entry.account_id) {
            account.order.remove(&entry.seq);
            account.bytes -= entry.bytes;
            if account.order.is_empty() {
                self.accounts.remove(&entry.account_id);
            }
        }
        Some(entry)
    }

    /// Evicts the account's oldest response; false when it has none.
    fn evict_oldest_of(&mut self, account_id: &str) -> bool {
        let oldest = self
            .accounts
            .get(account_id)
            .and_then(|a| a.order.first_key_value())
            .map(|(_, id)| id.clone());
        oldest.is_some_and(|id| self.remove(&id).is_some())
    }

    fn account(&self, account_id: &str) -> (usize, usize) {
        self.accounts
            .get(account_id)
            .map_or((0, 0), |a| (a.order.len(), a.bytes))
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
            .filter(|(_, e)| e.created_at <= cutoff)
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
    async fn put(&self, stored: StoredResponse) -> Result<(), ResponseStoreError> {
        let bytes = size_of(&stored);
        self.limits.quota.admit(bytes)?;
        if bytes > self.limits.max_bytes {
            return Err(ResponseStoreError::Full);
        }
        let json: Arc<[u8]> = compact(&stored).into();
        let StoredResponse {
            id,
            account_id,
            created_at,
            ..
        } = stored;
        let mut inner = self.lock();
        if let Some(existing) = inner.by_id.get(&id) {
            if existing.account_id != account_id {
                return Err(ResponseStoreError::IdTaken(id));
            }
            inner.remove(&id);
        }
        // The account makes room within its own bounds, from its own oldest.
        let max_responses = self.limits.max_responses.max(1);
        loop {
            let (count, held) = inner.account(&account_id);
            let own_bound =
                count >= max_responses || held + bytes > self.limits.quota.account_max_bytes;
            let shared_bound = inner.bytes + bytes > self.limits.max_bytes;
            if !own_bound && !shared_bound {
                break;
            }
            if !inner.evict_oldest_of(&account_id) {
                // Only the shared bound is left, and only other accounts' responses fill it.
                return Err(ResponseStoreError::Full);
            }
        }
        let seq = inner.next;
        inner.next += 1;
        inner.bytes += bytes;
        let account = inner.accounts.entry(account_id.clone()).or_default();
        account.bytes += bytes;
        account.order.insert(seq, id.clone());
        inner.by_id.insert(
            id,
            Entry {
                account_id,
                created_at: to_micros(created_at),
                json,
                seq,
                bytes,
            },
        );
        Ok(())
    }

    async fn get(
        &self,
        account_id: &str,
        id: &str,
    ) -> Result<Option<StoredResponse>, ResponseStoreError> {
        let cutoff = self.limits.retention.cutoff(OffsetDateTime::now_utc());
        let (created_at, json) = {
            let inner = self.lock();
            let Some(entry) = inner
                .by_id
                .get(id)
                .filter(|e| e.account_id == account_id && e.created_at > cutoff)
            else {
                return Ok(None);
            };
            (entry.created_at, entry.json.clone())
        };
        // Parsed outside the lock: a large response never holds up the other accounts' calls.
        let (response, input_items) = serde_json::from_slice(&json).map_err(|e| {
            ResponseStoreError::Unavailable(format!("stored response is not valid JSON: {e}"))
        })?;
        Ok(Some(StoredResponse {
            id: id.to_owned(),
            account_id: account_id.to_owned(),
            created_at,
            response,
            input_items,
        }))
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, ResponseStoreError> {
        let mut inner = self.lock();
        let owned = inner
            .by_id
            .get(id)
            .is_some_and(|e| e.account_id == account_id);
        Ok(owned && inner.remove(id).is_some())
    }

    fn quota(&self) -> Quota {
        self.limits.quota
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
    async fn past_the_quota_the_oldest_responses_are_evicted_and_one_too_large_is_refused() {
        let one = size_of(&response("resp_1", &"x".repeat(1000)));
        let store = MemoryResponseStore::new(MemoryLimits {
            quota: Quota {
                account_max_bytes: one * 2 + one / 2,
            },
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
            Err(ResponseStoreError::TooLarge { .. })
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
