//! The contract every `ResponseStore` keeps (`mod contract` below), run against both stores,
//! in process and on a real Postgres (each with a small per-account quota, [`QUOTA`]), the
//! in-process store's shared bound, and the Postgres retention purge. The suite lives here,
//! not in the gateway crate, so that its assertions never compile into the binary.

use std::time::Duration;

use e2e::PostgresServer;
use gateway_core::responses_store::{
    MemoryLimits, MemoryResponseStore, PostgresResponseStore, Quota, ResponseStore,
    ResponseStoreError, Retention, StoredResponse,
};
use serde_json::json;
use store::db::Database;
use time::OffsetDateTime;

/// Small enough that the quota rules run in a few puts.
const QUOTA: Quota = Quota {
    account_max_bytes: 64 * 1024,
};

async fn store(pg: &PostgresServer, retention: Retention) -> PostgresResponseStore {
    let db = Database::connect(&pg.url(), 8, Duration::from_secs(5)).expect("a pool");
    db.migrate().await.expect("migrations");
    PostgresResponseStore::new(db, retention, QUOTA)
}

#[tokio::test]
async fn the_in_process_store_passes_the_store_contract() {
    let retention = Retention::hours(1);
    let store = MemoryResponseStore::new(MemoryLimits {
        retention,
        quota: QUOTA,
        ..MemoryLimits::default()
    });
    contract::run_all(&store, retention).await;
}

#[tokio::test]
async fn the_in_process_store_full_of_other_accounts_refuses_rather_than_evicting_theirs() {
    let store = MemoryResponseStore::new(MemoryLimits {
        max_bytes: 3 * QUOTA.account_max_bytes / 2,
        quota: QUOTA,
        ..MemoryLimits::default()
    });
    let now = OffsetDateTime::now_utc();
    let first = contract::sized("resp_a", "acct_a", now, QUOTA.account_max_bytes * 9 / 10);
    store.put(first).await.expect("put");
    let second = contract::sized("resp_b", "acct_b", now, QUOTA.account_max_bytes * 9 / 10);
    assert!(
        matches!(store.put(second).await, Err(ResponseStoreError::Full)),
        "the shared bound is reached and acct_b has nothing of its own to evict"
    );
    assert!(store.get("acct_a", "resp_a").await.expect("get").is_some());
}

#[tokio::test]
async fn the_postgres_store_passes_the_store_contract() {
    let pg = PostgresServer::start().await;
    let retention = Retention::hours(1);
    contract::run_all(&store(&pg, retention).await, retention).await;
}

#[tokio::test]
async fn the_purge_deletes_the_responses_past_retention_and_no_other() {
    let pg = PostgresServer::start().await;
    let retention = Retention::hours(1);
    let store = store(&pg, retention).await;
    let now = OffsetDateTime::now_utc();
    let ages = [(0, "fresh"), (50, "fresh"), (61, "old"), (60 * 24, "old")];
    for (i, (minutes, _)) in ages.iter().enumerate() {
        store
            .put(StoredResponse {
                id: format!("resp_{i}"),
                account_id: "acct_purge".to_owned(),
                created_at: now - time::Duration::minutes(*minutes),
                response: json!({"id": format!("resp_{i}")}),
                input_items: Vec::new(),
            })
            .await
            .expect("put");
    }
    assert_eq!(store.purge_expired().await.expect("purge"), 2);
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM stored_responses").await,
        2
    );
    for (i, (_, age)) in ages.iter().enumerate() {
        let kept = store
            .get("acct_purge", &format!("resp_{i}"))
            .await
            .expect("get")
            .is_some();
        assert_eq!(kept, *age == "fresh", "resp_{i}");
    }
    assert_eq!(store.purge_expired().await.expect("second purge"), 0);
}

mod contract {
    use serde_json::json;
    use time::OffsetDateTime;

    use gateway_core::responses_store::{
        size_of, ResponseStore, ResponseStoreError, Retention, StoredResponse,
    };

    /// Ids unique to one run, so the suite can run against a database that other runs share.
    fn unique(prefix: &str) -> String {
        format!("{prefix}_{}", gateway_core::ids::request())
    }

