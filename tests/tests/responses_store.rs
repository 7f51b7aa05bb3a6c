//! The Postgres store of stored responses against a real Postgres: the same contract suite the
//! in-process store passes in its unit tests, and the retention purge.

use std::time::Duration;

use e2e::PostgresServer;
use gateway::db::Database;
use gateway::responses_store::{
    contract, PostgresResponseStore, ResponseStore, Retention, StoredResponse,
};
use serde_json::json;
use time::OffsetDateTime;

async fn store(pg: &PostgresServer, retention: Retention) -> PostgresResponseStore {
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(5)).expect("a pool");
    db.migrate().await.expect("migrations");
    PostgresResponseStore::new(db, retention)
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
