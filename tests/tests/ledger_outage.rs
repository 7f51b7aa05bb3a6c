//! A Postgres outage: turns, which need a reservation, get 503 api_error within the database
//! timeout (no 500, no hang); count_tokens, which needs no credits, keeps working for a key
//! seen before; once Postgres is back the gateway recovers by itself.

use std::time::{Duration, Instant};

use e2e::{count_body, message, poll_until, Cluster, KeySpec, PostgresServer};

#[tokio::test]
async fn turns_get_503_within_the_timeout_while_postgres_is_down_and_recover_after() {
    let mut pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url())
            .arg("--database-timeout-ms")
            .arg("1000")
    })
    .await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(5_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let body = message("svc/haiku", "hello", 32);
    gw.post_messages(&key.secret, &body).await.expect_ok();

    pg.stop().await;
    let started = Instant::now();
    let refused = gw.post_messages(&key.secret, &body).await;
    let took = started.elapsed();
    refused.expect_error(503, "api_error");
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
        || async { (gw.post_messages(&key.secret, &body).await.status == 200).then_some(()) },
    )
    .await;
}
