//! The developer dashboard, driven in a real headless chromium: a developer signs up, mints a
//! key, calls /v1/messages with it through the official `anthropic` SDK, sees the call in the
//! usage chart and table, tops up $25 with the test payment provider, revokes the key and sees
//! the next call refused with 401. Bad input (wrong password, a forged CSRF token, $9,
//! $10,001, a second tab revoking the same key) gets a clear message and changes nothing.
//! Screenshots of every page at desktop and phone width go to docs/screenshots/. Cluster mode
//! serves the same dashboard, with its users and sessions shared by every pod through Postgres.

use std::path::PathBuf;

use e2e::browser::{Browser, DESKTOP, PHONE};
use e2e::gateway::{unique_name, workspace_root};
use e2e::sdk::sdk_call;
use e2e::visitor::{
    hidden_csrf, mails_to, new_email, thousands, verification_link, Visitor, PASSWORD,
};
use e2e::*;
use serde_json::Value;

const SIGNUP_CREDITS: u64 = 100_000;

fn screenshots() -> PathBuf {
    workspace_root().join("docs").join("screenshots")
}

async fn shoot(b: &Browser, name: &str) {
    b.screenshot(&screenshots(), name, "desktop", DESKTOP).await;
    b.screenshot(&screenshots(), name, "phone", PHONE).await;
}

async fn balance_on(b: &Browser, page: &str) -> String {
    b.goto(page).await;
    b.text("#balance").await
}

