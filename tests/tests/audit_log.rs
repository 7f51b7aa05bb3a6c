//! The audit log, end to end on Postgres with the real gateway binary: every change to money
//! or access made through its real interface (the dashboard, the admin API, the command line,
//! Stripe's webhook, the promotion sweep) leaves exactly one row naming its actor, the change
//! and its target, read back through `GET /admin/audit`; Postgres itself refuses to edit or
//! delete a row; the dashboard's audit page shows the signed-in account's rows only.

use std::time::Duration;

use e2e::gateway::unique_name;
use e2e::stripe::{MockStripe, API_KEY, WEBHOOK_SECRET};
use e2e::visitor::{hidden_csrf, new_email, Visitor, PASSWORD};
use e2e::{poll_until, Cluster, Gateway, KeySpec, PostgresServer};
use serde_json::{json, Value};

/// The audit rows of `account_id` newer than row `since`, oldest first.
async fn rows_after(gw: &Gateway, account_id: &str, since: i64) -> Vec<Value> {
    let page = gw
        .admin_get(&format!("/admin/audit?account_id={account_id}&limit=1000"))
        .await
        .expect_ok();
    let mut rows: Vec<Value> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|r| r["id"].as_i64().expect("id") > since)
        .cloned()
        .collect();
    rows.reverse();
    rows
}

/// The newest row id of the whole log (0 when empty).
async fn newest(gw: &Gateway) -> i64 {
    let page = gw.admin_get("/admin/audit?limit=1").await.expect_ok();
    page["data"][0]["id"].as_i64().unwrap_or(0)
}

/// One action's expected row.
struct Expect<'a> {
    actor_kind: &'a str,
    action: &'a str,
    /// `None`: any target (one the action made up, such as a new key's id), returned.
    target: Option<&'a str>,
    /// Fields `before` and `after` must hold.
    before: Value,
    after: Value,
}

/// Asserts the action `what` left exactly one row of `account_id` since `since`, as expected;
/// returns it.
async fn one_row(gw: &Gateway, what: &str, account_id: &str, since: i64, e: Expect<'_>) -> Value {
    let rows = rows_after(gw, account_id, since).await;
    assert_eq!(rows.len(), 1, "{what}: exactly one row, got {rows:#?}");
    let row = rows.into_iter().next().expect("one row");
    assert_eq!(
        (row["actor"]["kind"].as_str(), row["action"].as_str()),
        (Some(e.actor_kind), Some(e.action)),
        "{what}: {row:#}"
    );
    if let Some(target) = e.target {
        assert_eq!(row["target"], target, "{what}: {row:#}");
    }
    for (side, expected) in [("before", &e.before), ("after", &e.after)] {
        for (field, value) in expected.as_object().into_iter().flatten() {
            assert_eq!(
                &row[side][field], value,
                "{what}: {side}.{field} of {row:#}"
            );
        }
    }
    assert_eq!(row["account_id"], account_id, "{what}");
    row
}

fn expect<'a>(actor_kind: &'a str, action: &'a str, target: Option<&'a str>) -> Expect<'a> {
    Expect {
        actor_kind,
        action,
        target,
        before: json!({}),
        after: json!({}),
    }
}

/// The dashboard account of `email`.
async fn account_of(pg: &PostgresServer, email: &str) -> String {
    pg.query(&format!(
        "SELECT account_id FROM dashboard_users WHERE email = '{email}'"
    ))
    .await
}

