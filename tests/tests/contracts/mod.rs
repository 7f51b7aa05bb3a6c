//! The contracts of the store traits: every trait with an in-process implementation (standalone
//! mode) and a Postgres or Redis one (cluster mode) runs the same rules against both, so the two
//! behave alike by construction. One file per trait; `ResponseStore`'s is `responses_store.rs`
//! and the ledger's refunds and disputes are `ledger_reversals.rs`.

mod accounts;
mod audit;
mod auto_reloads;
mod developers;
mod files;
mod ledger;
mod limiter;
mod message_batches;

use std::time::Duration;

use e2e::PostgresServer;
use store::accounts::{KeyHash, KeyKind, KeyRecord};
use store::db::Database;
use time::OffsetDateTime;

/// A fresh Postgres with the gateway's migrations applied.
async fn database() -> (PostgresServer, Database) {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 8, Duration::from_secs(10)).expect("a pool");
    db.migrate().await.expect("migrations");
    (pg, db)
}

/// A name no other rule of the run uses.
fn unique(prefix: &str) -> String {
    e2e::gateway::unique_name(prefix)
}

/// Now, to the whole second: the stores keep microseconds at most, so times compare equal
/// after a round trip.
fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("a whole second")
}

/// A key of `account_id` in `tier`, created `minutes_ago`.
pub fn key_record(account_id: &str, tier: &str, minutes_ago: i64) -> (KeyRecord, String) {
    let secret = unique("sk-svc-contract");
    let created_at = now() - time::Duration::minutes(minutes_ago);
    let record = KeyRecord {
        id: unique("key"),
        account_id: account_id.to_owned(),
        name: "contract".to_owned(),
        prefix: secret[..12].to_owned(),
        kind: KeyKind::Api,
        scopes: vec!["messages".to_owned(), "chat".to_owned()],
        tier: tier.to_owned(),
        revoked: false,
        hash: KeyHash::of(&secret),
        created_at,
        expires_at: Some(created_at + time::Duration::days(30)),
        spend_cap: Some(5_000),
        created_by: None,
    };
    (record, secret)
}
