//! The books of an account after a burst of turns: what its clients were told they consumed
//! is exactly the balance decrease and the ledger's debits, with nothing left reserved.

use serde_json::Value;

use crate::gateway::Gateway;
use crate::postgres::PostgresServer;
use crate::response::Resp;

/// Tallies answers to one account's turns: (accepted, credits the clients were told). Every
/// other answer is one of `refusals` (status, `error.type`) or a 503 `api_error` (a loaded
/// machine may still run a call past its bound: refused, billed nothing, and the books must
/// balance all the same).
pub fn tally<'a>(
    answers: impl IntoIterator<Item = &'a Resp>,
    refusals: &[(u16, &str)],
) -> (u64, u64) {
    let (mut accepted, mut consumed) = (0, 0);
    for resp in answers {
        if resp.status == 200 {
            accepted += 1;
            consumed += resp.json()["usage"]["credits_consumed"]
                .as_u64()
                .expect("credits_consumed");
            continue;
        }
        let error_type = refusals
            .iter()
            .chain(&[(503, "api_error")])
            .find(|(status, _)| *status == resp.status)
            .map(|(_, error_type)| *error_type)
            .unwrap_or_else(|| panic!("unexpected answer to a turn: {resp}"));
        resp.expect_error(resp.status, error_type);
    }
    (accepted, consumed)
}

/// The account `id` started at `start`; what its clients were told they consumed is the
/// balance decrease and the ledger's debits, one completed row per accepted turn, nothing held.
pub async fn assert_books_balance(
    gw: &Gateway,
    pg: &PostgresServer,
    id: &str,
    start: u64,
    accepted: u64,
    consumed: u64,
) {
    let account = settled(gw, pg, id).await;
    let balance = account["balance"].as_i64().expect("balance");
    let debits = pg
        .query_i64(&format!(
            "SELECT coalesce(sum(billed), 0) FROM messages WHERE account_id = '{id}'"
        ))
        .await;
    let billed_turns = pg
        .query_i64(&format!(
            "SELECT count(*) FROM messages WHERE account_id = '{id}' AND status = 'completed'"
        ))
        .await;
    let stored = pg
        .query(&format!(
            "SELECT balance, reserved FROM accounts WHERE id = '{id}'"
        ))
        .await;
    assert!(balance >= 0, "balance went negative: {account}");
    assert_eq!(
        consumed as i64,
        start as i64 - balance,
        "{id}: clients' credits_consumed vs the balance decrease"
    );
    assert_eq!(
        consumed as i64, debits,
        "{id}: clients' credits_consumed vs the ledger's debits"
    );
    assert_eq!(
        accepted as i64, billed_turns,
        "{id}: accepted turns vs completed ledger rows"
    );
    assert_eq!(
        stored,
        format!("{balance}|0"),
        "{id}: the stored balance holds nothing reserved"
    );
}

/// [`Gateway::wait_settled`], saying on time out what still holds the account's credits: the
/// allotments by process, the turns still reserved, and the processes' leases.
async fn settled(gw: &Gateway, pg: &PostgresServer, id: &str) -> Value {
    let account = match gw.try_wait_settled(id).await {
        Ok(account) => return account,
        Err(account) => account,
    };
    let allotments = pg
        .query(&format!(
            "SELECT id, instance_id, credits FROM allotments WHERE account_id = '{id}'"
        ))
        .await;
    let reserved = pg
        .query(&format!(
            "SELECT id, instance_id, reserved, created_at FROM messages
             WHERE account_id = '{id}' AND status = 'reserved'"
        ))
        .await;
    let leases = pg
        .query("SELECT id, epoch, heartbeat_at, draining_until FROM gateway_instances")
        .await;
    panic!(
        "{id}: credits still reserved after 10 s: {account}\n\
         allotments (id|process|credits):\n{allotments}\n\
         reserved turns (id|process|credits|created):\n{reserved}\n\
         leases (process|epoch|heartbeat|draining until):\n{leases}"
    );
}
