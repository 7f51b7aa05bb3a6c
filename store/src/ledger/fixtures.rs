//! The row of a turn as the tests and the ledger benchmark reserve it: a turn of svc/haiku on
//! the simulated upstream. Compiled for the store's own unit tests and, through the `fixtures`
//! feature, for the end-to-end tests and the gateway's benches; never into a binary.

use super::MessageRecord;

/// The row of a new turn `id` of the account's key: nothing held, billed or used yet.
pub fn turn_record(id: &str, account_id: &str, key_id: &str) -> MessageRecord {
    MessageRecord {
        id: id.to_owned(),
        account_id: account_id.to_owned(),
        key_id: key_id.to_owned(),
        model: "svc/haiku".to_owned(),
        served_model: "svc/haiku".to_owned(),
        provider: "simulated".to_owned(),
        upstream: "simulated".to_owned(),
        upstream_model: "simulated-haiku".to_owned(),
        endpoint: "messages",
        ..MessageRecord::default()
    }
}