#[tokio::test]
async fn a_developer_signs_up_mints_a_key_calls_the_api_sees_usage_tops_up_and_revokes_the_key() {
    let gw = Gateway::builder()
        .arg("--signup-credits")
        .arg(&SIGNUP_CREDITS.to_string())
        .start()
        .await;
    let b = Browser::start().await;
    let base = format!("{}/developers", gw.api);
    let email = format!("{}@example.com", unique_name("dev"));

    // Signed out, every page leads to sign-in.
    b.goto(&format!("{base}/keys")).await;
    b.wait_for_path("/developers/sign-in").await;
    shoot(&b, "sign-in").await;

    b.click_and_load("a[href='/developers/sign-up']").await;
    b.fill("#email", &email).await;
    b.fill("#password", PASSWORD).await;
    shoot(&b, "sign-up").await;
    b.click_and_load("button[type=submit]").await;
    assert!(b.text(".notice").await.contains("Follow its link"));
    b.verify_and_sign_in(&gw, &email, PASSWORD).await;
    assert_eq!(b.text("#balance").await, thousands(SIGNUP_CREDITS));
    assert_eq!(b.text("#tier").await, "free");

    // Mint: the secret is shown once, only its prefix afterwards.
    b.goto(&format!("{base}/keys")).await;
    b.fill("#key-name", "dashboard e2e").await;
    b.click_and_load("#mint").await;
    let secret = b.value("#new-secret").await;
    assert!(secret.starts_with("sk-svc-"), "{secret}");
    shoot(&b, "keys-minted").await;
    b.goto(&format!("{base}/keys")).await;
    let listed = b.text("#keys").await;
    assert!(
        listed.contains("dashboard e2e") && listed.contains(&secret[..12]),
        "{listed}"
    );
    assert!(!b.client.source().await.expect("source").contains(&secret));

    // A call through the official SDK shows up on the overview and the usage page, with the
    // numbers of GET /v1/usage.
    let message_id = sdk_call(&gw.api, &secret)
        .await
        .expect("SDK call with the new key");
    b.goto(&base).await;
    assert!(b.text("#recent-messages").await.contains(&message_id));
    shoot(&b, "overview").await;
    let usage: Value = gw
        .client()
        .get(format!("{}/v1/usage", gw.api))
        .bearer_auth(&secret)
        .send()
        .await
        .expect("GET /v1/usage")
        .json()
        .await
        .expect("usage JSON");
    let credits = usage["totals"]["credits"].as_u64().expect("credits");
    assert_eq!(usage["totals"]["requests"], 1, "{usage}");
    b.goto(&format!("{base}/usage")).await;
    assert_eq!(b.text("#total-requests").await, "1");
    assert_eq!(b.text("#total-credits").await, thousands(credits));
    assert_eq!(
        b.text("#total-batch-credits").await,
        thousands(
            usage["totals"]["batch_credits"]
                .as_u64()
                .expect("batch credits")
        )
    );
    assert_eq!(
        b.text("#total-output").await,
        thousands(usage["totals"]["output_tokens"].as_u64().expect("output"))
    );
    let table = b.text("#usage-table").await;
    assert!(table.contains("svc/haiku"), "{table}");
    let bars = b
        .client
        .find_all(fantoccini::Locator::Css("#credits-chart rect"))
        .await
        .expect("bars");
    assert_eq!(bars.len(), 1, "one day, one model: one bar segment");
    assert!(b.text(".legend").await.contains("svc/haiku"));
    shoot(&b, "usage").await;
    let after_call = SIGNUP_CREDITS - credits;

    // Billing: amounts out of range are refused with the range, and nothing changes.
    let billing = format!("{base}/billing");
    b.goto(&billing).await;
    for (amount, says) in [("9", "below the minimum"), ("10001", "above the maximum")] {
        b.fill("#amount", amount).await;
        b.click_and_load("#custom-checkout").await;
        let notice = b.text(".notice.error").await;
        assert!(
            notice.contains(says) && notice.contains("from $10 to $10,000"),
            "{notice}"
        );
        assert_eq!(b.text("#balance").await, thousands(after_call));
    }
    // A forged CSRF token is refused and changes nothing.
    b.goto(&billing).await;
    b.client
        .execute(
            "document.querySelectorAll('input[name=csrf]').forEach(i => i.value = 'forged')",
            vec![],
        )
        .await
        .expect("forge the token");
    b.click_and_load("#pack-25").await;
    assert!(b.text(".notice.error").await.contains("form has expired"));
    assert_eq!(balance_on(&b, &billing).await, thousands(after_call));

    // $25 through the test provider: balance, history and tier change.
    b.click_and_load("#pack-25").await;
    assert!(b
        .text(".notice.success")
        .await
        .contains("Payment of $25 confirmed"));
    let topped_up = after_call + 25 * 100_000;
    assert_eq!(b.text("#balance").await, thousands(topped_up));
    let history = b.text("#top-ups").await;
    assert!(
        history.contains("$25") && history.contains("confirmed"),
        "{history}"
    );
    shoot(&b, "billing").await;
    b.goto(&base).await;
    assert_eq!(b.text("#lifetime").await, "$25");
    assert_eq!(b.text("#tier").await, "pay_as_you_go");

    // Revoke, with a second tab revoking the same key.
    b.goto(&format!("{base}/keys")).await;
    b.click_and_load("a.danger-link").await;
    let confirm_url = b.client.current_url().await.expect("url").to_string();
    shoot(&b, "revoke-confirm").await;
    let first = b.client.window().await.expect("window");
    let second = b.client.new_window(true).await.expect("new tab").handle;
    b.client.switch_to_window(second).await.expect("switch");
    b.goto(&confirm_url).await;
    b.client
        .switch_to_window(first.clone())
        .await
        .expect("switch back");
    b.click_and_load("#confirm-revoke").await;
    assert!(b.text(".notice.success").await.contains("revoked"));
    assert!(b.text("#keys").await.contains("revoked"));
    let others = b.client.windows().await.expect("windows");
    let second = others
        .into_iter()
        .find(|w| *w != first)
        .expect("second tab");
    b.client.switch_to_window(second).await.expect("switch");
    b.click_and_load("#confirm-revoke").await;
    assert!(b.text(".notice.error").await.contains("already revoked"));
    shoot(&b, "keys").await;

    assert_eq!(sdk_call(&gw.api, &secret).await, Err(401));

    // Sign out; a wrong password is refused with a clear message.
    b.click_and_load(".account button[type=submit]").await;
    b.wait_for_path("/developers/sign-in").await;
    b.fill("#email", &email).await;
    b.fill("#password", "not the password").await;
    b.click_and_load("button[type=submit]").await;
    assert_eq!(b.text(".notice.error").await, "Wrong email or password.");
    b.fill("#password", PASSWORD).await;
    b.click_and_load("button[type=submit]").await;
    b.wait_for_path("/developers").await;

    // The audit log shows what the journey changed, the refused sign-in included.
    b.goto(&format!("{base}/audit")).await;
    let log = b.text("#audit-log").await;
    for action in ["sign_in_failed", "key_created", "key_revoked", "top_up"] {
        assert!(log.contains(action), "{action}: {log}");
    }
    shoot(&b, "audit").await;
    b.quit().await;
}

