//! Key controls on both stores (in process, and Postgres shared by pods): a key minted with an
//! expiry is refused with 401 once it has passed; a key with a monthly spend cap gets 402
//! naming its cap (not the balance) for a turn that would pass it, before any provider call,
//! and under 100 concurrent turns on two pods its turns are billed no credit beyond the cap.

use std::time::Duration;

use e2e::{message, poll_until, Cluster, Gateway, KeySpec, PostgresServer};
use futures::future::join_all;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Credits of the accounts here: far more than any cap, so only a cap can refuse a turn.
const RICH: u64 = 1_000_000_000;

fn rfc3339_in(seconds: i64) -> String {
    (OffsetDateTime::now_utc() + time::Duration::seconds(seconds))
        .format(&Rfc3339)
        .expect("an RFC 3339 time")
}

/// What one turn of `body` reserves, measured on an account of its own.
async fn one_reservation(gw: &Gateway, body: &Value) -> u64 {
    let probe = gw.new_key(RICH, &KeySpec::tier("enterprise")).await;
    let answer = gw.post_messages(&probe.secret, body).await.expect_ok();
    let record = gw
        .message_record(answer["id"].as_str().expect("message id"))
        .await;
    record["reserved"].as_u64().expect("reserved")
}

async fn an_expired_key_gets_401_saying_it_expired(gw: &Gateway) {
    let key = gw
        .new_key(RICH, &KeySpec::tier("enterprise").expiring(&rfc3339_in(3)))
        .await;
    gw.post_messages(&key.secret, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    let refused = poll_until(
        "the key to expire",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let resp = gw.get("/v1/models", &key.secret).await;
            (resp.status == 401).then_some(resp)
        },
    )
    .await;
    let text = refused.expect_error(401, "authentication_error");
    assert!(text.contains("expired"), "{text}");
    gw.post_messages(&key.secret, &message("svc/haiku", "hi", 16))
        .await
        .expect_error(401, "authentication_error");
}

async fn a_key_cannot_be_minted_already_expired_nor_with_a_malformed_expiry(gw: &Gateway) {
    let account = gw.create_account(0).await;
    let id = account["id"].as_str().expect("account id");
    for expires_at in [
        json!("2020-01-01T00:00:00Z"),
        json!("next tuesday"),
        json!(5),
    ] {
        let body = json!({ "account_id": id, "expires_at": expires_at });
        let resp = gw.admin_post("/admin/keys", &body).await;
        resp.expect_error(400, "invalid_request_error");
    }
    let body = json!({ "account_id": id, "spend_cap_credits": -1 });
    gw.admin_post("/admin/keys", &body)
        .await
        .expect_error(400, "invalid_request_error");
}

async fn a_turn_past_the_keys_monthly_cap_gets_402_naming_the_cap(gw: &Gateway) {
    let body = message("svc/haiku", "count to three", 64);
    let reservation = one_reservation(gw, &body).await;
    let cap = 3 * reservation + reservation / 2;
    let key = gw
        .new_key(RICH, &KeySpec::tier("enterprise").capped(cap))
        .await;
    let (mut accepted, mut consumed) = (0u64, 0u64);
    let refusal = loop {
        let resp = gw.post_messages(&key.secret, &body).await;
        if resp.status != 200 {
            break resp;
        }
        accepted += 1;
        consumed += resp.json()["usage"]["credits_consumed"]
            .as_u64()
            .expect("credits_consumed");
        assert!(accepted <= 100, "the cap never refused a turn");
    };
    let text = refusal.expect_error(402, "insufficient_quota");
    assert!(
        text.contains("spend cap") && text.contains(&cap.to_string()),
        "the 402 names the key's cap: {text}"
    );
    assert!(!text.contains("balance"), "not the balance: {text}");
    assert!(
        accepted >= 3,
        "only {accepted} turns fitted a cap of 3.5 turns"
    );
    assert!(consumed <= cap, "billed {consumed} against a cap of {cap}");
    // Refused before any provider call: the refused turn is no request of the usage report.
    let usage = gw.get("/v1/usage", &key.secret).await.expect_ok();
    assert_eq!(usage["totals"]["requests"], accepted, "{usage}");
    assert_eq!(usage["totals"]["credits"], consumed, "{usage}");
    // The account could pay; an uncapped key of it still can.
    let other = gw
        .mint_key(&key.account_id, &KeySpec::tier("enterprise"))
        .await;
    gw.post_messages(&other.secret, &body).await.expect_ok();
}

