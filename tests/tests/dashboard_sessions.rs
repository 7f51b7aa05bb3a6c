//! Dashboard sessions end to end on Postgres with the real gateway binary: a new session id
//! at every sign-in, CSRF tokens on state-changing forms, the idle lifetime, and signing out
//! everywhere.

use std::time::Duration;

use e2e::gateway::unique_name;
use e2e::visitor::{hidden_csrf, new_email, Visitor, PASSWORD};
use e2e::{Cluster, GatewayBuilder, PostgresServer};

const SESSION_COOKIE: &str = "svc_session";

fn session_of(visitor: &Visitor<'_>) -> Option<String> {
    visitor
        .cookies
        .iter()
        .find(|(k, _)| k == SESSION_COOKIE)
        .map(|(_, v)| v.clone())
        .filter(|v| !v.is_empty())
}

fn plant_session(visitor: &mut Visitor<'_>, token: &str) {
    visitor.cookies.retain(|(k, _)| k != SESSION_COOKIE);
    visitor
        .cookies
        .push((SESSION_COOKIE.to_owned(), token.to_owned()));
}

async fn dashboard(
    pg: &PostgresServer,
    configure: impl Fn(GatewayBuilder) -> GatewayBuilder,
) -> Cluster {
    Cluster::start(1, |b| configure(b.database(&pg.url()))).await
}

async fn sessions_of(pg: &PostgresServer, email: &str) -> i64 {
    pg.query_i64(&format!(
        "SELECT count(*) FROM dashboard_sessions s JOIN dashboard_users u ON u.id = s.user_id
         WHERE u.email = '{email}'"
    ))
    .await
}

/// Signed in: the overview answers 200 (not the redirect to sign-in).
async fn signed_in(visitor: &mut Visitor<'_>) -> bool {
    let (status, _) = visitor.get("/developers").await;
    status == 200
}

#[tokio::test]
async fn a_session_id_from_before_sign_in_is_never_the_signed_in_one() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, |b| b).await;
    let gw = &cluster.pods[0];
    let email = new_email();
    let mut owner = Visitor::new(gw);
    owner.sign_up(&email, &[]).await;
    let first = session_of(&owner).expect("a session after sign-up");
    assert!(signed_in(&mut owner).await);

    // Signing in again in the same browser: a new id, and the old one no longer signs in.
    let (status, page) = owner.sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303, "{page}");
    let second = session_of(&owner).expect("a session after sign-in");
    assert_ne!(first, second);
    let mut old = Visitor::new(gw);
    plant_session(&mut old, &first);
    assert!(!signed_in(&mut old).await, "the session of before is over");

    // A session id planted in a browser before its user signs in is not the one after.
    let planted = unique_name("planted");
    let mut victim = Visitor::new(gw);
    plant_session(&mut victim, &planted);
    let (status, page) = victim.sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303, "{page}");
    let after = session_of(&victim).expect("a session after sign-in");
    assert_ne!(after, planted);
    let mut attacker = Visitor::new(gw);
    plant_session(&mut attacker, &planted);
    assert!(!signed_in(&mut attacker).await);
    assert!(signed_in(&mut victim).await);
}

#[tokio::test]
async fn a_post_with_a_missing_or_forged_csrf_token_is_403_and_changes_nothing() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, |b| b).await;
    let gw = &cluster.pods[0];
    let email = new_email();
    let mut owner = Visitor::new(gw);
    owner.sign_up(&email, &[]).await;
    let keys = || async {
        pg.query_i64(&format!(
            "SELECT count(*) FROM api_keys k JOIN dashboard_users u ON u.account_id = k.account_id
             WHERE u.email = '{email}'"
        ))
        .await
    };
    let keys_before = keys().await;
    let sessions_before = sessions_of(&pg, &email).await;
    assert!(sessions_before > 0);
    let forged = unique_name("forged");
    for csrf in [None, Some(forged.as_str())] {
        let mut key_form = vec![("name", "forged-key"), ("kind", "api")];
        let mut csrf_form = Vec::new();
        if let Some(token) = csrf {
            key_form.push(("csrf", token));
            csrf_form.push(("csrf", token));
        }
        let (status, page, _) = owner.post("/developers/keys", &key_form, &[]).await;
        assert_eq!(status, 403, "a key form without its token: {page}");
        assert!(page.contains("<html"), "the dashboard's error page: {page}");
        for path in ["/developers/sign-out-everywhere", "/developers/sign-out"] {
            let (status, page, _) = owner.post(path, &csrf_form, &[]).await;
            assert_eq!(status, 403, "{path} without its token: {page}");
        }
    }
    assert_eq!(keys().await, keys_before, "no key was created");
    assert_eq!(sessions_of(&pg, &email).await, sessions_before);
    assert!(signed_in(&mut owner).await, "no session was ended");
}

#[tokio::test]
async fn a_session_unused_past_its_idle_lifetime_is_refused_and_deleted() {
    let pg = PostgresServer::start().await;
    // Three seconds idle: a use is written once the stored one is 0.75 s old.
    let cluster = dashboard(&pg, |b| b.arg("--dashboard-session-idle-mins=0.05")).await;
    let gw = &cluster.pods[0];
    let email = new_email();
    let mut owner = Visitor::new(gw);
    owner.sign_up(&email, &[]).await;
    // Used every second for longer than the idle lifetime: still signed in.
    for _ in 0..5 {
        assert!(signed_in(&mut owner).await, "a session in use stays");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, _) = owner.get("/developers").await;
    assert_eq!(status, 303, "an idle session is sent to sign in");
    assert_eq!(sessions_of(&pg, &email).await, 0, "and deleted");
}

#[tokio::test]
async fn signing_out_everywhere_ends_another_browsers_session_at_once() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, |b| b).await;
    let gw = &cluster.pods[0];
    let (email, bystander_email) = (new_email(), new_email());
    let mut laptop = Visitor::new(gw);
    laptop.sign_up(&email, &[]).await;
    let mut phone = Visitor::new(gw);
    let (status, page) = phone.sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303, "{page}");
    let mut bystander = Visitor::new(gw);
    bystander.sign_up(&bystander_email, &[]).await;
    assert!(signed_in(&mut phone).await);

    let (_, page) = laptop.get("/developers").await;
    assert!(page.contains("/developers/sign-out-everywhere"), "{page}");
    let csrf = hidden_csrf(&page);
    let (status, page, set) = laptop
        .post("/developers/sign-out-everywhere", &[("csrf", &csrf)], &[])
        .await;
    assert_eq!(status, 303, "{page}");
    assert_eq!(laptop.location.as_deref(), Some("/developers/sign-in"));
    assert!(
        set.iter().any(|c| c.starts_with("svc_session=;")),
        "{set:?}"
    );

    assert!(
        !signed_in(&mut phone).await,
        "the other browser is signed out"
    );
    assert!(!signed_in(&mut laptop).await);
    assert_eq!(sessions_of(&pg, &email).await, 0);
    assert!(signed_in(&mut bystander).await, "nobody else is");
    let audited = pg
        .query_i64(&format!(
            "SELECT count(*) FROM audit_log
             WHERE action = 'signed_out_everywhere' AND actor_id = '{email}'"
        ))
        .await;
    assert_eq!(audited, 1);
}
