//! Turns written straight into a Postgres ledger, as a gateway pod writes them, for the tests
//! of what the ledger keeps over days (export, retention): each holds 1,000 credits, then
//! settles.

use store::accounts::{Accounts, PostgresAccounts};
use store::db::Database;
use store::ledger::fixtures::turn_record;
use store::ledger::{
    Ledger, MessageRecord, MessageStatus, NewReservation, PostgresLedger, Settlement,
};
use time::OffsetDateTime;

use crate::contract::actor;
use crate::gateway::unique_name;

/// A ledger on `db`, its process' heartbeat beaten, and a new account (its name starting with
/// `name`) credited `credits`: (the ledger, the account's id).
pub async fn funded(db: &Database, name: &str, credits: u64) -> (PostgresLedger, String) {
    let account = PostgresAccounts::new(db.clone())
        .create_account(&unique_name(name))
        .await
        .expect("account")
        .id;
    let ledger = PostgresLedger::new(db.clone());
    ledger.heartbeat().await.expect("heartbeat");
    ledger
        .add_credits(&account, credits, &actor())
        .await
        .expect("credits");
    (ledger, account)
}

/// Reserves 1,000 credits for the turn of `record`; what it held.
pub async fn reserve(ledger: &(impl Ledger + ?Sized), record: MessageRecord) -> u64 {
    ledger
        .reserve(NewReservation {
            record,
            spend_cap: None,
            min: 1_000,
            max: 1_000,
        })
        .await
        .expect("reserve")
}

/// Reserves turn `id` of the account's key `key_id`, started `at`.
pub async fn reserve_at(
    ledger: &PostgresLedger,
    account: &str,
    key_id: &str,
    id: &str,
    at: OffsetDateTime,
) {
    let record = MessageRecord {
        created_at: at,
        ..turn_record(id, account, key_id)
    };
    reserve(ledger, record).await;
}

/// Settles turn `id` for `cost`; what it billed.
pub async fn settle(ledger: &PostgresLedger, id: &str, cost: u64) -> u64 {
    ledger
        .settle(Settlement {
            cost,
            latency_ms: 1,
            ..Settlement::nothing(id.to_owned(), MessageStatus::Completed)
        })
        .await
        .expect("settle")
}