#[tokio::test]
async fn each_money_and_access_action_leaves_exactly_one_row_naming_its_actor() {
    let stripe = MockStripe::start().await;
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url())
            .env("GATEWAY_STRIPE_API_KEY", API_KEY)
            .env("GATEWAY_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("GATEWAY_STRIPE_API_BASE", &stripe.url)
    })
    .await;
    let gw = &cluster.pods[0];

    // The dashboard: sign-ins, keys, and a checkout Stripe pays, refunds and disputes.
    let email = new_email();
    let mut visitor = Visitor::new(gw);
    let before_sign_up = newest(gw).await;
    visitor.sign_up(&email, &[]).await;
    let account = account_of(&pg, &email).await;
    let signing_up: Vec<(String, String)> = rows_after(gw, &account, before_sign_up)
        .await
        .iter()
        .map(|r| {
            assert_eq!(r["actor"]["id"], email.as_str(), "{r:#}");
            assert_eq!(r["actor"]["client"], "127.0.0.1", "{r:#}");
            (r["actor"]["kind"].to_string(), r["action"].to_string())
        })
        .collect();
    let user_did = |action: &str| ("\"dashboard_user\"".to_owned(), format!("\"{action}\""));
    assert_eq!(
        signing_up,
        [
            user_did("signed_up"),
            user_did("email_verified"),
            user_did("sign_in")
        ],
        "signing up, following the link and signing in: one row each"
    );
    let mut since = newest(gw).await;
    let mut step = async |what: &str, e: Expect<'_>| {
        let row = one_row(gw, what, &account, since, e).await;
        since = row["id"].as_i64().expect("id");
        row
    };

    let (status, _) = visitor.sign_in(&email, "not the password").await;
    assert_eq!(status, 401);
    let row = step(
        "a refused sign-in",
        expect("dashboard_user", "sign_in_failed", Some(&email)),
    )
    .await;
    assert_eq!(row["actor"]["id"], email.as_str());
    assert_eq!(row["actor"]["client"], "127.0.0.1");
    let (status, _) = visitor.sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303);
    step(
        "a sign-in",
        expect("dashboard_user", "sign_in", Some(&email)),
    )
    .await;

    let (status, page) = visitor.create_key("audited").await;
    assert_eq!(status, 200, "{page}");
    let created = step(
        "a key minted on the dashboard",
        Expect {
            after: json!({ "name": "audited", "tier": "free", "kind": "api" }),
            ..expect("dashboard_user", "key_created", None)
        },
    )
    .await;
    let key_id = created["target"].as_str().expect("the key's id").to_owned();
    let revoke = format!("/developers/keys/{key_id}/revoke");
    let (_, confirm) = visitor.get(&revoke).await;
    let (status, page, _) = visitor
        .post(&revoke, &[("csrf", &hidden_csrf(&confirm))], &[])
        .await;
    assert_eq!(status, 200, "{page}");
    step(
        "a key revoked on the dashboard",
        Expect {
            before: json!({ "revoked": false }),
            after: json!({ "revoked": true }),
            ..expect("dashboard_user", "key_revoked", Some(&key_id))
        },
    )
    .await;

    let (status, body, location) = visitor.checkout("25").await;
    assert_eq!(status, 303, "{body}");
    let session = stripe.session_at(location.as_deref().expect("a Location"));
    let paid = stripe.paid(&session);
    let deliver = |event| async move {
        let (status, body) = e2e::stripe::deliver(&gw.api, &event, &event.signature()).await;
        assert_eq!(status, 200, "{body}");
    };
    deliver(paid.clone()).await;
    let row = step(
        "a checkout paid (Stripe's webhook)",
        Expect {
            after: json!({ "usd_cents": 2_500, "credits": 2_500_000 }),
            ..expect("stripe_webhook", "top_up", Some(session.reference()))
        },
    )
    .await;
    assert_eq!(row["actor"]["id"], paid.id.as_str());
    assert_eq!(row["actor"]["client"], "127.0.0.1", "the webhook's sender");
    // A replay changes nothing and leaves nothing: the refund's step finds its own row only.
    deliver(paid).await;
    deliver(stripe.refunded(&session, 1_000)).await;
    step(
        "a refund",
        Expect {
            before: json!({ "refunded_cents": 0 }),
            after: json!({ "refunded_cents": 1_000, "credits": 1_000_000 }),
            ..expect("stripe_webhook", "refund", Some(&session.payment_intent))
        },
    )
    .await;
    let dispute = unique_name("dp");
    deliver(stripe.dispute(
        "charge.dispute.created",
        &dispute,
        &session,
        1_500,
        "needs_response",
    ))
    .await;
    step(
        "a dispute opened",
        Expect {
            before: json!({ "status": null }),
            after: json!({ "status": "open", "usd_cents": 1_500 }),
            ..expect("stripe_webhook", "dispute", Some(&dispute))
        },
    )
    .await;

    // The card the checkout saved (its payment already credited: no row), then an
    // auto-reload rule saved on the billing page, left off.
    deliver(stripe.checkout_intent_succeeded(&session)).await;
    let (_, billing) = visitor.get("/developers/billing").await;
    let csrf = hidden_csrf(&billing);
    let (status, page, _) = visitor
        .post(
            "/developers/billing/auto-reload",
            &[("csrf", &csrf), ("threshold", "1000"), ("amount", "25")],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    step(
        "an auto-reload rule saved",
        Expect {
            before: json!({ "enabled": false }),
            after: json!({ "enabled": false, "threshold_credits": 1_000, "usd_cents": 2_500 }),
            ..expect("dashboard_user", "auto_reload_changed", Some(&account))
        },
    )
    .await;
    let (_, overview) = visitor.get("/developers").await;
    let (status, page, _) = visitor
        .post(
            "/developers/sign-out",
            &[("csrf", &hidden_csrf(&overview))],
            &[],
        )
        .await;
    assert_eq!(status, 303, "{page}");
    step(
        "a sign-out",
        expect("dashboard_user", "signed_out", Some(&email)),
    )
    .await;

    // The admin API: starting credits, a top-up, an enterprise grant, a revocation, a
    // suspension.
    let since = newest(gw).await;
    let account = gw.create_account(5_000).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let step = async |what: &str, since: i64, e: Expect<'_>| {
        let row = one_row(gw, what, &account, since, e).await;
        assert_eq!(row["actor"]["id"], "admin", "{what}");
        assert_eq!(row["actor"]["client"], "127.0.0.1", "{what}");
        row["id"].as_i64().expect("id")
    };
    let since = step(
        "an account's starting credits",
        since,
        Expect {
            after: json!({ "credits": 5_000 }),
            ..expect("admin_token", "credits_added", Some(&account))
        },
    )
    .await;
    let reference = unique_name("admin-top-up");
    gw.top_up(&account, 1_000, &reference).await.expect_ok();
    let since = step(
        "an admin top-up",
        since,
        Expect {
            after: json!({ "usd_cents": 1_000 }),
            ..expect("admin_token", "top_up", Some(&reference))
        },
    )
    .await;
    let key = gw.mint_key(&account, &KeySpec::tier("enterprise")).await;
    let since = step(
        "an enterprise grant",
        since,
        Expect {
            after: json!({ "tier": "enterprise" }),
            ..expect("admin_token", "key_created", Some(&key.id))
        },
    )
    .await;
    gw.revoke(&key.id).await;
    let since = step(
        "an admin revocation",
        since,
        expect("admin_token", "key_revoked", Some(&key.id)),
    )
    .await;
    gw.suspend(&account).await;
    let since = step(
        "a suspension",
        since,
        Expect {
            before: json!({ "status": "active" }),
            after: json!({ "status": "suspended" }),
            ..expect("admin_token", "account_suspended", Some(&account))
        },
    )
    .await;
    gw.resume(&account).await;
    let since = step(
        "a resumption",
        since,
        expect("admin_token", "account_resumed", Some(&account)),
    )
    .await;

    // The command line, against the same database.
    let created = pg
        .gateway_cli(&["keys", "create", "--account", &account])
        .await
        .expect("keys create");
    let cli_key = created["id"].as_str().expect("id");
    let row = one_row(
        gw,
        "a key created by the CLI",
        &account,
        since,
        expect("cli", "key_created", Some(cli_key)),
    )
    .await;
    let since = row["id"].as_i64().expect("id");
    pg.gateway_cli(&["keys", "revoke", cli_key])
        .await
        .expect("keys revoke");
    let row = one_row(
        gw,
        "a key revoked by the CLI",
        &account,
        since,
        expect("cli", "key_revoked", Some(cli_key)),
    )
    .await;
    let since = row["id"].as_i64().expect("id");
    let reference = unique_name("cli-top-up");
    pg.gateway_cli(&[
        "accounts",
        "topup",
        "--account",
        &account,
        "--usd",
        "10",
        "--reference",
        &reference,
    ])
    .await
    .expect("accounts topup");
    one_row(
        gw,
        "a CLI top-up",
        &account,
        since,
        Expect {
            after: json!({ "usd_cents": 1_000 }),
            ..expect("cli", "top_up", Some(&reference))
        },
    )
    .await;
}

