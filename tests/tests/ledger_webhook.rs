//! The payment provider's webhook (`POST /webhooks/payments`), against Postgres: a delivery
//! signed with the shared secret (HMAC-SHA256 over "timestamp.body", header `t=...,v1=...`)
//! confirms a top-up once; a replay, a bad signature, an old timestamp, an amount outside
//! $10..$10,000 or an unknown account is refused with a clear error and moves no money.

use e2e::{Cluster, Gateway, KeySpec, PostgresServer, Resp};
use gateway_core::payments::signature::{sign, TOLERANCE_SECS};
use serde_json::{json, Value};

const SECRET: &str = "whsec_e2e_0123456789";

async fn cluster(pg: &PostgresServer) -> Cluster {
    Cluster::start(1, |b| {
        b.database(&pg.url())
            .arg("--payment-webhook-secret")
            .arg(SECRET)
    })
    .await
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn event(account_id: &str, reference: &str, usd_cents: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "type": "top_up.succeeded",
        "reference": reference,
        "account_id": account_id,
        "usd_cents": usd_cents,
    }))
    .expect("json")
}

async fn deliver(gw: &Gateway, body: &[u8], signature: &str) -> Resp {
    let rb = gw
        .client()
        .post(gw.url("/webhooks/payments"))
        .header("content-type", "application/json")
        .header("payment-signature", signature)
        .body(body.to_vec());
    gw.send(rb).await
}

async fn money(gw: &Gateway, account_id: &str) -> (Value, Value) {
    let account = gw.admin_account(account_id).await;
    (
        account["balance"].clone(),
        account["lifetime_top_up_cents"].clone(),
    )
}

#[tokio::test]
async fn a_signed_delivery_confirms_a_top_up_once_and_its_replay_is_refused() {
    let pg = PostgresServer::start().await;
    let cluster = cluster(&pg).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(0, &KeySpec::tier("free")).await;
    let body = event(&key.account_id, "pay_e2e_1", 2_500);
    let signature = sign(SECRET, now(), &body);

    let confirmed = deliver(gw, &body, &signature).await.expect_ok();
    assert_eq!(confirmed["credits"], 2_500_000, "{confirmed}");
    assert_eq!(
        money(gw, &key.account_id).await,
        (json!(2_500_000), json!(2_500))
    );

    let replay = deliver(gw, &body, &signature).await;
    let message = replay.expect_error(409, "invalid_request_error");
    assert!(message.contains("already confirmed"), "{message}");
    let fresh = deliver(gw, &body, &sign(SECRET, now(), &body)).await;
    fresh.expect_error(409, "invalid_request_error");
    assert_eq!(
        money(gw, &key.account_id).await,
        (json!(2_500_000), json!(2_500))
    );
    let stored = pg
        .query("SELECT status, usd_cents, credits FROM top_ups WHERE reference = 'pay_e2e_1'")
        .await;
    assert_eq!(stored, "confirmed|2500|2500000");
}

#[tokio::test]
async fn bad_signatures_old_timestamps_out_of_range_amounts_and_unknown_accounts_are_refused() {
    let pg = PostgresServer::start().await;
    let cluster = cluster(&pg).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(0, &KeySpec::tier("free")).await;
    let account = key.account_id.as_str();
    let body = event(account, "pay_e2e_2", 2_500);

    let wrong_secret = deliver(gw, &body, &sign("not-the-secret", now(), &body)).await;
    let message = wrong_secret.expect_error(401, "authentication_error");
    assert!(message.contains("signature"), "{message}");

    let tampered = event(account, "pay_e2e_2", 1_000_000);
    deliver(gw, &tampered, &sign(SECRET, now(), &body))
        .await
        .expect_error(401, "authentication_error");

    let old = deliver(gw, &body, &sign(SECRET, now() - TOLERANCE_SECS - 60, &body)).await;
    let message = old.expect_error(401, "authentication_error");
    assert!(message.contains("seconds"), "{message}");

    deliver(gw, &body, "")
        .await
        .expect_error(401, "authentication_error");

    for cents in [999, 1_000_001] {
        let body = event(account, &format!("pay_e2e_amount_{cents}"), cents);
        let message = deliver(gw, &body, &sign(SECRET, now(), &body))
            .await
            .expect_error(400, "invalid_request_error");
        assert!(message.contains("usd_cents"), "{message}");
    }

    let stranger = event("acct_nobody", "pay_e2e_3", 2_500);
    deliver(gw, &stranger, &sign(SECRET, now(), &stranger))
        .await
        .expect_error(404, "not_found_error");

    assert_eq!(money(gw, account).await, (json!(0), json!(0)));
    // The seeded accounts' own top-ups (which give their keys their tiers) aside.
    let refused = "SELECT count(*) FROM top_ups WHERE reference LIKE 'pay_e2e_%'";
    assert_eq!(pg.query(refused).await, "0");
}