#[tokio::test]
async fn the_session_cookie_is_http_only_same_site_and_secure_when_the_request_came_over_tls() {
    let gw = Gateway::start().await;
    let over_tls = Visitor::new(&gw)
        .sign_up(&new_email(), &[("x-forwarded-proto", "https")])
        .await;
    let session = over_tls
        .iter()
        .find(|c| c.starts_with("svc_session="))
        .expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Lax", "Secure", "Path=/developers"] {
        assert!(
            session.contains(attribute),
            "{attribute} missing: {session}"
        );
    }
    let plain = Visitor::new(&gw).sign_up(&new_email(), &[]).await;
    let session = plain
        .iter()
        .find(|c| c.starts_with("svc_session="))
        .expect("a session cookie");
    assert!(!session.contains("Secure"), "{session}");
}

/// The headers every dashboard page must carry.
fn assert_page_headers(path: &str, headers: &reqwest::header::HeaderMap) {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("{path}: no {name} header"))
            .to_string()
    };
    let csp = get("content-security-policy");
    assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
    assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
    assert_eq!(get("referrer-policy"), "no-referrer", "{path}");
    assert_eq!(get("cache-control"), "no-store", "{path}");
}

#[tokio::test]
async fn dashboard_pages_forbid_framing_scripts_referrers_and_caching_the_new_secret() {
    let gw = Gateway::start().await;
    let http = gw.client();
    for path in ["/developers/sign-in", "/developers/sign-up"] {
        let response = http.get(gw.url(path)).send().await.expect("GET");
        assert_page_headers(path, response.headers());
    }
    let mut visitor = Visitor::new(&gw);
    visitor.sign_up(&new_email(), &[]).await;
    let (_, page) = visitor.get("/developers/keys").await;
    let csrf = hidden_csrf(&page);
    let response = http
        .post(gw.url("/developers/keys"))
        .header("cookie", visitor.cookie_header())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&name=secret-page&kind=api"))
        .send()
        .await
        .expect("POST");
    let headers = response.headers().clone();
    let body = response.text().await.expect("body");
    assert!(
        body.contains("sk-svc-"),
        "the page shows the new key: {body}"
    );
    assert_page_headers("POST /developers/keys", &headers);
}

#[tokio::test]
async fn sign_in_is_refused_for_a_while_after_five_wrong_passwords_for_the_email() {
    let gw = Gateway::start().await;
    let email = new_email();
    Visitor::new(&gw).sign_up(&email, &[]).await;
    let mut visitor = Visitor::new(&gw);
    for _ in 0..5 {
        let (status, body) = visitor.sign_in(&email, "wrong password!").await;
        assert_eq!(status, 401);
        assert!(body.contains("Wrong email or password."));
    }
    let (status, body) = visitor.sign_in(&email, PASSWORD).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("Too many failed sign-ins"), "{body}");
    assert!(!visitor.cookies.iter().any(|(k, _)| k == "svc_session"));
    // The 429 says when to come back: within the failures' window (15 minutes).
    let (_, form) = visitor.get("/developers/sign-in").await;
    let csrf = hidden_csrf(&form);
    let response = gw
        .client()
        .post(gw.url("/developers/sign-in"))
        .header("cookie", visitor.cookie_header())
        .form(&[
            ("csrf", csrf.as_str()),
            ("email", email.as_str()),
            ("password", PASSWORD),
        ])
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After of seconds on the lockout's 429");
    assert!((1..=15 * 60).contains(&retry_after), "{retry_after}");
}

