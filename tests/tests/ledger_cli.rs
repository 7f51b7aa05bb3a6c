//! The operator CLI on the gateway binary, against the same Postgres as a running gateway:
//! `keys create` prints a working key once, `keys revoke` stops it, `accounts topup` is
//! idempotent by reference, `messages show` prints the ledger row, `migrate` can run again.

use std::time::Duration;

use e2e::{message, poll_until, Cluster, PostgresServer};

#[tokio::test]
async fn keys_created_by_the_cli_work_until_the_cli_revokes_them() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    pg.gateway_cli(&["migrate"]).await.expect("migrate again");
    let created = pg
        .gateway_cli(&[
            "keys",
            "create",
            "--account",
            "cli-acme",
            "--credits",
            "2000000",
            "--scopes",
            "messages,account",
        ])
        .await
        .expect("keys create");
    let secret = created["key"].as_str().expect("the secret, shown once");
    let key_id = created["id"].as_str().expect("key id");
    assert_eq!(
        created["scopes"],
        serde_json::json!(["messages", "account"])
    );
    let stored = pg
        .query(&format!(
            "SELECT encode(hash, 'hex') FROM api_keys WHERE id = '{key_id}'"
        ))
        .await;
    assert_eq!(stored.len(), 64, "a SHA-256 hash is stored");
    assert!(!pg
        .query("SELECT string_agg(prefix || name, ',') FROM api_keys")
        .await
        .contains(secret));

    let answer = gw
        .post_messages(secret, &message("svc/haiku", "hello", 32))
        .await
        .expect_ok();
    let account = gw.get("/v1/account", secret).await.expect_ok();
    assert_eq!(account["name"], "cli-acme", "{account}");
    assert_eq!(account["tier"], "free", "no top-up yet: {account}");

    let row = pg
        .gateway_cli(&["messages", "show", answer["id"].as_str().expect("id")])
        .await
        .expect("messages show");
    assert_eq!(row["status"], "completed", "{row}");
    assert_eq!(row["billed"], answer["usage"]["credits_consumed"], "{row}");
    assert_eq!(row["key_id"], key_id, "{row}");

    pg.gateway_cli(&["keys", "revoke", key_id])
        .await
        .expect("keys revoke");
    poll_until(
        "the revocation to reach the gateway",
        Duration::from_secs(15),
        Duration::from_millis(250),
        || async { (gw.get("/v1/account", secret).await.status == 401).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_cli_top_up_is_idempotent_by_reference_and_counts_toward_lifetime() {
    let pg = PostgresServer::start().await;
    pg.gateway_cli(&["migrate"]).await.expect("migrate");
    pg.gateway_cli(&["keys", "create", "--account", "cli-topup"])
        .await
        .expect("keys create");
    let topup = |usd: &'static str, reference: &'static str| {
        let pg = &pg;
        async move {
            pg.gateway_cli(&[
                "accounts",
                "topup",
                "cli-topup",
                "--usd",
                usd,
                "--reference",
                reference,
            ])
            .await
        }
    };

    let first = topup("25.50", "ref-cli-1").await.expect("top-up");
    assert_eq!(first["credits"], 2_550_000, "{first}");
    assert_eq!(first["replayed"], false, "{first}");
    let again = topup("25.50", "ref-cli-1").await.expect("replayed top-up");
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["balance"], 2_550_000, "{again}");

    let refused = topup("5", "ref-cli-2")
        .await
        .expect_err("$5 is below the minimum");
    assert!(refused.contains("usd_cents"), "{refused}");
    let conflict = topup("30", "ref-cli-1")
        .await
        .expect_err("same reference, other amount");
    assert!(conflict.contains("reference"), "{conflict}");

    let money = pg
        .query("SELECT balance, lifetime_top_up_cents FROM accounts WHERE name = 'cli-topup'")
        .await;
    assert_eq!(money, "2550000|2550");
}

#[tokio::test]
async fn the_cli_sets_no_tier_by_hand_a_new_key_starts_at_its_accounts_top_up_tier_or_enterprise() {
    let pg = PostgresServer::start().await;
    pg.gateway_cli(&["migrate"]).await.expect("migrate");
    let create = |extra: &'static [&'static str]| {
        let pg = &pg;
        async move {
            let mut args = vec!["keys", "create", "--account", "cli-tiers"];
            args.extend_from_slice(extra);
            pg.gateway_cli(&args).await
        }
    };
    for tier in ["free", "pay_as_you_go", "high_volume", "enterprise"] {
        let refused = pg
            .gateway_cli(&["keys", "create", "--account", "cli-tiers", "--tier", tier])
            .await
            .expect_err("--tier is gone");
        assert!(refused.contains("--tier"), "{refused}");
    }
    let first = create(&[]).await.expect("keys create");
    assert_eq!(first["tier"], "free", "{first}");
    pg.gateway_cli(&[
        "accounts",
        "topup",
        "cli-tiers",
        "--usd",
        "10",
        "--reference",
        "ref-cli-tiers",
    ])
    .await
    .expect("top-up");
    let second = create(&[]).await.expect("keys create after a top-up");
    assert_eq!(second["tier"], "pay_as_you_go", "{second}");
    let granted = create(&["--enterprise"])
        .await
        .expect("an enterprise grant");
    assert_eq!(granted["tier"], "enterprise", "{granted}");
}

#[tokio::test]
async fn the_cli_mints_a_key_with_an_expiry_and_refuses_one_already_past() {
    let pg = PostgresServer::start().await;
    pg.gateway_cli(&["migrate"]).await.expect("migrate");
    let created = pg
        .gateway_cli(&[
            "keys",
            "create",
            "--account",
            "cli-expiry",
            "--expires-at",
            "2099-01-31T00:00:00Z",
        ])
        .await
        .expect("keys create --expires-at");
    assert_eq!(created["expires_at"], "2099-01-31T00:00:00Z", "{created}");
    let id = created["id"].as_str().expect("key id");
    let stored = pg
        .query(&format!(
            "SELECT expires_at = '2099-01-31T00:00:00Z' FROM api_keys WHERE id = '{id}'"
        ))
        .await;
    assert_eq!(stored, "t");
    let refused = pg
        .gateway_cli(&[
            "keys",
            "create",
            "--account",
            "cli-expiry",
            "--expires-at",
            "2020-01-01T00:00:00Z",
        ])
        .await
        .expect_err("an expiry in the past");
    assert!(refused.contains("must be in the future"), "{refused}");
}
