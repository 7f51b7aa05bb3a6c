//! Turns written straight into a Postgres ledger, as a gateway pod writes them, for the tests
//! of what the ledger keeps over days (export, retention): each holds 1,000 credits, then
//! settles.

use store::ledger::fixtures::turn_record;
use store::ledger::{
    Ledger, MessageRecord, MessageStatus, NewReservation, PostgresLedger, Settlement,
};
use time::OffsetDateTime;

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
    ledger
        .reserve(NewReservation {
            record,
            spend_cap: None,
            min: 1_000,
            max: 1_000,
        })
        .await
        .expect("reserve");
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