#[tokio::test]
async fn each_member_action_leaves_exactly_one_row_naming_its_actor_with_before_and_after() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url()).arg("--sign-ups-per-minute=100")
    })
    .await;
    let gw = &cluster.pods[0];
    let (owner_email, member_email) = (new_email(), new_email());
    let mut owner = Visitor::new(gw);
    owner.sign_up(&owner_email, &[]).await;
    let mut member = Visitor::new(gw);
    member.sign_up(&member_email, &[]).await;
    let account = account_of(&pg, &owner_email).await;
    let own_account = account_of(&pg, &member_email).await;
    let by_owner = |row: &Value| {
        assert_eq!(row["actor"]["id"], owner_email.as_str(), "{row:#}");
        assert_eq!(row["actor"]["client"], "127.0.0.1", "{row:#}");
    };

    let since = newest(gw).await;
    let (status, page) = owner.invite(&member_email, "developer").await;
    assert_eq!(status, 200, "{page}");
    let row = one_row(
        gw,
        "an invitation sent",
        &account,
        since,
        Expect {
            after: json!({ "role": "developer" }),
            ..expect("dashboard_user", "invitation_sent", Some(&member_email))
        },
    )
    .await;
    by_owner(&row);

    // Accepting moves the member and starts their session anew: the acceptance's row, then
    // the new session's sign-in.
    let since = row["id"].as_i64().expect("id");
    let link = e2e::visitor::invitation_link(gw, &member_email).await;
    let (status, page) = member.accept_invitation(&link).await;
    assert_eq!(status, 303, "{page}");
    let rows = rows_after(gw, &account, since).await;
    let actions: Vec<&str> = rows.iter().filter_map(|r| r["action"].as_str()).collect();
    assert_eq!(actions, ["invitation_accepted", "sign_in"], "{rows:#?}");
    let accepted = &rows[0];
    assert_eq!(accepted["actor"]["id"], member_email.as_str());
    assert_eq!(accepted["target"], member_email.as_str());
    assert_eq!(
        (&accepted["before"], &accepted["after"]),
        (
            &json!({ "account_id": own_account, "role": "owner" }),
            &json!({ "account_id": account, "role": "developer" })
        )
    );

    let since = rows[1]["id"].as_i64().expect("id");
    let member_id = pg
        .query(&format!(
            "SELECT id FROM dashboard_users WHERE email = '{member_email}'"
        ))
        .await;
    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = owner
        .post(
            &format!("/developers/members/{member_id}/role"),
            &[("csrf", &csrf), ("role", "billing")],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let row = one_row(
        gw,
        "a member's role changed",
        &account,
        since,
        Expect {
            before: json!({ "role": "developer" }),
            after: json!({ "role": "billing" }),
            ..expect("dashboard_user", "member_role_changed", Some(&member_email))
        },
    )
    .await;
    by_owner(&row);
    // The same role again changes nothing, and leaves nothing: the removal's step finds its
    // own row only.
    owner
        .post(
            &format!("/developers/members/{member_id}/role"),
            &[("csrf", &csrf), ("role", "billing")],
            &[],
        )
        .await;

    let since = row["id"].as_i64().expect("id");
    let (status, page, _) = owner
        .post(
            &format!("/developers/members/{member_id}/remove"),
            &[("csrf", &csrf)],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let row = one_row(
        gw,
        "a member removed",
        &account,
        since,
        Expect {
            before: json!({ "role": "billing" }),
            ..expect("dashboard_user", "member_removed", Some(&member_email))
        },
    )
    .await;
    by_owner(&row);
}

#[tokio::test]
async fn the_promotion_sweep_leaves_one_row_per_key_it_moves() {
    let gw = Gateway::builder()
        .arg("--promotion-interval-secs")
        .arg("1")
        .start()
        .await;
    let key = gw.new_key(0, &KeySpec::tier("free")).await;
    let since = newest(&gw).await;
    gw.top_up(&key.account_id, 1_000, &unique_name("sweep"))
        .await
        .expect_ok();
    let row = poll_until(
        "the sweep to promote the key",
        Duration::from_secs(20),
        Duration::from_millis(250),
        || async {
            let rows = rows_after(&gw, &key.account_id, since).await;
            rows.into_iter()
                .find(|r| r["action"] == "tier_promoted")
                .map(|r| r["id"].as_i64().expect("id"))
        },
    )
    .await;
    let promoted = one_row(
        &gw,
        "a promotion",
        &key.account_id,
        row - 1,
        Expect {
            before: json!({ "tier": "free" }),
            after: json!({ "tier": "pay_as_you_go" }),
            ..expect("sweep", "tier_promoted", Some(&key.id))
        },
    )
    .await;
    assert_eq!(promoted["actor"]["id"], "promotion_sweep");
    // Later sweeps find nothing more to move.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(rows_after(&gw, &key.account_id, row).await.is_empty());
}

#[tokio::test]
async fn postgres_refuses_to_update_delete_or_truncate_an_audit_row() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    let account = gw.create_account(0).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    gw.suspend(&account).await;
    let count = "SELECT count(*) FROM audit_log WHERE action = 'account_suspended'";
    assert_eq!(pg.query_i64(count).await, 1);
    for sql in [
        "UPDATE audit_log SET actor_id = 'someone else'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ] {
        let refused = pg.try_query(sql).await;
        let error = refused.expect_err(sql);
        assert!(error.contains("append-only"), "{sql}: {error}");
    }
    assert_eq!(pg.query_i64(count).await, 1);
    assert_eq!(
        pg.query("SELECT actor_id FROM audit_log WHERE action = 'account_suspended'")
            .await,
        "admin"
    );
}

