//! Credits in Postgres under concurrency: 200 simultaneous turns against a balance that covers
//! 50 never overdraw, and every credit a client was told it consumed is exactly one ledger
//! debit and one credit off the balance, with one gateway process and with two; and turns of
//! many accounts at once (which the gateway writes in shared statements) each bill only their
//! own account. The `through_pgbouncer_` tests run the same with the pods behind PgBouncer in
//! transaction pooling mode (`--database-pooler transaction`). The stores take TLS only
//! (`start_tls`: verified against their CA, Redis with an ACL user and a client certificate),
//! as managed ones do; PgBouncer's Postgres stays plaintext (PgBouncer speaks to it).

use e2e::books::{assert_books_balance, tally};
use e2e::{message, Cluster, Gateway, GatewayBuilder, KeySpec, PgBouncer, PostgresServer};
use futures::future::join_all;

const TURNS: usize = 200;
const FUNDED_TURNS: u64 = 50;
/// The refusal these turns may meet besides a 503: the balance ran out.
const INSUFFICIENT: &[(u16, &str)] = &[(402, "insufficient_quota")];

/// Roomy Redis and database timeouts: the race is about credits, and 200 turns queueing on
/// one account row on a busy test machine may take longer than the default bounds.
async fn cluster(pods: usize, database: impl Fn(GatewayBuilder) -> GatewayBuilder) -> Cluster {
    Cluster::start_tls(pods, |b| {
        database(b)
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
    let tallied = tally(&answers, INSUFFICIENT);
    let accepted = tallied.0;
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
    assert_books_balance(pg, &key.account_id, start, FUNDED_TURNS, tallied).await;
}

#[tokio::test]
async fn two_hundred_concurrent_turns_on_a_balance_for_fifty_never_overdraw_and_balance_the_books()
{
    let pg = PostgresServer::start_tls().await;
    let cluster = cluster(1, |b| b.database(&pg.url())).await;
    two_hundred_turns_against_fifty(&cluster.pods, &pg).await;
}

#[tokio::test]
async fn the_books_balance_across_two_gateway_processes_sharing_the_account() {
    let pg = PostgresServer::start_tls().await;
    let cluster = cluster(2, |b| b.database(&pg.url())).await;
    two_hundred_turns_against_fifty(&cluster.pods, &pg).await;
}

#[tokio::test]
async fn through_pgbouncer_the_books_balance_across_two_gateway_processes_sharing_the_account() {
    let pg = PostgresServer::start().await;
    let bouncer = PgBouncer::start(&pg).await;
    let cluster = cluster(2, |b| b.database_through_pooler(&bouncer.url())).await;
    two_hundred_turns_against_fifty(&cluster.pods, &pg).await;
}

#[tokio::test]
async fn turns_of_many_accounts_at_once_each_bill_only_their_own_account() {
    let pg = PostgresServer::start_tls().await;
    let cluster = cluster(1, |b| b.database(&pg.url())).await;
    each_account_bills_only_its_own(&cluster.pods[0], &pg).await;
}

#[tokio::test]
async fn through_pgbouncer_turns_of_many_accounts_at_once_each_bill_only_their_own_account() {
    let pg = PostgresServer::start().await;
    let bouncer = PgBouncer::start(&pg).await;
    let cluster = cluster(1, |b| b.database_through_pooler(&bouncer.url())).await;
    each_account_bills_only_its_own(&cluster.pods[0], &pg).await;
}

/// 20 accounts funded for none, some or all of their 10 turns each, all at once.
async fn each_account_bills_only_its_own(gw: &Gateway, pg: &PostgresServer) {
    const ACCOUNTS: usize = 20;
    const TURNS_EACH: usize = 10;
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
        let tallied = tally(answers.iter().skip(i).step_by(ACCOUNTS), INSUFFICIENT);
        if *start == 0 {
            assert_eq!(
                tallied.0, 0,
                "an account with no credits had turns accepted"
            );
        }
        // Each reservation it is funded for is one turn served (its bill, below the
        // reservation, may leave room for one more).
        let funded = (i / 2).min(TURNS_EACH) as u64;
        assert_books_balance(pg, &key.account_id, *start, funded, tallied).await;
    }
}
