//! The contract every `ResponseStore` keeps (`mod contract` below), run against both stores,
//! in process and on a real Postgres, and the Postgres retention purge. The suite lives here,
//! not in the gateway crate, so that its assertions never compile into the binary.

use std::time::Duration;

use e2e::PostgresServer;
use gateway::responses_store::{
    MemoryLimits, MemoryResponseStore, PostgresResponseStore, ResponseStore, Retention,
    StoredResponse,
};
use serde_json::json;
use store::db::Database;
use time::OffsetDateTime;

async fn store(pg: &PostgresServer, retention: Retention) -> PostgresResponseStore {
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(5)).expect("a pool");
    db.migrate().await.expect("migrations");
    PostgresResponseStore::new(db, retention)
}

#[tokio::test]
async fn the_in_process_store_passes_the_store_contract() {
    let retention = Retention::hours(1);
    let store = MemoryResponseStore::new(MemoryLimits {
        retention,
        ..MemoryLimits::default()
    });
    contract::run_all(&store, retention).await;
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

    use gateway::responses_store::{ResponseStore, Retention, StoredResponse};

    /// Ids unique to one run, so the suite can run against a database that other runs share.
    fn unique(prefix: &str) -> String {
        format!("{prefix}_{}", gateway::ids::request())
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