#[tokio::test]
async fn in_process_an_expired_key_gets_401_saying_it_expired() {
    let gw = Gateway::start().await;
    an_expired_key_gets_401_saying_it_expired(&gw).await;
    a_key_cannot_be_minted_already_expired_nor_with_a_malformed_expiry(&gw).await;
}

#[tokio::test]
async fn in_postgres_an_expired_key_gets_401_saying_it_expired() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    an_expired_key_gets_401_saying_it_expired(&cluster.pods[0]).await;
    a_key_cannot_be_minted_already_expired_nor_with_a_malformed_expiry(&cluster.pods[0]).await;
}

#[tokio::test]
async fn in_process_a_turn_past_the_keys_monthly_cap_gets_402_naming_the_cap() {
    let gw = Gateway::start().await;
    a_turn_past_the_keys_monthly_cap_gets_402_naming_the_cap(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_turn_past_the_keys_monthly_cap_gets_402_naming_the_cap() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_turn_past_the_keys_monthly_cap_gets_402_naming_the_cap(&cluster.pods[0]).await;
    let spent = pg
        .query("SELECT string_agg(month_spent || '/' || month_reserved, ',') FROM api_keys WHERE spend_cap IS NOT NULL")
        .await;
    assert!(spent.ends_with("/0"), "nothing held once settled: {spent}");
}

#[tokio::test]
async fn a_keys_cap_holds_under_100_concurrent_turns_on_two_pods_to_the_credit() {
    const TURNS: usize = 100;
    const CAPPED_TURNS: u64 = 30;
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(2, |b| {
        b.database(&pg.url())
            .redis_timeout_ms(5_000)
            .arg("--database-timeout-ms")
            .arg("15000")
    })
    .await;
    let gw = &cluster.pods[0];
    let body = message("svc/haiku", "count to three", 64);
    let cap = CAPPED_TURNS * one_reservation(gw, &body).await;
    let key = gw
        .new_key(RICH, &KeySpec::tier("enterprise").capped(cap))
        .await;
    let answers =
        join_all((0..TURNS).map(|i| cluster.pod(i).post_messages(&key.secret, &body))).await;
    let (mut accepted, mut consumed) = (0u64, 0u64);
    for resp in &answers {
        match resp.status {
            200 => {
                accepted += 1;
                consumed += resp.json()["usage"]["credits_consumed"]
                    .as_u64()
                    .expect("credits_consumed");
            }
            _ => {
                let text = resp.expect_error(402, "insufficient_quota");
                assert!(text.contains("spend cap"), "{text}");
            }
        }
    }
    assert!(
        accepted >= CAPPED_TURNS && accepted < TURNS as u64,
        "{accepted} of {TURNS} turns accepted against a cap of {CAPPED_TURNS} turns' most\n{}",
        cluster.logs()
    );
    gw.wait_settled(&key.account_id).await;
    let billed = pg
        .query_i64(&format!(
            "SELECT coalesce(sum(billed), 0) FROM messages WHERE key_id = '{}'",
            key.id
        ))
        .await;
    assert!(
        billed as u64 <= cap,
        "billed {billed} against a cap of {cap}"
    );
    assert_eq!(billed as u64, consumed, "told == billed");
    let counters = pg
        .query(&format!(
            "SELECT month_spent || '/' || month_reserved FROM api_keys WHERE id = '{}'",
            key.id
        ))
        .await;
    assert_eq!(counters, format!("{billed}/0"), "the key's month counters");
}
