//! Credits in Postgres under concurrency: 200 simultaneous turns against a balance that covers
//! 50 never overdraw, and every credit a client was told it consumed is exactly one ledger
//! debit and one credit off the balance, with one gateway process and with two; and turns of
//! many accounts at once (which the gateway writes in shared statements) each bill only their
//! own account.

use e2e::{message, Cluster, Gateway, KeySpec, PostgresServer};
use futures::future::join_all;

const TURNS: usize = 200;
const FUNDED_TURNS: u64 = 50;

/// Roomy Redis and database timeouts: the race is about credits, and 200 turns queueing on
/// one account row on a busy test machine may take longer than the default bounds.
async fn cluster(pods: usize, pg: &PostgresServer) -> Cluster {
    Cluster::start(pods, |b| {
        b.database(&pg.url())
            .redis_timeout_ms(5_000)
            .arg("--database-timeout-ms")
            .arg("15000")
    })
    .await
}

/// What one turn of `body` reserves, measured on an account of its own.
async fn one_reservation(gw: &Gateway, body: &serde_json::Value) -> u64 {
    let probe = gw.new_key(10_000_000, &KeySpec::tier("enterprise")).await;
    let first = gw.post_messages(&probe.secret, body).await.expect_ok();
    let record = gw
        .message_record(first["id"].as_str().expect("message id"))
        .await;
    let reservation = record["reserved"].as_u64().expect("reserved");
    assert!(reservation > 0, "{record}");
    reservation
}

/// Sends 200 turns at once, spread over `pods`, against an account funded for 50 reservations,
/// and checks the books.
async fn two_hundred_turns_against_fifty(pods: &[Gateway], pg: &PostgresServer) {
    let gw = &pods[0];
    let body = message("svc/haiku", "count to three", 64);
    let reservation = one_reservation(gw, &body).await;

    let start = FUNDED_TURNS * reservation;
    let key = gw.new_key(start, &KeySpec::tier("enterprise")).await;
    let answers =
        join_all((0..TURNS).map(|i| pods[i % pods.len()].post_messages(&key.secret, &body))).await;
    let (accepted, consumed) = tally(&answers);
    let refused: Vec<String> = answers
        .iter()
        .filter(|r| r.status != 200)
        .map(|r| format!("{} {}", r.status, r.text))
        .take(3)
        .collect();
    assert!(
        accepted >= FUNDED_TURNS,
        "only {accepted} of {TURNS} turns were accepted, though the balance covered {FUNDED_TURNS}; e.g. {refused:?}\n{}",
        pods[0].logs()
    );
    assert!(
        accepted < TURNS as u64,
        "every turn was accepted: the balance was not enforced"
    );
    assert_books_balance(gw, pg, &key.account_id, start, accepted, consumed).await;
}

/// Tallies answers to one account's turns: (accepted, credits the clients were told).
fn tally<'a>(answers: impl IntoIterator<Item = &'a e2e::Resp>) -> (u64, u64) {
    let (mut accepted, mut consumed) = (0, 0);
    for resp in answers {
        if resp.status == 200 {
            accepted += 1;
            consumed += resp.json()["usage"]["credits_consumed"]
                .as_u64()
                .expect("credits_consumed");
        } else if resp.status == 503 {
            // A loaded machine may still run a call past its bound: refused, billed nothing
            // (the books must balance all the same).
            resp.expect_error(503, "api_error");
        } else {
            resp.expect_error(402, "insufficient_quota");
        }
    }
    (accepted, consumed)
}

/// The account started at `start`; what its clients were told they consumed is the balance
/// decrease and the ledger's debits, one completed row per accepted turn, nothing held.
async fn assert_books_balance(
    gw: &Gateway,
    pg: &PostgresServer,
    id: &str,
    start: u64,
    accepted: u64,
    consumed: u64,
) {
    let account = gw.wait_settled(id).await;
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

#[tokio::test]
async fn two_hundred_concurrent_turns_on_a_balance_for_fifty_never_overdraw_and_balance_the_books()
{
    let pg = PostgresServer::start().await;
    let cluster = cluster(1, &pg).await;
    two_hundred_turns_against_fifty(&cluster.pods, &pg).await;
}

#[tokio::test]
async fn the_books_balance_across_two_gateway_processes_sharing_the_account() {
    let pg = PostgresServer::start().await;
    let cluster = cluster(2, &pg).await;
    two_hundred_turns_against_fifty(&cluster.pods, &pg).await;
}

#[tokio::test]
async fn turns_of_many_accounts_at_once_each_bill_only_their_own_account() {
    const ACCOUNTS: usize = 20;
    const TURNS_EACH: usize = 10;
    let pg = PostgresServer::start().await;
    let cluster = cluster(1, &pg).await;
    let gw = &cluster.pods[0];
    let body = message("svc/haiku", "count to three", 64);
    let reservation = one_reservation(gw, &body).await;

    // Account i is funded for i / 2 reservations: none, a few, or all of its turns.
    let mut keys = Vec::new();
    for i in 0..ACCOUNTS {
        let start = (i as u64 / 2) * reservation;
        keys.push((gw.new_key(start, &KeySpec::tier("enterprise")).await, start));
    }
    let answers = join_all(
        (0..ACCOUNTS * TURNS_EACH).map(|t| gw.post_messages(&keys[t % ACCOUNTS].0.secret, &body)),
    )
    .await;
    for (i, (key, start)) in keys.iter().enumerate() {
        let (accepted, consumed) = tally(answers.iter().skip(i).step_by(ACCOUNTS));
        if *start == 0 {
            assert_eq!(accepted, 0, "an account with no credits had turns accepted");
        }
        assert_books_balance(gw, &pg, &key.account_id, *start, accepted, consumed).await;
    }
}