#[tokio::test]
async fn the_dashboard_audit_page_and_its_csv_show_only_the_signed_in_accounts_rows() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    let (mine, theirs) = (new_email(), new_email());
    let mut me = Visitor::new(gw);
    me.sign_up(&mine, &[]).await;
    let mut them = Visitor::new(gw);
    them.sign_up(&theirs, &[]).await;
    let their_key = unique_name("their-key");
    them.create_key(&their_key).await;
    me.create_key("my-key").await;
    let their_account = account_of(&pg, &theirs).await;
    let their_row = &rows_after(gw, &their_account, 0).await;
    let their_key_id = their_row
        .iter()
        .find(|r| r["action"] == "key_created")
        .expect("their key's row")["target"]
        .as_str()
        .expect("id")
        .to_owned();

    let (status, page) = me.get("/developers/audit").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("key_created") && page.contains(&mine),
        "{page}"
    );
    assert!(
        !page.contains(&theirs) && !page.contains(&their_key_id),
        "{page}"
    );
    let (status, filtered) = me.get("/developers/audit?action=sign_in").await;
    assert_eq!(status, 200);
    assert!(filtered.contains("data-action=\"sign_in\""), "{filtered}");
    assert!(
        !filtered.contains("data-action=\"key_created\""),
        "{filtered}"
    );

    let (status, csv) = me.get("/developers/audit.csv").await;
    assert_eq!(status, 200);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "id,at,actor_kind,actor_id,client,action,target,before,after"
    );
    assert!(
        lines[1..].iter().any(|l| l.contains(",key_created,")),
        "{csv}"
    );
    assert!(lines[1..].iter().all(|l| l.contains(&mine)), "{csv}");
    assert!(
        !csv.contains(&theirs) && !csv.contains(&their_key_id),
        "{csv}"
    );

    for bad in ["action=no_such_action", "before=not-a-row"] {
        let (status, page) = me.get(&format!("/developers/audit?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {page}");
        assert!(page.contains("notice error"), "{bad}: {page}");
    }
}

