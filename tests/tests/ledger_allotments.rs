//! Allotments (`--allotment-turns`): a pod holds credits ahead for a busy account, so that its
//! turns reserve in memory and their ledger rows are written just after them. The books balance
//! all the same: what the clients were told they consumed is what the ledger debits, once the
//! rows are written and the allotments returned; a pod that stops writes its turns and returns
//! its allotments before it exits. (A dead pod's allotments: ledger_reaper.rs.)

use std::time::Duration;

use e2e::{message, Cluster, Gateway, KeySpec, PostgresServer};
use futures::future::join_all;

const CREDITS: u64 = 50_000_000;

fn allotting(b: e2e::GatewayBuilder, pg: &PostgresServer) -> e2e::GatewayBuilder {
    b.database(&pg.url()).arg("--allotment-turns").arg("16")
}

/// How many allotments the account's pods still hold, and their credits.
async fn allotted(pg: &PostgresServer, account_id: &str) -> String {
    pg.query(&format!(
        "SELECT count(*), coalesce(sum(credits), 0) FROM allotments WHERE account_id = '{account_id}'"
    ))
    .await
}

/// Turns this pod wrote from allotments (the `write` statements' turn count).
async fn written_from_allotments(gw: &Gateway) -> f64 {
    gw.metrics()
        .await
        .get("gateway_ledger_batch_turns_sum", &[("op", "write")])
        .unwrap_or(0.0)
}

/// (turns answered 200, credits their clients were told they consumed).
fn tally(answers: &[e2e::Resp]) -> (u64, u64) {
    answers.iter().fold((0, 0), |(n, credits), resp| {
        let body = resp.expect_ok();
        let consumed = body["usage"]["credits_consumed"].as_u64().expect("credits");
        (n + 1, credits + consumed)
    })
}

#[tokio::test]
async fn a_busy_accounts_turns_on_two_pods_are_billed_exactly_what_their_clients_were_told() {
    const TURNS: usize = 120;
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(2, |b| allotting(b, &pg)).await;
    let key = cluster.pods[0]
        .new_key(CREDITS, &KeySpec::tier("enterprise"))
        .await;
    let body = message("svc/haiku", "count to three", 64);

    let answers =
        join_all((0..TURNS).map(|i| cluster.pods[i % 2].post_messages(&key.secret, &body))).await;
    let (accepted, consumed) = tally(&answers);
    assert_eq!(accepted, TURNS as u64);
    for pod in &cluster.pods {
        assert!(
            written_from_allotments(pod).await > 0.0,
            "a pod served no turn from an allotment"
        );
    }

    // Unused for two seconds, the allotments go back to the account.
    let account = cluster.pods[1].wait_settled(&key.account_id).await;
    let id = &key.account_id;
    assert_eq!(
        account["balance"].as_u64(),
        Some(CREDITS - consumed),
        "{account}"
    );
    let ledger = pg
        .query(&format!(
            "SELECT count(*), sum(billed) FROM messages WHERE account_id = '{id}' AND status = 'completed'"
        ))
        .await;
    assert_eq!(
        ledger,
        format!("{TURNS}|{consumed}"),
        "completed rows and their bills"
    );
    assert_eq!(allotted(&pg, id).await, "0|0");
}

#[tokio::test]
async fn a_stopping_pod_writes_its_turns_and_returns_its_allotments_before_it_exits() {
    let pg = PostgresServer::start().await;
    let mut cluster = Cluster::start(1, |b| allotting(b, &pg)).await;
    let gw = &mut cluster.pods[0];
    let key = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let body = message("svc/haiku", "count to three", 64);
    let answers = join_all((0..20).map(|_| gw.post_messages(&key.secret, &body))).await;
    let (_, consumed) = tally(&answers);

    gw.send_sigterm();
    assert!(gw.wait_exit(Duration::from_secs(20)).await.success());

    let id = &key.account_id;
    assert_eq!(
        allotted(&pg, id).await,
        "0|0",
        "an allotment outlived its pod"
    );
    assert_eq!(
        pg.query(&format!(
            "SELECT balance, reserved FROM accounts WHERE id = '{id}'"
        ))
        .await,
        format!("{}|0", CREDITS - consumed)
    );
    assert_eq!(
        pg.query_i64(&format!(
            "SELECT count(*) FROM messages WHERE account_id = '{id}'"
        ))
        .await,
        20,
        "a turn's row was not written"
    );
}

/// Thirty turns at once on two pods of an account with credits for a few: each is served
/// (200) or refused for its credits (402), never answered as an outage (503) when the
/// account's check refuses a refill or a reservation that raced for its last credits.
#[tokio::test]
async fn concurrent_turns_on_a_nearly_empty_account_are_served_or_refused_402_never_503() {
    const TURNS: usize = 30;
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(2, |b| allotting(b, &pg)).await;
    let body = message("svc/haiku", "count to three", 64);
    // What one such turn costs, on another account.
    let probe = cluster.pods[0]
        .new_key(CREDITS, &KeySpec::tier("enterprise"))
        .await;
    let one = cluster.pods[0].post_messages(&probe.secret, &body).await;
    let cost = one.expect_ok()["usage"]["credits_consumed"]
        .as_u64()
        .expect("credits");
    let key = cluster.pods[0]
        .new_key(NEARLY_EMPTY_TURNS * cost, &KeySpec::tier("enterprise"))
        .await;
    let answers =
        join_all((0..TURNS).map(|i| cluster.pods[i % 2].post_messages(&key.secret, &body))).await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    for answer in answers.iter().filter(|a| a.status != 200) {
        answer.expect_error(402, "insufficient_quota");
    }
    let refused = statuses.iter().filter(|s| **s == 402).count();
    assert!(refused > 0, "the account ran out: {statuses:?}");
}

/// Turns' worth of credits the nearly empty account holds (each turn holds more, its most,
/// while it runs).
const NEARLY_EMPTY_TURNS: u64 = 4;
