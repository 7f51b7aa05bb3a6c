//! Dashboard sessions end to end on Postgres with the real gateway binary: a new session id
//! at every sign-in, CSRF tokens on state-changing forms (refused missing, forged, or another
//! signed-in session's, on every form), the idle lifetime, and signing out everywhere.

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

/// Every form the dashboard takes by POST, with a value for each field (the handlers read them
/// only after the token): the router's paths, a `{id}` filled in by the test.
const FORMS: [(&str, &[(&str, &str)]); 17] = [
    (
        "/developers/sign-up",
        &[("email", "x@example.com"), ("password", PASSWORD)],
    ),
    (
        "/developers/sign-in",
        &[("email", "x@example.com"), ("password", PASSWORD)],
    ),
    ("/developers/sign-out", &[]),
    ("/developers/sign-out-everywhere", &[]),
    (
        "/developers/keys",
        &[("name", "forged-key"), ("kind", "api")],
    ),
    ("/developers/keys/{id}/revoke", &[]),
    ("/developers/billing/checkout", &[("amount", "25")]),
    (
        "/developers/billing/auto-reload",
        &[("enabled", "on"), ("threshold", "10"), ("amount", "25")],
    ),
    (
        "/developers/members/invite",
        &[("email", "y@example.com"), ("role", "admin")],
    ),
    ("/developers/members/{id}/role", &[("role", "viewer")]),
    ("/developers/members/{id}/remove", &[("revoke_keys", "on")]),
    ("/developers/members/invitations/{id}/withdraw", &[]),
    (
        "/developers/members/domains",
        &[("domain", "example.com"), ("require_sso", "on")],
    ),
    (
        "/developers/members/domains/release",
        &[("domain", "example.com")],
    ),
    (
        "/developers/members/domains/verify",
        &[("domain", "example.com")],
    ),
    (
        "/developers/members/domains/mail",
        &[("domain", "example.com"), ("email", "it@example.com")],
    ),
    ("/developers/invitations/accept", &[("token", "tok")]),
];

/// The POST routes of the dashboard's router (gateway/src/dashboard/mod.rs), its constants
/// resolved: a form added there and not to [`FORMS`] fails the test below.
fn routed_posts() -> Vec<String> {
    let router = std::fs::read_to_string(
        e2e::gateway::workspace_root().join("gateway/src/dashboard/mod.rs"),
    )
    .expect("the dashboard's router");
    let mut posts: Vec<String> = router
        .split(".route(")
        .skip(1)
        .filter(|route| {
            route
                .split(".route(")
                .next()
                .is_some_and(|r| r.contains("post("))
        })
        .map(|route| {
            let path = route.split(',').next().expect("a path").trim();
            match path {
                "mail::VERIFY_PATH" => "/developers/verify-email".to_owned(),
                "mail::INVITATION_PATH" => "/developers/invitations/accept".to_owned(),
                "mail::DOMAIN_PROOF_PATH" => "/developers/domains/prove".to_owned(),
                quoted => quoted.trim_matches('"').to_owned(),
            }
        })
        // The catch-all's 404; and the email's and a domain's confirmations, whose only input
        // is the mailed link's token, the secret a forger would need (they sign no one in).
        .filter(|path| {
            ![
                "/developers/{*rest}",
                "/developers/verify-email",
                "/developers/domains/prove",
            ]
            .contains(&path.as_str())
        })
        .collect();
    posts.sort();
    posts
}

/// A form posted with a token that is valid, but another signed-in user's (their session's
/// token, or the sign-in forms' cookie token of their browser), is refused on every form the
/// dashboard has, and changes nothing: no key, no revocation, no invitation, no session
/// ended, no audit entry.
#[tokio::test]
async fn a_form_carrying_another_signed_in_sessions_valid_token_is_refused_on_every_form() {
    let pg = PostgresServer::start().await;
    let cluster = dashboard(&pg, |b| b).await;
    let gw = &cluster.pods[0];
    let mut listed: Vec<String> = FORMS.iter().map(|(p, _)| (*p).to_owned()).collect();
    listed.sort();
    assert_eq!(
        listed,
        routed_posts(),
        "every POST route of the dashboard is tried"
    );

    let (email, other_email) = (new_email(), new_email());
    let mut owner = Visitor::new(gw);
    owner.sign_up(&email, &[]).await;
    let mut other = Visitor::new(gw);
    other.sign_up(&other_email, &[]).await;
    let (status, page) = owner.create_key("the-owners-key").await;
    assert_eq!(status, 200, "{page}");
    let key_id = pg
        .query(&format!(
            "SELECT k.id FROM api_keys k JOIN dashboard_users u ON u.account_id = k.account_id
             WHERE u.email = '{email}' AND k.name = 'the-owners-key'"
        ))
        .await;
    let user_id = pg
        .query(&format!(
            "SELECT id FROM dashboard_users WHERE email = '{email}'"
        ))
        .await;
    // The other's tokens, valid in the other's browser: its session's (every page's forms)
    // and its browser's cookie token (the sign-in forms).
    let (_, page) = other.get("/developers/keys").await;
    let others_session_token = hidden_csrf(&page);
    let (_, page) = other.get("/developers/sign-in").await;
    let others_cookie_token = hidden_csrf(&page);
    let (_, page) = owner.get("/developers/keys").await;
    assert_ne!(
        hidden_csrf(&page),
        others_session_token,
        "two sessions, two tokens"
    );

    let state = || async {
        pg.query(&format!(
            "SELECT (SELECT count(*) FROM api_keys k JOIN dashboard_users u
                         ON u.account_id = k.account_id WHERE u.email = '{email}') || ' keys, '
                 || (SELECT count(*) FROM api_keys WHERE id = '{key_id}' AND revoked_at IS NULL)
                 || ' unrevoked, ' || (SELECT count(*) FROM audit_log) || ' audit entries'"
        ))
        .await
    };
    let before = state().await;
    let sessions_before = sessions_of(&pg, &email).await;
    let mut refused = 0;
    for (path, fields) in FORMS {
        let path = path.replace(
            "{id}",
            if path.contains("keys") {
                &key_id
            } else {
                &user_id
            },
        );
        let pre_session = ["/developers/sign-up", "/developers/sign-in"].contains(&path.as_str());
        let token = if pre_session {
            &others_cookie_token
        } else {
            &others_session_token
        };
        let mut form = fields.to_vec();
        form.push(("csrf", token));
        let (status, page, _) = owner.post(&path, &form, &[]).await;
        assert_eq!(status, 403, "{path} with another session's token: {page}");
        assert!(
            page.contains("form has expired"),
            "{path}: refused as a forged form, not for another reason: {page}"
        );
        refused += 1;
    }
    assert_eq!(refused, FORMS.len());
    assert_eq!(state().await, before, "nothing changed");
    assert_eq!(sessions_of(&pg, &email).await, sessions_before);
    assert!(signed_in(&mut owner).await, "no session was ended");
    assert!(signed_in(&mut other).await);
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
