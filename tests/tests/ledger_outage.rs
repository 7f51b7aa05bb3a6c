//! A Postgres outage: turns that need a reservation in Postgres get 503 api_error within the
//! database timeout (no 500, no hang); count_tokens, which needs no credits, keeps working for
//! a key seen before; once Postgres is back the gateway recovers by itself. Turns that the
//! pod's allotment for the account covers are served through the outage; as their bills
//! cannot be recorded, their clients are told they cost nothing, and their rows say
//! `unbilled` once Postgres is back. The `through_pgbouncer_` tests stop the Postgres behind a
//! PgBouncer in transaction pooling mode: the pods' connections to the pooler stay up, their
//! statements wait in its queue, and the same database timeout applies.

use std::time::{Duration, Instant};

use e2e::{
    count_body, message, poll_until, Cluster, GatewayBuilder, KeySpec, PgBouncer, PostgresServer,
};
use store::db::{Database, DbError};

/// One pod whose database calls give up after a second.
async fn one_pod(database: impl Fn(GatewayBuilder) -> GatewayBuilder) -> Cluster {
    Cluster::start(1, |b| database(b).arg("--database-timeout-ms").arg("1000")).await
}

#[tokio::test]
async fn turns_get_503_within_the_timeout_while_postgres_is_down_and_recover_after() {
    let mut pg = PostgresServer::start().await;
    let cluster = one_pod(|b| b.database(&pg.url())).await;
    turns_get_503_until_postgres_returns(&cluster, &mut pg).await;
}

#[tokio::test]
async fn through_pgbouncer_turns_get_503_within_the_timeout_while_postgres_is_down_and_recover_after(
) {
    let mut pg = PostgresServer::start().await;
    let bouncer = PgBouncer::start(&pg).await;
    let cluster = one_pod(|b| b.database_through_pooler(&bouncer.url())).await;
    turns_get_503_until_postgres_returns(&cluster, &mut pg).await;
}

async fn turns_get_503_until_postgres_returns(cluster: &Cluster, pg: &mut PostgresServer) {
    let gw = &cluster.pods[0];
    let key = gw.new_key(5_000_000, &KeySpec::tier("enterprise")).await;
    let body = message("svc/haiku", "hello", 32);
    gw.post_messages(&key.secret, &body).await.expect_ok();

    pg.stop().await;
    // Far more than the pod's allotment for the account holds: it needs Postgres.
    let large = message("svc/haiku", "hello", 8_000);
    let started = Instant::now();
    let refused = gw.post_messages(&key.secret, &large).await;
    let took = started.elapsed();
    refused.expect_error(503, "api_error");
    assert_eq!(
        refused.retry_after(),
        5,
        "a database outage is usually short"
    );
    assert!(
        took < Duration::from_secs(10),
        "the refusal took {took:?}: the database timeout was not applied"
    );
    assert!(
        !refused.text.to_lowercase().contains("postgres") && !refused.text.contains("sql"),
        "internal detail leaked: {}",
        refused.text
    );
    gw.count_tokens(&key.secret, &count_body("svc/haiku", "hello"))
        .await
        .expect_ok();

    pg.restart().await;
    poll_until(
        "turns to be served again after Postgres came back",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async { (gw.post_messages(&key.secret, &large).await.status == 200).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn turns_the_allotment_covers_are_served_through_an_outage_told_free_and_written_unbilled() {
    let mut pg = PostgresServer::start().await;
    let cluster = one_pod(|b| b.database(&pg.url())).await;
    allotted_turns_are_served_through_an_outage(&cluster, &mut pg).await;
}

#[tokio::test]
async fn through_pgbouncer_turns_the_allotment_covers_are_served_through_an_outage_told_free_and_written_unbilled(
) {
    let mut pg = PostgresServer::start().await;
    let bouncer = PgBouncer::start(&pg).await;
    let cluster = one_pod(|b| b.database_through_pooler(&bouncer.url())).await;
    allotted_turns_are_served_through_an_outage(&cluster, &mut pg).await;
}

async fn allotted_turns_are_served_through_an_outage(cluster: &Cluster, pg: &mut PostgresServer) {
    let gw = &cluster.pods[0];
    let start = 5_000_000;
    let key = gw.new_key(start, &KeySpec::tier("enterprise")).await;
    let body = message("svc/haiku", "hello", 32);
    let before = gw.post_messages(&key.secret, &body).await.expect_ok();

    pg.stop().await;
    let during = gw.post_messages(&key.secret, &body).await.expect_ok();
    assert_eq!(
        during["usage"]["credits_consumed"].as_u64(),
        Some(0),
        "told a bill the ledger could not record: {during}"
    );
    let consumed = before["usage"]["credits_consumed"]
        .as_u64()
        .expect("credits");

    pg.restart().await;
    let id = &key.account_id;
    poll_until(
        "the turn served during the outage to be written",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async {
            let sql = format!("SELECT count(*) FROM messages WHERE account_id = '{id}'");
            (pg.query_i64(&sql).await == 2).then_some(())
        },
    )
    .await;
    let account = gw.wait_settled(id).await;
    assert_eq!(
        account["balance"].as_u64(),
        Some(start - consumed),
        "{account}"
    );
    let during_id = during["id"].as_str().expect("id");
    assert_eq!(
        pg.query(&format!(
            "SELECT status, billed FROM message_rows WHERE id = '{during_id}'"
        ))
        .await,
        "unbilled|0"
    );
    e2e::books::assert_rollups_match_rows(pg, id).await;
}

/// A request makes several database calls (its key, then its reservation): during an outage it
/// must answer within one timeout, not one per call. Postgres is down once three calls in a
/// row found it unreachable (calls in flight when it goes away fail together).
#[tokio::test]
async fn once_three_calls_in_a_row_find_postgres_unreachable_the_calls_within_a_timeout_fail_at_once(
) {
    let mut pg = PostgresServer::start().await;
    let timeout = Duration::from_secs(1);
    let db = Database::connect(&pg.url(), 2, timeout).expect("database url");
    let select = || db.bounded(sqlx::query("SELECT 1").execute(db.pool()));
    select().await.expect("Postgres up");

    pg.stop().await;
    for call in 1..=3 {
        let tried = select().await;
        assert!(
            matches!(&tried, Err(e) if !matches!(e, DbError::Failing(_))),
            "call {call} after the outage began did not try: {tried:?}"
        );
    }
    let next = select().await;
    assert!(
        matches!(next, Err(DbError::Failing(_))),
        "the call after three unreachable ones waited out a timeout of its own: {next:?}"
    );

    pg.restart().await;
    poll_until(
        "calls to reach Postgres again",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { select().await.ok() },
    )
    .await;
}

/// One call timing out (a slow statement on a busy node, a pause of this process) fails only
/// itself: the calls after it still reach Postgres.
#[tokio::test]
async fn a_single_call_timing_out_fails_only_itself() {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 2, Duration::from_secs(1)).expect("database url");
    let slow = db
        .bounded_by(
            Duration::from_millis(100),
            sqlx::query("SELECT pg_sleep(0.5)").execute(db.pool()),
        )
        .await;
    assert!(
        matches!(slow, Err(DbError::Timeout(_))),
        "the slow call did not time out: {slow:?}"
    );
    for call in 1..=5 {
        let next = db.bounded(sqlx::query("SELECT 1").execute(db.pool())).await;
        assert!(
            next.is_ok(),
            "call {call} after one timed-out call did not reach Postgres: {next:?}"
        );
    }
}
