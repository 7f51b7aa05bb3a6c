//! Sign-up proves the email before the account is worth anything: a sign-up answers alike
//! whatever the email and mails a verification link (or, for an email with a verified account,
//! a notice to its owner); until the link is followed the account takes no keys and no
//! credits, from its user or the operator; following it verifies the email with the password
//! of the sign-up that asked for it, once. A stranger's wrong passwords never lock the owner
//! out from their own address. The mails are read from the gateway's log (no mail server).

use std::time::Duration;

use e2e::visitor::{
    hidden_csrf, mails_to, new_email, verification_link, Visitor, PASSWORD, VERIFY_PATH,
};
use e2e::*;
use serde_json::json;
use store::accounts::KeyHash;
use store::db::Database;
use store::developers::{DeveloperStore, PostgresDeveloperStore};

/// The squatter's password: not the owner's.
const SQUATTER_PASSWORD: &str = "squatter's own password";

/// Submits the sign-up form with `password`: the status, the page, the Set-Cookie lines.
async fn sign_up_with(
    visitor: &mut Visitor<'_>,
    email: &str,
    password: &str,
) -> (u16, String, Vec<String>) {
    let (_, form) = visitor.get("/developers/sign-up").await;
    let csrf = hidden_csrf(&form);
    visitor
        .post(
            "/developers/sign-up",
            &[("csrf", &csrf), ("email", email), ("password", password)],
            &[],
        )
        .await
}

fn signed_in(cookies: &[String]) -> bool {
    cookies.iter().any(|c| c.starts_with("svc_session="))
}

#[tokio::test]
async fn sign_up_answers_alike_whatever_the_email_and_mails_the_owner_instead_of_telling() {
    let gw = Gateway::start().await;
    let taken = new_email();
    Visitor::new(&gw).sign_up(&taken, &[]).await;

    let fresh = new_email();
    let (new_status, new_page, new_cookies) =
        sign_up_with(&mut Visitor::new(&gw), &fresh, PASSWORD).await;
    let (old_status, old_page, old_cookies) =
        sign_up_with(&mut Visitor::new(&gw), &taken, SQUATTER_PASSWORD).await;
    assert_eq!((new_status, old_status), (200, 200), "{old_page}");
    assert_eq!(
        new_page.replace(&fresh, "EMAIL"),
        old_page.replace(&taken, "EMAIL"),
        "the same page for a taken email as for a new one"
    );
    assert!(!signed_in(&new_cookies) && !signed_in(&old_cookies));

    // The owner is told; nothing changed: their password works, the stranger's does not.
    let mails = mails_to(&gw, &taken);
    assert!(
        mails
            .last()
            .is_some_and(|m| m.contains("You already have an account")),
        "{mails:?}"
    );
    assert!(!mails.last().is_some_and(|m| m.contains(VERIFY_PATH)));
    let (status, _) = Visitor::new(&gw).sign_in(&taken, SQUATTER_PASSWORD).await;
    assert_eq!(status, 401);
    let (status, _) = Visitor::new(&gw).sign_in(&taken, PASSWORD).await;
    assert_eq!(status, 303);
}

#[tokio::test]
async fn an_unverified_account_takes_no_keys_or_top_ups_and_the_owners_link_takes_the_email_back() {
    let gw = Gateway::start().await;
    let email = format!("ceo@{}.example", gateway::unique_name("bigcustomer"));

    // A squatter signs up with the CEO's email and signs in: the dashboard asks to verify.
    let mut squatter = Visitor::new(&gw);
    let (status, page, cookies) = sign_up_with(&mut squatter, &email, SQUATTER_PASSWORD).await;
    assert_eq!(status, 200, "{page}");
    assert!(!signed_in(&cookies), "sign-up signs nobody in");
    let (status, _) = squatter.sign_in(&email, SQUATTER_PASSWORD).await;
    assert_eq!(status, 303);
    for path in ["/developers", "/developers/keys", "/developers/billing"] {
        let (status, page) = squatter.get(path).await;
        assert_eq!(status, 200, "{path}");
        assert!(page.contains("Verify your email"), "{path}: {page}");
        assert!(
            !page.contains("acct_"),
            "{path} shows nothing of the account: {page}"
        );
    }
    let csrf = hidden_csrf(&squatter.get("/developers").await.1);
    let (status, page, _) = squatter
        .post(
            "/developers/keys",
            &[("csrf", &csrf), ("name", "squat"), ("kind", "api")],
            &[],
        )
        .await;
    assert_eq!(status, 403, "{page}");
    assert!(!page.contains("sk-svc-"), "no key was minted: {page}");
    let (status, page, _) = squatter
        .post(
            "/developers/billing/checkout",
            &[("csrf", &csrf), ("amount", "25")],
            &[],
        )
        .await;
    assert_eq!(status, 403, "no self-service top-up either: {page}");

    // The owner signs up with their own password and follows their link: the email is theirs,
    // with their password, and the squatter's session and password are gone.
    let mut owner = Visitor::new(&gw);
    let (status, _, _) = sign_up_with(&mut owner, &email, PASSWORD).await;
    assert_eq!(status, 200);
    let (status, page) = owner.verify_email(&email).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Your email is confirmed"), "{page}");
    let (status, _) = squatter.get("/developers").await;
    assert_eq!(status, 303, "the squatter's session ended");
    let (status, _) = Visitor::new(&gw).sign_in(&email, SQUATTER_PASSWORD).await;
    assert_eq!(status, 401);
    let (status, _) = owner.sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303);
    let (_, page) = owner.get("/developers").await;
    assert!(page.contains("id=\"account-id\""), "{page}");

    // A link works once.
    let (status, page) = owner.verify_email(&email).await;
    assert_eq!(status, 410, "{page}");
}

