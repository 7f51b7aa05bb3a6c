//! The operator CLI on the gateway binary, against the same Postgres as a running gateway:
//! `keys create` prints a working key once, `keys revoke` stops it, `accounts topup` is
//! idempotent by reference, `messages show` prints the ledger row, `migrate` can run again.
//! An existing account is keyed or credited only by its id, and a dashboard account only once
//! its owner verified the email: a name is anyone's to sign up with.

use std::time::Duration;

use e2e::gateway::unique_name;
use e2e::visitor::Visitor;
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
            "--new-account",
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
    let created = pg
        .gateway_cli(&["keys", "create", "--new-account", "cli-topup"])
        .await
        .expect("keys create");
    let account_id = created["account_id"].as_str().expect("the account");
    let topup = |usd: &'static str, reference: &'static str| {
        let pg = &pg;
        async move {
            pg.gateway_cli(&[
                "accounts",
                "topup",
                "--account",
                account_id,
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
    for tier in ["free", "pay_as_you_go", "high_volume", "enterprise"] {
        let refused = pg
            .gateway_cli(&[
                "keys",
                "create",
                "--new-account",
                "cli-tiers",
                "--tier",
                tier,
            ])
            .await
            .expect_err("--tier is gone");
        assert!(refused.contains("--tier"), "{refused}");
    }
    let first = pg
        .gateway_cli(&["keys", "create", "--new-account", "cli-tiers"])
        .await
        .expect("keys create");
    assert_eq!(first["tier"], "free", "{first}");
    let account_id = first["account_id"].as_str().expect("the account");
    let create = |extra: &'static [&'static str]| {
        let pg = &pg;
        async move {
            let mut args = vec!["keys", "create", "--account", account_id];
            args.extend_from_slice(extra);
            pg.gateway_cli(&args).await
        }
    };
    pg.gateway_cli(&[
        "accounts",
        "topup",
        "--account",
        account_id,
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
            "--new-account",
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
            "--new-account",
            "cli-expiry-past",
            "--expires-at",
            "2020-01-01T00:00:00Z",
        ])
        .await
        .expect_err("an expiry in the past");
    assert!(refused.contains("must be in the future"), "{refused}");
}

#[tokio::test]
async fn the_cli_keys_and_credits_an_existing_account_only_by_its_id_once_its_email_is_verified() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    // A squatter signs up with a customer's email before the customer does.
    let email = format!("ceo@{}.example", unique_name("bigcustomer"));
    let (status, page, _) = Visitor::new(gw).try_sign_up(&email, &[]).await;
    assert_eq!(status, 200, "{page}");

    // The operator, told to key the customer's account by its name, is refused, however asked.
    let by_name = pg
        .gateway_cli(&["keys", "create", "--account", &email, "--enterprise"])
        .await
        .expect_err("a name is not an account id");
    assert!(by_name.contains("does not exist"), "{by_name}");
    let as_new = pg
        .gateway_cli(&["keys", "create", "--new-account", &email, "--enterprise"])
        .await
        .expect_err("the name is taken");
    assert!(as_new.contains("--account acct_"), "{as_new}");
    let top_up_by_name = pg
        .gateway_cli(&[
            "accounts",
            "topup",
            "--account",
            &email,
            "--usd",
            "100",
            "--reference",
            "pay_ceo",
        ])
        .await
        .expect_err("a name is not an account id");
    assert!(
        top_up_by_name.contains("does not exist"),
        "{top_up_by_name}"
    );

    // By the account's id, not before its email is verified.
    let account_id = pg
        .query(&format!(
            "SELECT account_id FROM dashboard_users WHERE email = '{email}'"
        ))
        .await;
    let top_up = |reference: &'static str| {
        let (pg, account_id) = (&pg, account_id.clone());
        async move {
            pg.gateway_cli(&[
                "accounts",
                "topup",
                "--account",
                &account_id,
                "--usd",
                "100",
                "--reference",
                reference,
            ])
            .await
        }
    };
    let unverified = pg
        .gateway_cli(&["keys", "create", "--account", &account_id, "--enterprise"])
        .await
        .expect_err("the email is not verified");
    assert!(unverified.contains("not verified"), "{unverified}");
    let unverified = top_up("pay_ceo")
        .await
        .expect_err("the email is not verified");
    assert!(unverified.contains("not verified"), "{unverified}");
    assert_eq!(
        pg.query(&format!(
            "SELECT count(*) || '|' || (SELECT lifetime_top_up_cents FROM accounts WHERE id = '{account_id}')
             FROM api_keys WHERE account_id = '{account_id}'"
        ))
        .await,
        "0|0"
    );

    // Verified by the mailbox's owner, the account takes the operator's key and top-up.
    Visitor::new(gw).verify_email(&email).await;
    let key = pg
        .gateway_cli(&["keys", "create", "--account", &account_id, "--enterprise"])
        .await
        .expect("keys create by id");
    assert_eq!(key["account_id"], account_id.as_str(), "{key}");
    let credited = top_up("pay_ceo").await.expect("top-up by id");
    assert_eq!(credited["lifetime_top_up_cents"], 10_000, "{credited}");
}

/// A rolled-back release (or the old pods of a rolling upgrade) meets a database a newer
/// release migrated: `migrate` applies what it knows and tolerates the rest, and `serve
/// --migrate` starts and serves on that schema (docs/kubernetes.md, "Upgrade and rollback").
#[tokio::test]
async fn a_binary_older_than_the_database_migrates_and_serves_on_it() {
    let pg = PostgresServer::start().await;
    pg.gateway_cli(&["migrate"]).await.expect("migrate");
    let known = pg
        .query_i64("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .await;
    // What a newer release's migration leaves: an addition, and its row in the migrator's table.
    pg.query(
        "ALTER TABLE accounts ADD COLUMN region text; \
         INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (999999, 'a newer release', true, '\\x00', 1)",
    )
    .await;
    pg.gateway_cli(&["migrate"])
        .await
        .expect("an older binary migrates a newer database");
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM _sqlx_migrations WHERE success")
            .await,
        known + 1,
        "the newer migration stays recorded, none of the older ones ran twice"
    );
}

/// A migration that waits longer than the calls' bound (here for a lock another session holds;
/// in a cluster, for the migration lock while another pod migrates) still finishes: migrations
/// run without the `--database-timeout-ms` that bounds every request's call.
#[tokio::test]
async fn a_migration_waiting_past_the_database_timeout_finishes_once_the_lock_is_free() {
    let pg = PostgresServer::start().await;
    pg.migrate_before(27).await;
    let held = pg
        .hold_locks("LOCK TABLE message_rows IN ACCESS EXCLUSIVE MODE")
        .await;
    let migrating = {
        let url = pg.url();
        tokio::spawn(async move {
            tokio::process::Command::new(e2e::gateway::gateway_bin())
                .args([
                    "migrate",
                    "--database-timeout-ms",
                    "300",
                    "--database-url",
                    &url,
                ])
                .output()
                .await
                .expect("run gateway migrate")
        })
    };
    poll_until(
        "gateway migrate to wait for the held lock",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { (pg.lock_waiters().await >= 1).then_some(()) },
    )
    .await;
    // Waiting for more than the database timeout (300 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !migrating.is_finished(),
        "migrate gave up while the lock was held"
    );
    held.release().await;
    let out = migrating.await.expect("the migrate task");
    assert!(
        out.status.success(),
        "migrate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM _sqlx_migrations WHERE version = 27 AND success")
            .await,
        1
    );
}