#[tokio::test]
async fn of_40_concurrent_wrong_passwords_for_one_email_from_one_address_at_most_5_are_checked_and_the_right_one_is_then_refused_there(
) {
    // From one client address allowed 100 attempts a minute, so that only the email's
    // throttle at that address applies.
    let gw = Gateway::builder()
        .arg("--trusted-proxies")
        .arg("127.0.0.1")
        .arg("--sign-ins-per-minute")
        .arg("100")
        .start()
        .await;
    let email = new_email();
    Visitor::new(&gw).sign_up(&email, &[]).await;
    let guesser = [("x-forwarded-for", "203.0.113.1")];
    let attempts = (0..40).map(|_| {
        let email = email.clone();
        let gw = &gw;
        async move {
            Visitor::new(gw)
                .sign_in_with(&email, "wrong password!", &guesser)
                .await
                .0
        }
    });
    let statuses = futures::future::join_all(attempts).await;
    let checked = statuses.iter().filter(|&&s| s == 401).count();
    assert!(
        checked <= 5,
        "{checked} wrong passwords were checked: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|&s| s == 401 || s == 429),
        "{statuses:?}"
    );
    let mut visitor = Visitor::new(&gw);
    let (status, body) = visitor.sign_in_with(&email, PASSWORD, &guesser).await;
    assert_eq!(status, 429, "{body}");
    assert!(!visitor.cookies.iter().any(|(k, _)| k == "svc_session"));
}

/// A gateway that takes loopback for a proxy it trusts, so tests can speak for many clients
/// through `X-Forwarded-For`.
async fn behind_a_trusted_proxy() -> Gateway {
    Gateway::builder()
        .arg("--trusted-proxies")
        .arg("127.0.0.1")
        .start()
        .await
}

/// The README's default: sign-in attempts per client address and minute.
const SIGN_INS_PER_MINUTE: usize = 10;

#[tokio::test]
async fn sign_ins_from_one_client_address_are_throttled_across_pods_whatever_the_email() {
    let cluster = Cluster::start(2, |b| b.arg("--trusted-proxies").arg("127.0.0.1")).await;
    // Every attempt of the burst must land in one window.
    cluster.pods[0]
        .wait_for_roomy_window(cluster::PAYG.secret, 20)
        .await;
    let from = |client: &'static str| [("x-forwarded-for", client)];
    let guesser = from("203.0.113.5");
    for n in 0..SIGN_INS_PER_MINUTE {
        let (status, body) = Visitor::new(cluster.pod(n))
            .sign_in_with(&new_email(), "one password for all", &guesser)
            .await;
        assert_eq!(status, 401, "attempt {n}: {body}");
        assert!(body.contains("Wrong email or password."), "{body}");
    }
    for (i, pod) in cluster.pods.iter().enumerate() {
        let (status, body) = Visitor::new(pod)
            .sign_in_with(&new_email(), "one password for all", &guesser)
            .await;
        assert_eq!(status, 429, "pod {i}: {body}");
        assert!(
            body.contains("Too many sign-in attempts from your network") && mentions_seconds(&body),
            "{body}"
        );
    }
    // Another client behind the same proxy is not held up.
    let (status, body) = Visitor::new(&cluster.pods[1])
        .sign_in_with(&new_email(), "some password", &from("203.0.113.6"))
        .await;
    assert_eq!(status, 401, "{body}");
}

/// The README's default: sign-ups per client address and minute.
const SIGN_UPS_PER_MINUTE: usize = 3;

#[tokio::test]
async fn sign_ups_from_one_client_address_are_throttled_across_pods_before_any_account_is_made() {
    let cluster = Cluster::start(2, |b| b.arg("--trusted-proxies").arg("127.0.0.1")).await;
    cluster.pods[0]
        .wait_for_roomy_window(cluster::PAYG.secret, 20)
        .await;
    let from = |client: &'static str| [("x-forwarded-for", client)];
    let minter = from("203.0.113.7");
    for n in 0..SIGN_UPS_PER_MINUTE {
        let (status, body, _) = Visitor::new(cluster.pod(n))
            .try_sign_up(&new_email(), &minter)
            .await;
        assert_eq!(status, 200, "sign-up {n}: {body}");
    }
    for (i, pod) in cluster.pods.iter().enumerate() {
        let email = new_email();
        let (status, body, cookies) = Visitor::new(pod).try_sign_up(&email, &minter).await;
        assert_eq!(status, 429, "pod {i}: {body}");
        assert!(
            body.contains("Too many sign-ups from your network") && mentions_seconds(&body),
            "{body}"
        );
        assert!(
            !cookies.iter().any(|c| c.starts_with("svc_session=")),
            "a refused sign-up was signed in: {cookies:?}"
        );
        // Nothing was made or mailed for it: another client's sign-up gets the first link.
        assert!(
            mails_to(pod, &email).is_empty(),
            "the refused sign-up mailed"
        );
        let (status, body, _) = Visitor::new(pod)
            .try_sign_up(&email, &from("203.0.113.8"))
            .await;
        assert_eq!(status, 200, "{body}");
        verification_link(pod, &email).await;
    }
}