    fn stored(id: &str, account_id: &str, created_at: OffsetDateTime) -> StoredResponse {
        StoredResponse {
            id: id.to_owned(),
            account_id: account_id.to_owned(),
            created_at,
            response: json!({"id": id, "object": "response", "status": "completed",
                "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello, ünïcode ✓", "annotations": []}]}],
                "usage": {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
                "metadata": {}, "temperature": 1.0}),
            input_items: vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}),
                json!({"type": "function_call_output", "call_id": "call_1", "output": "42"}),
            ],
        }
    }

    /// Every rule, in turn. `retention` is the store's.
    pub async fn run_all(store: &dyn ResponseStore, retention: Retention) {
        a_stored_response_reads_back_whole(store).await;
        another_accounts_response_reads_as_absent_and_cannot_be_deleted(store).await;
        a_deleted_response_is_gone_and_a_second_delete_finds_nothing(store).await;
        storing_an_id_again_replaces_the_response(store).await;
        a_response_past_retention_reads_as_absent(store, retention).await;
        an_unknown_id_reads_as_absent(store).await;
        past_its_quota_an_account_loses_its_own_oldest_and_never_another_accounts(store).await;
        a_response_larger_than_the_quota_is_refused_and_evicts_nothing(store).await;
        concurrent_puts_never_leave_an_account_past_its_quota(store).await;
    }

    /// A response whose [`size_of`] is `bytes` (a hosted-tool item padded to fit).
    pub fn sized(id: &str, account_id: &str, at: OffsetDateTime, bytes: usize) -> StoredResponse {
        let padded = |query: usize| {
            let mut response = stored(id, account_id, at);
            response
                .input_items
                .push(json!({"type": "web_search_call", "id": "ws_1",
                "action": {"query": "q".repeat(query)}}));
            response
        };
        let unpadded = size_of(&padded(0));
        padded(bytes.saturating_sub(unpadded))
    }

    /// The bytes of an account's responses among `ids` that are still stored.
    async fn held(store: &dyn ResponseStore, account: &str, ids: &[String]) -> usize {
        let mut bytes = 0;
        for id in ids {
            if let Some(got) = store.get(account, id).await.expect("get") {
                bytes += size_of(&got);
            }
        }
        bytes
    }

    pub async fn past_its_quota_an_account_loses_its_own_oldest_and_never_another_accounts(
        store: &dyn ResponseStore,
    ) {
        let quota = store.quota().account_max_bytes;
        let (victim, flooder) = (unique("acct"), unique("acct"));
        let start = OffsetDateTime::now_utc();
        let kept = unique("resp");
        store
            .put(sized(&kept, &victim, start, quota / 2))
            .await
            .expect("put");
        // Ten responses of a quarter quota each: the flooder holds at most its last four.
        let mut ids = Vec::new();
        for i in 0..10 {
            let id = unique("resp");
            let at = start + time::Duration::milliseconds(i + 1);
            store
                .put(sized(&id, &flooder, at, quota / 4))
                .await
                .expect("put");
            ids.push(id);
        }
        for (i, id) in ids.iter().enumerate() {
            let present = store.get(&flooder, id).await.expect("get").is_some();
            assert_eq!(present, i >= 6, "the flooder's response {i} of 10");
        }
        assert!(held(store, &flooder, &ids).await <= quota);
        assert!(
            store.get(&victim, &kept).await.expect("get").is_some(),
            "another account's flood evicted the victim's response"
        );
    }

    pub async fn a_response_larger_than_the_quota_is_refused_and_evicts_nothing(
        store: &dyn ResponseStore,
    ) {
        let quota = store.quota().account_max_bytes;
        let (id, account) = (unique("resp"), unique("acct"));
        let now = OffsetDateTime::now_utc();
        store.put(stored(&id, &account, now)).await.expect("put");
        let huge = sized(&unique("resp"), &account, now, quota + 1024);
        assert!(
            matches!(
                store.put(huge).await,
                Err(ResponseStoreError::TooLarge { .. })
            ),
            "a response past the whole quota"
        );
        assert!(store.get(&account, &id).await.expect("get").is_some());
    }

    pub async fn concurrent_puts_never_leave_an_account_past_its_quota(store: &dyn ResponseStore) {
        let quota = store.quota().account_max_bytes;
        let account = unique("acct");
        let now = OffsetDateTime::now_utc();
        let ids: Vec<String> = (0..16).map(|_| unique("resp")).collect();
        let puts = ids
            .iter()
            .map(|id| store.put(sized(id, &account, now, quota / 3)));
        for put in futures::future::join_all(puts).await {
            put.expect("put");
        }
        let bytes = held(store, &account, &ids).await;
        assert!(
            bytes <= quota,
            "{bytes} bytes held, past the quota of {quota}"
        );
        assert!(bytes > 0, "every response was evicted");
    }

    pub async fn a_stored_response_reads_back_whole(store: &dyn ResponseStore) {
        let (id, account) = (unique("resp"), unique("acct"));
        let put = stored(&id, &account, OffsetDateTime::now_utc());
        store.put(put.clone()).await.expect("put");
        let got = store
            .get(&account, &id)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(got.id, put.id);
        assert_eq!(got.account_id, put.account_id);
        assert_eq!(got.response, put.response);
        assert_eq!(got.input_items, put.input_items);
        let drift = (got.created_at - put.created_at).abs();
        assert!(
            drift < time::Duration::milliseconds(1),
            "created_at {drift}"
        );
    }

    pub async fn another_accounts_response_reads_as_absent_and_cannot_be_deleted(
        store: &dyn ResponseStore,
    ) {
        let (id, owner, other) = (unique("resp"), unique("acct"), unique("acct"));
        store
            .put(stored(&id, &owner, OffsetDateTime::now_utc()))
            .await
            .expect("put");
        assert_eq!(store.get(&other, &id).await.expect("get"), None);
        assert!(!store.delete(&other, &id).await.expect("delete"));
        assert!(store.get(&owner, &id).await.expect("get").is_some());
    }

    pub async fn a_deleted_response_is_gone_and_a_second_delete_finds_nothing(
        store: &dyn ResponseStore,
    ) {
        let (id, account) = (unique("resp"), unique("acct"));
        store
            .put(stored(&id, &account, OffsetDateTime::now_utc()))
            .await
            .expect("put");
        assert!(store.delete(&account, &id).await.expect("delete"));
        assert_eq!(store.get(&account, &id).await.expect("get"), None);
        assert!(!store.delete(&account, &id).await.expect("second delete"));
    }

    pub async fn storing_an_id_again_replaces_the_response(store: &dyn ResponseStore) {
        let (id, account) = (unique("resp"), unique("acct"));
        let first = stored(&id, &account, OffsetDateTime::now_utc());
        store.put(first.clone()).await.expect("put");
        let mut second = first;
        second.response["status"] = json!("incomplete");
        second.input_items.truncate(1);
        store.put(second.clone()).await.expect("put again");
        let got = store
            .get(&account, &id)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(got.response, second.response);
        assert_eq!(got.input_items, second.input_items);
    }

    pub async fn a_response_past_retention_reads_as_absent(
        store: &dyn ResponseStore,
        retention: Retention,
    ) {
        let (old, fresh, account) = (unique("resp"), unique("resp"), unique("acct"));
        let now = OffsetDateTime::now_utc();
        let expired = retention.cutoff(now) - time::Duration::minutes(1);
        store
            .put(stored(&old, &account, expired))
            .await
            .expect("put");
        store.put(stored(&fresh, &account, now)).await.expect("put");
        assert_eq!(store.get(&account, &old).await.expect("get"), None);
        assert!(store.get(&account, &fresh).await.expect("get").is_some());
    }

    pub async fn an_unknown_id_reads_as_absent(store: &dyn ResponseStore) {
        let account = unique("acct");
        assert_eq!(store.get(&account, "resp_never").await.expect("get"), None);
        assert!(!store.delete(&account, "resp_never").await.expect("delete"));
    }
}
