//! Organizations on the dashboard, end to end on Postgres with the real gateway binary: what
//! each role (owner, admin, developer, billing) can and cannot see or do, checked on the
//! server for every page and form; invitations (single use, for their email only, expiring);
//! a removal or a role change ending the member's live session within one request; the
//! migration of accounts made before organizations; the members page in a real browser, with
//! its screenshots in docs/screenshots/.

use std::time::Duration;

use e2e::browser::{Browser, DESKTOP, PHONE};
use e2e::gateway::workspace_root;
use e2e::visitor::{hidden_csrf, invitation_link, new_email, Visitor, PASSWORD};
use e2e::{Cluster, Gateway, PostgresServer};
use store::accounts::KeyHash;
use store::developers::{DeveloperStore, PostgresDeveloperStore, Role};

const OVERVIEW: &str = "/developers";
const REFUSED: &str = "Not available to your role";

/// One pod on `pg` with `args`; every member signs up from the same address.
async fn dashboard(pg: &PostgresServer, args: &[&str]) -> Cluster {
    Cluster::start(1, |b| {
        args.iter().fold(
            b.database(&pg.url()).arg("--sign-ups-per-minute=100"),
            |b, arg| b.arg(arg),
        )
    })
    .await
}

/// A new user who signs up, is invited by `owner` as `role` and accepts: their visitor,
/// signed in with the new role, and their email.
async fn join<'a>(gw: &'a Gateway, owner: &mut Visitor<'_>, role: &str) -> (Visitor<'a>, String) {
    let email = new_email();
    let mut member = Visitor::new(gw);
    member.sign_up(&email, &[]).await;
    let (status, page) = owner.invite(&email, role).await;
    assert_eq!(status, 200, "{page}");
    let link = invitation_link(gw, &email).await;
    let (status, page) = member.accept_invitation(&link).await;
    assert_eq!(status, 303, "accepting signs in again: {page}");
    assert_eq!(member.location.as_deref(), Some(OVERVIEW));
    (member, email)
}

async fn user_id(pg: &PostgresServer, email: &str) -> String {
    pg.query(&format!(
        "SELECT id FROM dashboard_users WHERE email = '{email}'"
    ))
    .await
}

async fn key_id(pg: &PostgresServer, name: &str) -> String {
    pg.query(&format!("SELECT id FROM api_keys WHERE name = '{name}'"))
        .await
}

/// Posts `form` (with the CSRF token of the visitor's overview page) to `path`.
async fn post(visitor: &mut Visitor<'_>, path: &str, form: &[(&str, &str)]) -> (u16, String) {
    let (_, page) = visitor.get(OVERVIEW).await;
    let csrf = hidden_csrf(&page);
    let mut form = form.to_vec();
    form.push(("csrf", &csrf));
    let (status, page, _) = visitor.post(path, &form, &[]).await;
    (status, page)
}

/// The pages behind sign-in, and which roles (owner, admin, developer, billing) may see them.
const PAGES: [(&str, [bool; 4]); 8] = [
    (OVERVIEW, [true, true, true, true]),
    ("/developers/usage", [true, true, true, true]),
    ("/developers/usage.csv", [true, true, true, true]),
    ("/developers/keys", [true, true, true, false]),
    ("/developers/billing", [true, false, false, true]),
    ("/developers/audit", [true, true, false, false]),
    ("/developers/audit.csv", [true, true, false, false]),
    ("/developers/members", [true, true, false, false]),
];