#[tokio::test]
async fn the_admin_api_gives_no_key_or_top_up_to_an_account_whose_email_is_unverified() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    let email = new_email();
    let (status, _, _) = sign_up_with(&mut Visitor::new(gw), &email, SQUATTER_PASSWORD).await;
    assert_eq!(status, 200);
    let account_id = pg
        .query(&format!(
            "SELECT account_id FROM dashboard_users WHERE email = '{email}'"
        ))
        .await;
    assert!(account_id.starts_with("acct_"), "{account_id}");
    let key = gw
        .admin_post(
            "/admin/keys",
            &json!({ "account_id": account_id, "tier": "enterprise" }),
        )
        .await;
    assert_eq!(key.status, 409, "{}", key.text);
    let top_up = gw
        .admin_post(
            &format!("/admin/accounts/{account_id}/topups"),
            &json!({ "usd_cents": 10_000, "reference": "pay_squat" }),
        )
        .await;
    assert_eq!(top_up.status, 409, "{}", top_up.text);
    assert_eq!(
        pg.query(&format!(
            "SELECT count(*) FROM api_keys WHERE account_id = '{account_id}'"
        ))
        .await,
        "0"
    );

    Visitor::new(gw).verify_email(&email).await;
    let key = gw
        .admin_post("/admin/keys", &json!({ "account_id": account_id }))
        .await;
    assert_eq!(key.status, 201, "{}", key.text);
}

#[tokio::test]
async fn sign_up_credits_lost_to_a_crash_after_the_confirmation_are_added_at_sign_in_once() {
    const CREDITS: &str = "500";
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url()).env("GATEWAY_SIGNUP_CREDITS", CREDITS)
    })
    .await;
    let gw = &cluster.pods[0];
    let email = new_email();
    let (status, _, _) = sign_up_with(&mut Visitor::new(gw), &email, PASSWORD).await;
    assert_eq!(status, 200);
    let balance = || async {
        pg.query(&format!(
            "SELECT a.balance FROM accounts a JOIN dashboard_users u ON u.account_id = a.id \
             WHERE u.email = '{email}'"
        ))
        .await
    };
    // The confirmation commits (the store's own statement, as a pod runs it) and the pod stops
    // before it adds the credits.
    let link = verification_link(gw, &email).await;
    let token = &link[link.find("token=").expect("a token") + "token=".len()..];
    let db = Database::connect(&pg.url(), 1, Duration::from_secs(5)).expect("database url");
    let verified = PostgresDeveloperStore::new(db)
        .verify_email(&KeyHash::of(token), None)
        .await
        .expect("verified");
    assert!(verified.is_some(), "the link verified nobody");
    assert_eq!(balance().await, "0");

    // The first sign-in adds what the confirmation could not; the next ones, nothing.
    for _ in 0..3 {
        let (status, page) = Visitor::new(gw).sign_in(&email, PASSWORD).await;
        assert_eq!(status, 303, "{page}");
        assert_eq!(balance().await, CREDITS);
    }
    let (status, _) = Visitor::new(gw).verify_email(&email).await;
    assert_eq!(status, 410, "a spent link");
    assert_eq!(balance().await, CREDITS);
}

#[tokio::test]
async fn a_strangers_wrong_passwords_never_lock_the_owner_out_from_their_own_address() {
    let gw = Gateway::builder()
        .arg("--trusted-proxies")
        .arg("127.0.0.1")
        .start()
        .await;
    let email = new_email();
    Visitor::new(&gw).sign_up(&email, &[]).await;
    let stranger = [("x-forwarded-for", "203.0.113.66")];
    let mut guesser = Visitor::new(&gw);
    for _ in 0..5 {
        let (status, _) = guesser
            .sign_in_with(&email, "wrong password!", &stranger)
            .await;
        assert_eq!(status, 401);
    }
    let (status, body) = guesser.sign_in_with(&email, PASSWORD, &stranger).await;
    assert_eq!(status, 429, "the stranger's address is held back: {body}");

    let owner = [("x-forwarded-for", "198.51.100.20")];
    let (status, body) = Visitor::new(&gw)
        .sign_in_with(&email, PASSWORD, &owner)
        .await;
    assert_eq!(
        status, 303,
        "the owner signs in from their own address: {body}"
    );
}