#[tokio::test]
async fn memory_stays_bounded_under_150_concurrent_sign_ins_for_unknown_emails() {
    // 150 clients (each its own address), so that no per-client throttle refuses any.
    let gw = behind_a_trusted_proxy().await;
    let before = gw.peak_rss();
    let attempts = (0..150).map(|i| {
        let gw = &gw;
        async move {
            let client = format!("198.18.0.{}", i + 1);
            Visitor::new(gw)
                .sign_in_with(
                    &new_email(),
                    "some password",
                    &[("x-forwarded-for", &client)],
                )
                .await
                .0
        }
    });
    let statuses = futures::future::join_all(attempts).await;
    assert!(statuses.iter().all(|&s| s == 401), "{statuses:?}");
    let grown = gw.peak_rss().saturating_sub(before);
    eprintln!(
        "benchmark: peak RSS grew by {} MiB over 150 concurrent sign-ins",
        grown / (1024 * 1024)
    );
    // Each argon2 check takes 19 MiB; unbounded, 150 at once took the process to 921 MB.
    assert!(
        grown < 256 * 1024 * 1024,
        "peak RSS grew by {} MiB",
        grown / (1024 * 1024)
    );
}

#[tokio::test]
async fn a_form_without_the_sessions_csrf_token_is_refused_and_changes_nothing() {
    let gw = Gateway::start().await;
    let mut visitor = Visitor::new(&gw);
    visitor.sign_up(&new_email(), &[]).await;
    for (path, form) in [
        (
            "/developers/keys",
            vec![("name", "forged"), ("kind", "api")],
        ),
        ("/developers/billing/checkout", vec![("amount", "25")]),
    ] {
        let mut fields = form.clone();
        fields.push(("csrf", "forged-token"));
        let (status, body, _) = visitor.post(path, &fields, &[]).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("form has expired"), "{body}");
        let (status, body, _) = visitor.post(path, &form, &[]).await;
        assert_eq!(status, 403, "{path} without a token: {body}");
    }
    let (_, keys) = visitor.get("/developers/keys").await;
    assert!(!keys.contains("forged"), "no key was minted");
    let (_, billing) = visitor.get("/developers/billing").await;
    assert!(billing.contains("No top-ups yet."));
}

#[tokio::test]
async fn malformed_dashboard_requests_get_a_page_with_a_4xx_never_a_500() {
    let gw = Gateway::start().await;
    let mut visitor = Visitor::new(&gw);
    visitor.sign_up(&new_email(), &[]).await;
    let (_, page) = visitor.get("/developers/keys").await;
    let csrf = hidden_csrf(&page);
    for path in [
        "/developers/sign-in",
        "/developers/sign-up",
        "/developers/keys",
        "/developers/keys/key_nope/revoke",
        "/developers/billing/checkout",
    ] {
        let (status, body, _) = visitor
            .post(
                path,
                &[("csrf", &csrf), ("amount", "%ZZ"), ("scope", "root")],
                &[],
            )
            .await;
        assert!((400..500).contains(&status), "{path}: {status} {body}");
        assert!(body.contains("<html"), "{path}: an HTML page, not {body}");
    }
    let (status, body, _) = visitor
        .post(
            "/developers/keys",
            &[("csrf", &csrf), ("name", "a"), ("name", "b")],
            &[],
        )
        .await;
    assert_eq!(status, 400, "a field given twice: {body}");
    assert!(body.contains("could not be read"), "{body}");
    for path in [
        "/developers/usage?start_date=yesterday",
        "/developers/usage?start_date=2026-02-01&end_date=2026-01-01",
        "/developers/keys/key_nope/revoke",
        "/developers/no-such-page",
    ] {
        let (status, body) = visitor.get(path).await;
        assert!((400..500).contains(&status), "{path}: {status} {body}");
        assert!(!body.contains("panicked"), "{body}");
    }
}