#[tokio::test]
async fn each_role_sees_and_does_only_what_it_may_on_every_page_and_form() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, &[]).await;
    let gw = &cluster.pods[0];
    let owner_email = new_email();
    let mut owner = Visitor::new(gw);
    owner.sign_up(&owner_email, &[]).await;
    let (mut admin, _) = join(gw, &mut owner, "admin").await;
    let (mut developer, developer_email) = join(gw, &mut owner, "developer").await;
    let (mut billing, _) = join(gw, &mut owner, "billing").await;

    let members = [
        ("owner", &mut owner),
        ("admin", &mut admin),
        ("developer", &mut developer),
        ("billing", &mut billing),
    ];
    for (index, (name, visitor)) in members.into_iter().enumerate() {
        let (_, overview) = visitor.get(OVERVIEW).await;
        for (path, allowed) in PAGES {
            let (status, page) = visitor.get(path).await;
            if allowed[index] {
                assert_eq!(status, 200, "{name} opens {path}: {page}");
            } else {
                assert_eq!(status, 403, "{name} is refused {path}: {page}");
                assert!(page.contains(REFUSED), "{name} on {path}: {page}");
                if path != OVERVIEW {
                    assert!(
                        !overview.contains(&format!("href=\"{path}\"")),
                        "{name}'s navigation hides {path}"
                    );
                }
            }
        }
    }

    // Forms are checked the same way: each refused one changes nothing.
    let account = pg
        .query(&format!(
            "SELECT account_id FROM dashboard_users WHERE email = '{owner_email}'"
        ))
        .await;
    let (status, page) = post(
        &mut developer,
        "/developers/billing/checkout",
        &[("amount", "25")],
    )
    .await;
    assert_eq!(status, 403, "a developer starts no top-up: {page}");
    let (status, page) = post(
        &mut admin,
        "/developers/billing/auto-reload",
        &[("enabled", "on"), ("threshold", "1000"), ("amount", "25")],
    )
    .await;
    assert_eq!(status, 403, "an admin sets no auto-reload: {page}");
    let checkouts =
        format!("SELECT count(*) FROM dashboard_checkouts WHERE account_id = '{account}'");
    assert_eq!(pg.query_i64(&checkouts).await, 0);
    let (status, page) = post(
        &mut billing,
        "/developers/keys",
        &[("name", "billing-key"), ("kind", "api")],
    )
    .await;
    assert_eq!(status, 403, "billing mints no key: {page}");
    let (status, page) = post(
        &mut developer,
        "/developers/members/invite",
        &[("email", "friend@example.com"), ("role", "owner")],
    )
    .await;
    assert_eq!(status, 403, "a developer invites nobody: {page}");
    let owner_id = user_id(&pg, &owner_email).await;
    let (status, page) = post(
        &mut developer,
        &format!("/developers/members/{owner_id}/remove"),
        &[],
    )
    .await;
    assert_eq!(status, 403, "a developer removes nobody: {page}");
    // An admin manages members, but never an owner, and makes none.
    let (status, page) = admin.invite("new-owner@example.com", "owner").await;
    assert_eq!(status, 403, "an admin invites no owner: {page}");
    for (path, form) in [
        (
            format!("/developers/members/{owner_id}/role"),
            vec![("role", "developer")],
        ),
        (format!("/developers/members/{owner_id}/remove"), vec![]),
    ] {
        let (status, page) = post(&mut admin, &path, &form).await;
        assert_eq!(status, 403, "an admin and an owner, {path}: {page}");
    }
    let (status, page) = post(
        &mut owner,
        &format!("/developers/members/{owner_id}/role"),
        &[("role", "admin")],
    )
    .await;
    assert_eq!(status, 409, "the last owner does not step down: {page}");
    let invitations =
        format!("SELECT count(*) FROM dashboard_invitations WHERE account_id = '{account}'");
    assert_eq!(
        pg.query_i64(&invitations).await,
        0,
        "no invitation was made"
    );
    let roles = pg
        .query(&format!(
            "SELECT string_agg(role, ',' ORDER BY role) FROM dashboard_users WHERE account_id = '{account}'"
        ))
        .await;
    assert_eq!(roles, "admin,billing,developer,owner");
    let keys = format!("SELECT count(*) FROM api_keys WHERE account_id = '{account}'");
    assert_eq!(pg.query_i64(&keys).await, 0);

    // A developer sees and revokes their own keys only; owners and admins see every key.
    let (status, page) = owner.create_key("owners-key").await;
    assert_eq!(status, 200, "{page}");
    let (status, page) = developer.create_key("developers-key").await;
    assert_eq!(status, 200, "{page}");
    let (_, page) = developer.get("/developers/keys").await;
    assert!(
        page.contains("developers-key") && !page.contains("owners-key"),
        "{page}"
    );
    let (_, page) = admin.get("/developers/keys").await;
    assert!(
        page.contains("developers-key") && page.contains("owners-key"),
        "{page}"
    );
    let owners_key = key_id(&pg, "owners-key").await;
    let revoke = format!("/developers/keys/{owners_key}/revoke");
    let (status, _) = developer.get(&revoke).await;
    assert_eq!(status, 404, "another's key is no page of a developer's");
    let (status, _) = post(&mut developer, &revoke, &[]).await;
    assert_eq!(status, 404);
    let revoked = format!(
        "SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL AND account_id = '{account}'"
    );
    assert_eq!(pg.query_i64(&revoked).await, 0, "the owner's key stands");
    let developers_key = key_id(&pg, "developers-key").await;
    let (status, page) = post(
        &mut developer,
        &format!("/developers/keys/{developers_key}/revoke"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(pg.query_i64(&revoked).await, 1);
    let created_by = pg
        .query(&format!(
            "SELECT created_by FROM api_keys WHERE id = '{developers_key}'"
        ))
        .await;
    assert_eq!(created_by, user_id(&pg, &developer_email).await);
}

#[tokio::test]
async fn an_invitation_works_once_only_for_its_email_and_not_after_it_expires() {
    let pg = PostgresServer::start().await;
    // Invitations last about five seconds here.
    let cluster = dashboard(&pg, &["--dashboard-invitation-days=0.00006"]).await;
    let gw = &cluster.pods[0];
    let mut owner = Visitor::new(gw);
    owner.sign_up(&new_email(), &[]).await;
    let (invitee_email, stranger_email, late_email) = (new_email(), new_email(), new_email());
    let mut invitee = Visitor::new(gw);
    invitee.sign_up(&invitee_email, &[]).await;
    let mut stranger = Visitor::new(gw);
    stranger.sign_up(&stranger_email, &[]).await;
    let mut late = Visitor::new(gw);
    late.sign_up(&late_email, &[]).await;

    let (status, page) = owner.invite(&invitee_email, "developer").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&format!("data-invited=\"{invitee_email}\"")),
        "pending: {page}"
    );
    let link = invitation_link(gw, &invitee_email).await;
    // Opening the link signed out changes nothing and says how to accept.
    let mut signed_out = Visitor::new(gw);
    let (status, page) = signed_out
        .get(&link[link.find("/developers").unwrap_or_default()..])
        .await;
    assert_eq!(status, 200);
    assert!(page.contains("Sign in with the address"), "{page}");

    let (status, page) = stranger.accept_invitation(&link).await;
    assert_eq!(status, 403, "another email cannot use it: {page}");
    assert!(page.contains("sent to another address"), "{page}");
    let (status, page) = invitee.accept_invitation(&link).await;
    assert_eq!(status, 303, "its email accepts it: {page}");
    let (status, _) = invitee.get("/developers/keys").await;
    assert_eq!(status, 200, "as a developer");
    let (status, _) = invitee.get("/developers/members").await;
    assert_eq!(status, 403);
    let (status, page) = invitee.accept_invitation(&link).await;
    assert_eq!(status, 410, "a second use: {page}");
    let role = pg
        .query(&format!(
            "SELECT role FROM dashboard_users WHERE email = '{stranger_email}'"
        ))
        .await;
    assert_eq!(
        role, "owner",
        "the stranger stayed in their own organization"
    );

    let (status, page) = owner.invite(&late_email, "billing").await;
    assert_eq!(status, 200, "{page}");
    let link = invitation_link(gw, &late_email).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (status, page) = late.accept_invitation(&link).await;
    assert_eq!(status, 410, "an expired invitation: {page}");
    let (_, page) = owner.get("/developers/members").await;
    assert!(
        !page.contains(&format!("data-invited=\"{late_email}\"")),
        "no longer pending"
    );
    assert!(!page.contains(&format!("data-member=\"{late_email}\"")));
}