#[tokio::test]
async fn the_admin_audit_list_filters_pages_and_refuses_bad_filters_in_the_envelope() {
    let gw = Gateway::start().await;
    let key = gw.new_key(0, &KeySpec::api()).await;
    let account = &key.account_id;
    for _ in 0..2 {
        gw.mint_key(account, &KeySpec::api()).await;
    }
    gw.revoke(&key.id).await;
    let list = |query: String| {
        let gw = &gw;
        async move {
            gw.admin_get(&format!("/admin/audit?account_id={account}{query}"))
                .await
                .expect_ok()
        }
    };
    let all = list(String::new()).await;
    let ids: Vec<&Value> = all["data"].as_array().expect("data").iter().collect();
    assert_eq!(ids.len(), 4, "three keys and a revocation: {all:#}");
    assert_eq!(all["has_more"], false);

    let created = list("&action=key_created".to_owned()).await;
    assert_eq!(created["data"].as_array().expect("data").len(), 3);
    let by_cli = list("&actor_kind=cli".to_owned()).await;
    assert!(by_cli["data"].as_array().expect("data").is_empty());
    let later = list("&from=2999-01-01T00:00:00Z".to_owned()).await;
    assert!(later["data"].as_array().expect("data").is_empty());

    // Two pages of two, in order, and nothing after the last.
    let first = list("&limit=2".to_owned()).await;
    assert_eq!(first["has_more"], true);
    let after = first["last_id"].as_str().expect("last_id");
    let second = list(format!("&limit=2&after_id={after}")).await;
    assert_eq!(second["has_more"], false);
    let paged: Vec<Value> = [&first, &second]
        .iter()
        .flat_map(|p| p["data"].as_array().expect("data").clone())
        .collect();
    assert_eq!(paged, all["data"].as_array().expect("data").clone());

    for bad in [
        "action=no_such_action",
        "actor_kind=robot",
        "from=yesterday",
        "limit=0",
        "limit=1001",
        "after_id=x",
    ] {
        let resp = gw.admin_get(&format!("/admin/audit?{bad}")).await;
        let message = resp.expect_error(400, "invalid_request_error");
        assert!(!message.is_empty(), "{bad}");
    }
}