#[tokio::test]
async fn cluster_mode_serves_the_dashboard_and_refuses_top_ups_without_a_payment_provider() {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder().serve(&redis.url()).start().await;
    let mut visitor = Visitor::new(&gw);
    visitor.sign_up(&new_email(), &[]).await;
    let (status, page) = visitor.get("/developers/billing").await;
    assert_eq!(status, 200);
    let csrf = hidden_csrf(&page);
    let (status, body, _) = visitor
        .post(
            "/developers/billing/checkout",
            &[("csrf", &csrf), ("amount", "25")],
            &[],
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no payment provider is configured"), "{body}");
    let (_, billing) = visitor.get("/developers/billing").await;
    assert!(billing.contains("failed") && !billing.contains("confirmed"));
}

#[tokio::test]
async fn in_cluster_mode_a_sign_up_on_one_pod_is_signed_in_on_every_pod_through_postgres() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(2, |b| b.database(&pg.url())).await;
    let email = new_email();
    let mut first = Visitor::new(&cluster.pods[0]);
    first.sign_up(&email, &[]).await;

    let mut second = Visitor::new(&cluster.pods[1]);
    second.cookies = first.cookies.clone();
    let (status, page) = second.get("/developers").await;
    assert_eq!(status, 200, "the session is known to the other pod");
    assert!(page.contains(&email), "{page}");

    let mut fresh = Visitor::new(&cluster.pods[1]);
    let (status, _) = fresh.sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303, "the user signs in on the other pod");
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM dashboard_users").await,
        1
    );

    // Failed sign-ins count across pods: five on one, the next on the other is throttled.
    let mut guesser = Visitor::new(&cluster.pods[0]);
    for _ in 0..5 {
        let (status, _) = guesser.sign_in(&email, "wrong password!").await;
        assert_eq!(status, 401);
    }
    let (status, body) = Visitor::new(&cluster.pods[1])
        .sign_in(&email, PASSWORD)
        .await;
    assert_eq!(status, 429, "{body}");
}

#[tokio::test]
async fn the_keys_page_mints_a_key_with_an_expiry_and_a_monthly_cap_but_never_a_tier() {
    let gw = Gateway::start().await;
    let mut visitor = Visitor::new(&gw);
    visitor.sign_up(&new_email(), &[]).await;
    let (_, page) = visitor.get("/developers/keys").await;
    assert!(!page.contains("name=\"tier\""), "the form offers no tier");
    let csrf = hidden_csrf(&page);
    let (status, page, _) = visitor
        .post(
            "/developers/keys",
            &[
                ("csrf", &csrf),
                ("name", "capped"),
                ("kind", "api"),
                ("expires_in_days", "30"),
                ("spend_cap", "5000"),
                // A forged field: tiers follow top-ups only.
                ("tier", "high_volume"),
            ],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let expected = (time::OffsetDateTime::now_utc() + time::Duration::days(30)).date();
    let row = page
        .split("<tr data-key-id=")
        .nth(1)
        .expect("the key's row");
    assert!(row.contains(&expected.to_string()), "expiry shown: {row}");
    assert!(row.contains("0 of 5,000"), "spend against the cap: {row}");
    assert!(row.contains(">free<"), "no top-up, free tier: {row}");
    let (_, usage) = visitor.get("/developers/usage").await;
    let caps = usage
        .split("id=\"key-caps\"")
        .nth(1)
        .expect("the caps table");
    assert!(caps.contains("capped") && caps.contains("5,000"), "{caps}");

    for (field, value) in [("expires_in_days", "3"), ("spend_cap", "-5")] {
        let (_, page) = visitor.get("/developers/keys").await;
        let csrf = hidden_csrf(&page);
        let (status, body, _) = visitor
            .post(
                "/developers/keys",
                &[("csrf", &csrf), ("name", "bad"), (field, value)],
                &[],
            )
            .await;
        assert_eq!(status, 422, "{field}={value}: {body}");
    }
}