/// Signed in: the overview answers 200 (not the redirect to sign-in).
async fn signed_in(visitor: &mut Visitor<'_>) -> bool {
    visitor.get(OVERVIEW).await.0 == 200
}

#[tokio::test]
async fn removing_a_member_signs_them_out_at_their_next_request_and_can_revoke_their_keys() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, &[]).await;
    let gw = &cluster.pods[0];
    let mut owner = Visitor::new(gw);
    owner.sign_up(&new_email(), &[]).await;
    let (mut developer, developer_email) = join(gw, &mut owner, "developer").await;
    let (mut admin, admin_email) = join(gw, &mut owner, "admin").await;
    let (status, page) = developer.create_key("leaver-key").await;
    assert_eq!(status, 200, "{page}");
    let (status, page) = owner.create_key("stays-key").await;
    assert_eq!(status, 200, "{page}");
    assert!(signed_in(&mut developer).await);

    // A role change ends the member's sessions: their next request signs in again, and
    // the new session has the new role.
    let admin_id = user_id(&pg, &admin_email).await;
    let (status, page) = post(
        &mut owner,
        &format!("/developers/members/{admin_id}/role"),
        &[("role", "billing")],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(admin.get("/developers/members").await.0, 303, "signed out");
    let (status, _) = admin.sign_in(&admin_email, PASSWORD).await;
    assert_eq!(status, 303);
    assert_eq!(
        admin.get("/developers/members").await.0,
        403,
        "as billing now"
    );

    let developer_id = user_id(&pg, &developer_email).await;
    let (status, page) = post(
        &mut owner,
        &format!("/developers/members/{developer_id}/remove"),
        &[("revoke_keys", "on")],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("1 of their keys revoked"), "{page}");
    let (status, _) = developer.get(OVERVIEW).await;
    assert_eq!(
        status, 303,
        "the removed member's next request is signed out"
    );
    let sessions = pg
        .query_i64(&format!(
            "SELECT count(*) FROM dashboard_sessions WHERE user_id = '{developer_id}'"
        ))
        .await;
    assert_eq!(sessions, 0);
    let (status, _) = developer.sign_in(&developer_email, PASSWORD).await;
    assert_eq!(status, 401, "no longer a user");
    for (name, revoked) in [("leaver-key", 1), ("stays-key", 0)] {
        let sql = format!(
            "SELECT count(*) FROM api_keys WHERE name = '{name}' AND revoked_at IS NOT NULL"
        );
        assert_eq!(
            pg.query_i64(&sql).await,
            revoked,
            "{name}: the remover's keys only, as asked"
        );
    }
    assert!(signed_in(&mut owner).await);
}

#[tokio::test]
async fn migration_0019_makes_each_existing_user_the_owner_of_their_account() {
    let pg = PostgresServer::start().await;
    pg.migrate_before(19).await;
    let pool = sqlx::PgPool::connect(&pg.url()).await.expect("pool");

    // Rows as the code of before writes them: an account, its user (one per account), a
    // session, a key minted on the dashboard.
    let session_token = "session-of-before";
    for sql in [
        "INSERT INTO accounts (id, name) VALUES ('acct_old', 'old@example.com')",
        "INSERT INTO dashboard_users
             (id, email, password_hash, account_id, created_at, email_verified_at)
         VALUES ('usr_old', 'old@example.com', 'hash', 'acct_old', now(), now())",
        "INSERT INTO api_keys (id, account_id, name, prefix, hash, kind, scopes, tier,
             created_at, expires_at, spend_cap)
         VALUES ('key_old', 'acct_old', 'old', 'sk-svc-old', '\\x00', 'api', '{}', 'free',
             now(), NULL, NULL)",
    ] {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    sqlx::query(
        "INSERT INTO dashboard_sessions (token_hash, user_id, csrf, expires_at, last_used_at)
         VALUES ($1, 'usr_old', 'csrf', now() + interval '1 hour', now())",
    )
    .bind(KeyHash::of(session_token).as_bytes())
    .execute(&pool)
    .await
    .expect("a session");
    pool.close().await;

    let db = store::db::Database::connect(&pg.url(), 4, Duration::from_secs(10)).expect("pool");
    db.migrate().await.expect("0019 on a filled database");
    let developers = PostgresDeveloperStore::new(db);
    let members = developers.members("acct_old").await.expect("members");
    assert_eq!(members.len(), 1);
    assert_eq!(
        (members[0].email.as_str(), members[0].role),
        ("old@example.com", Role::Owner)
    );
    let session = developers
        .session(&KeyHash::of(session_token), time::Duration::minutes(30))
        .await
        .expect("lookup")
        .expect("the session of before is still signed in");
    assert_eq!(session.role, Role::Owner);
    assert_eq!(
        pg.query("SELECT coalesce(created_by, 'none') FROM api_keys")
            .await,
        "none"
    );
}

#[tokio::test]
async fn the_members_page_in_a_browser_invites_lists_and_refuses_by_role() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, &[]).await;
    let gw = &cluster.pods[0];
    let b = Browser::start().await;
    let base = format!("{}/developers", gw.api);
    let email = new_email();
    b.goto(&format!("{base}/sign-up")).await;
    b.fill("#email", &email).await;
    b.fill("#password", PASSWORD).await;
    b.click_and_load("button[type=submit]").await;
    b.verify_and_sign_in(gw, &email, PASSWORD).await;

    b.click_and_load("a[href='/developers/members']").await;
    let invitee = new_email();
    b.fill("#invite-email", &invitee).await;
    b.click_and_load("#invite").await;
    assert!(b
        .text(".notice")
        .await
        .contains(&format!("Invitation sent to {invitee}")));
    assert!(b.text("#invitations").await.contains(&invitee));
    // Two members joined, so the page shows its forms for them.
    let mut member = Visitor::new(gw);
    member.sign_up(&invitee, &[]).await;
    let link = invitation_link(gw, &invitee).await;
    assert_eq!(member.accept_invitation(&link).await.0, 303);
    let mut owner = Visitor::new(gw);
    assert_eq!(owner.sign_in(&email, PASSWORD).await.0, 303);
    let pending = new_email();
    assert_eq!(owner.invite(&pending, "billing").await.0, 200);
    b.goto(&format!("{base}/members")).await;
    assert!(b.text("#members").await.contains(&invitee));
    let dir = workspace_root().join("docs").join("screenshots");
    b.screenshot(&dir, "members", "desktop", DESKTOP).await;
    b.screenshot(&dir, "members", "phone", PHONE).await;
    b.quit().await;

    // A developer typing the billing page's address in a browser gets the refusal page.
    let b = Browser::start().await;
    b.goto(&format!("{base}/sign-in")).await;
    b.fill("#email", &invitee).await;
    b.fill("#password", PASSWORD).await;
    b.click_and_load("button[type=submit]").await;
    b.wait_for_path("/developers").await;
    b.goto(&format!("{base}/billing")).await;
    assert_eq!(b.text("h1").await, REFUSED);
    assert!(!b
        .client
        .source()
        .await
        .expect("source")
        .contains("/developers/billing/checkout"));
    b.screenshot(&dir, "refused", "desktop", DESKTOP).await;
    b.quit().await;
}

#[tokio::test]
async fn in_a_browser_each_role_sees_only_its_pages_and_gets_the_refusal_page_by_address() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, &[]).await;
    let gw = &cluster.pods[0];
    let owner_email = new_email();
    let mut owner = Visitor::new(gw);
    owner.sign_up(&owner_email, &[]).await;
    let mut emails = vec![owner_email];
    for role in ["admin", "developer", "billing"] {
        emails.push(join(gw, &mut owner, role).await.1);
    }
    let b = Browser::start().await;
    for (index, email) in emails.iter().enumerate() {
        b.goto(&format!("{}/developers/sign-in", gw.api)).await;
        b.fill("#email", email).await;
        b.fill("#password", PASSWORD).await;
        b.click_and_load("button[type=submit]").await;
        b.wait_for_path(OVERVIEW).await;
        let navigation = b.text("nav.sidenav").await;
        for (path, allowed) in PAGES.iter().filter(|(p, _)| !p.ends_with(".csv")) {
            b.goto(&format!("{}{path}", gw.api)).await;
            let heading = b.text("h1").await;
            assert_eq!(
                heading != REFUSED,
                allowed[index],
                "{email} (role {index}) on {path}: {heading}"
            );
            let label = match *path {
                "/developers/keys" => Some("API keys"),
                "/developers/billing" => Some("Billing"),
                "/developers/audit" => Some("Audit log"),
                "/developers/members" => Some("Members"),
                _ => None,
            };
            if let Some(label) = label {
                assert_eq!(
                    navigation.contains(label),
                    allowed[index],
                    "{email}'s navigation and {label}: {navigation}"
                );
            }
        }
        b.click_and_load(".account button[type=submit]").await;
        b.wait_for_path("/developers/sign-in").await;
    }
    b.quit().await;
}
