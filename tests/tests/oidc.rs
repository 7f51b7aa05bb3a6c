//! Single sign-on on the dashboard through OpenID Connect, end to end on Postgres with the
//! real gateway binary: a new user signs in through a certified provider (npm
//! `oidc-provider`) in headless Chromium and joins the organization that claimed their
//! email's domain, in the default role; forged, replayed and tampered callbacks (a mock
//! provider breaking its ID token on purpose) are refused and start no session; a domain
//! that requires single sign-on refuses password sign-in.

use std::time::Duration;

use e2e::browser::{Browser, DESKTOP};
use e2e::dns::DnsServer;
use e2e::gateway::{unique_name, workspace_root};
use e2e::oidc::{MockIssuer, OidcProvider, Tamper, CLIENT_ID, CLIENT_SECRET};
use e2e::poll_until;
use e2e::server::free_port;
use e2e::visitor::{hidden_csrf, link_to, mails_to, Visitor, PASSWORD};
use e2e::{Cluster, Gateway, PostgresServer};

const CALLBACK: &str = "/developers/sso/callback";

/// One pod on `pg` whose dashboard signs in through the provider at `issuer`.
async fn dashboard(pg: &PostgresServer, issuer: &str) -> Cluster {
    dashboard_with(pg, issuer, "100").await
}

/// [`dashboard`] allowing `sign_ins` sign-in attempts per minute from one address.
async fn dashboard_with(pg: &PostgresServer, issuer: &str, sign_ins: &str) -> Cluster {
    Cluster::start(1, |b| {
        b.database(&pg.url())
            .arg("--sign-ups-per-minute=100")
            .arg(&format!("--sign-ins-per-minute={sign_ins}"))
            .arg(&format!("--dashboard-oidc-issuer={issuer}"))
            .arg(&format!("--dashboard-oidc-client-id={CLIENT_ID}"))
            .env("GATEWAY_DASHBOARD_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    })
    .await
}

/// [`dashboard`] looking TXT records up at `dns`, with `extra` flags.
async fn dashboard_dns(
    pg: &PostgresServer,
    issuer: &str,
    dns: &DnsServer,
    extra: &[&str],
) -> Cluster {
    Cluster::start(1, |mut b| {
        b = b
            .database(&pg.url())
            .arg("--sign-ups-per-minute=100")
            .arg("--sign-ins-per-minute=100")
            .arg(&format!("--dashboard-oidc-issuer={issuer}"))
            .arg(&format!("--dashboard-oidc-client-id={CLIENT_ID}"))
            .arg(&format!("--dns-resolver={}", dns.address()))
            .env("GATEWAY_DASHBOARD_OIDC_CLIENT_SECRET", CLIENT_SECRET);
        for flag in extra {
            b = b.arg(flag);
        }
        b
    })
    .await
}

/// An owner signed in, whose organization claimed a new domain (requiring single sign-on
/// or not) and proved it by a link mailed to the owner's own address there: the owner's
/// visitor and the domain.
async fn owner_claiming<'a>(gw: &'a Gateway, require_sso: bool) -> (Visitor<'a>, String) {
    let (mut owner, domain) = owner_pending(gw, require_sso).await;
    let link = mail_proof(gw, &mut owner, &domain, &format!("owner@{domain}")).await;
    let (status, page) = follow_proof(&mut owner, &link).await;
    assert_eq!(status, 200, "the mailed link proves the claim: {page}");
    (owner, domain)
}

/// An owner signed in, whose organization claimed a new domain, still pending.
async fn owner_pending<'a>(gw: &'a Gateway, require_sso: bool) -> (Visitor<'a>, String) {
    let domain = format!("{}.example", unique_name("corp"));
    let mut owner = Visitor::new(gw);
    owner.sign_up(&format!("owner@{domain}"), &[]).await;
    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let mut form = vec![("csrf", csrf.as_str()), ("domain", domain.as_str())];
    if require_sso {
        form.push(("require_sso", "on"));
    }
    let (status, page, _) = owner.post("/developers/members/domains", &form, &[]).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&format!("data-domain=\"{domain}\" data-status=\"pending\"")),
        "{page}"
    );
    (owner, domain)
}

const PROOF_PATH: &str = "/developers/domains/prove";

/// Asks for a proof link of the pending claim of `domain` mailed to `to`: the link.
async fn mail_proof(gw: &Gateway, visitor: &mut Visitor<'_>, domain: &str, to: &str) -> String {
    let (_, page) = visitor.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let before = mails_to(gw, to).len();
    let (status, page, _) = visitor
        .post(
            "/developers/members/domains/mail",
            &[("csrf", &csrf), ("domain", domain), ("email", to)],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    poll_until(
        "the proof mail in the gateway's log",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let mails = mails_to(gw, to);
            (mails.len() > before)
                .then(|| mails.last().and_then(|line| link_to(line, PROOF_PATH)))
                .flatten()
        },
    )
    .await
}

/// Opens a proof link (a page with a button) and presses its button: the status and page.
async fn follow_proof(visitor: &mut Visitor<'_>, link: &str) -> (u16, String) {
    let opened = no_redirects().get(link).send().await.expect("the link");
    assert_eq!(opened.status(), 200, "the link's page");
    let page = opened.text().await.expect("page");
    let token = link.rsplit("token=").next().expect("a token");
    assert!(page.contains(token), "{page}");
    let (status, page, _) = visitor.post(PROOF_PATH, &[("token", token)], &[]).await;
    (status, page)
}

/// The value of the TXT record the members page asks to publish for `domain`.
fn record_value(page: &str, domain: &str) -> String {
    let row = page
        .split(&format!("data-domain=\"{domain}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("a row of {domain} in {page}"));
    row.split("<code class=\"record-value\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_else(|| panic!("a record value in {row}"))
        .to_owned()
}

/// Presses Verify for `domain`: the status and page.
async fn verify(visitor: &mut Visitor<'_>, domain: &str) -> (u16, String) {
    let (_, page) = visitor.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = visitor
        .post(
            "/developers/members/domains/verify",
            &[("csrf", &csrf), ("domain", domain)],
            &[],
        )
        .await;
    (status, page)
}

/// A password sign-in of `email` from a new browser: the status.
async fn password_sign_in(gw: &Gateway, email: &str) -> u16 {
    Visitor::new(gw).sign_in(email, PASSWORD).await.0
}

async fn audited(pg: &PostgresServer, action: &str, domain: &str) -> i64 {
    pg.query_i64(&format!(
        "SELECT count(*) FROM audit_log WHERE action = '{action}' AND target = '{domain}'"
    ))
    .await
}

async fn sessions_of(pg: &PostgresServer, email: &str) -> i64 {
    pg.query_i64(&format!(
        "SELECT count(*) FROM dashboard_sessions s JOIN dashboard_users u ON u.id = s.user_id
         WHERE u.email = '{email}'"
    ))
    .await
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

fn location(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .unwrap_or_else(|| panic!("a Location in {response:?}"))
        .to_owned()
}

/// The value `name` is set to by the response's Set-Cookie lines, if any (empty: cleared).
fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|line| line.split(';').next()?.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// A sign-in started at the gateway and sent back by the mock provider: the browser's
/// `svc_sso` cookie and the callback URL the provider sent it to.
async fn started(gw: &Gateway) -> (String, String) {
    let http = no_redirects();
    let start = http
        .get(gw.url("/developers/sso"))
        .send()
        .await
        .expect("start");
    assert_eq!(start.status(), 303, "{start:?}");
    let cookie = set_cookie(&start, "svc_sso").expect("the sign-in's cookie");
    let authorize = http.get(location(&start)).send().await.expect("authorize");
    assert_eq!(authorize.status(), 303);
    let callback = location(&authorize);
    assert!(callback.contains(CALLBACK), "{callback}");
    (cookie, callback)
}

/// The callback, as a browser carrying `cookie` follows it: the status, whether a session
/// cookie was set, and the page.
async fn follow(callback: &str, cookie: &str) -> (u16, bool, String) {
    let response = no_redirects()
        .get(callback)
        .header("cookie", format!("svc_sso={cookie}"))
        .send()
        .await
        .expect("callback");
    let status = response.status().as_u16();
    let session = set_cookie(&response, "svc_session").is_some_and(|v| !v.is_empty());
    (status, session, response.text().await.expect("body"))
}

#[tokio::test]
async fn a_new_user_signs_in_through_the_provider_and_joins_their_domains_organization_as_developer(
) {
    let pg = PostgresServer::start().await;
    let provider_port = free_port();
    let cluster = dashboard(&pg, &format!("http://127.0.0.1:{provider_port}")).await;
    let gw = &cluster.pods[0];
    let provider = OidcProvider::start(provider_port, &gw.url(CALLBACK)).await;
    let (mut owner, domain) = owner_claiming(gw, false).await;
    let email = format!("{}@{domain}", unique_name("sso"));

    let b = Browser::start().await;
    b.goto(&gw.url("/developers/sign-in")).await;
    let dir = workspace_root().join("docs").join("screenshots");
    b.screenshot(&dir, "sso-sign-in", "desktop", DESKTOP).await;
    b.click_and_load("#sso").await;
    // The provider's own login: any login name is an account, that name its verified email.
    b.fill("input[name=login]", &email).await;
    b.fill("input[name=password]", "anything").await;
    b.click_and_load("button[type=submit]").await;
    // Its consent page.
    b.click_and_load("button[type=submit]").await;
    b.wait_for_path("/developers").await;
    let overview = b.text("body").await;
    b.quit().await;
    assert!(overview.contains(&email), "{overview}\n{}", provider.logs());

    let (_, members) = owner.get("/developers/members").await;
    let row = members
        .split(&format!("data-member=\"{email}\""))
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("{email} among the members: {members}"));
    assert!(row.contains(">developer<"), "{row}");
    assert_eq!(sessions_of(&pg, &email).await, 1);
    let method = pg
        .query(&format!(
            "SELECT after->>'method' FROM audit_log WHERE action = 'sign_in' AND target = '{email}'"
        ))
        .await;
    assert_eq!(method, "sso");
}

#[tokio::test]
async fn forged_replayed_and_tampered_callbacks_are_refused_and_start_no_session() {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let cluster = dashboard(&pg, &issuer.issuer()).await;
    let gw = &cluster.pods[0];
    let (_owner, domain) = owner_claiming(gw, false).await;

    // A `state` that is not the browser's.
    let email = format!("{}@{domain}", unique_name("state"));
    issuer.next_token(&email, Tamper::None);
    let (cookie, callback) = started(gw).await;
    let (state_start, _) = callback.split_once("state=").expect("a state");
    let forged = format!("{state_start}state=forged{}", "0".repeat(16));
    let (status, session, page) = follow(&forged, &cookie).await;
    assert_eq!((status, session), (403, false), "wrong state: {page}");
    assert_eq!(sessions_of(&pg, &email).await, 0);

    // Each broken ID token.
    for (tamper, case) in [
        (Tamper::WrongNonce, "wrong nonce"),
        (Tamper::Expired, "expired ID token"),
        (Tamper::BadSignature, "badly signed ID token"),
        (Tamper::WrongAudience, "ID token for another client"),
        (Tamper::EmailUnverified, "unverified email"),
        (
            Tamper::Hs256ClientSecret,
            "ID token signed HS256 with the client secret",
        ),
        (Tamper::IssuedAhead, "ID token issued a day ahead"),
    ] {
        let email = format!("{}@{domain}", unique_name("tamper"));
        issuer.next_token(&email, tamper);
        let (cookie, callback) = started(gw).await;
        let (status, session, page) = follow(&callback, &cookie).await;
        assert_eq!((status, session), (403, false), "{case}: {page}");
        assert_eq!(sessions_of(&pg, &email).await, 0, "{case}");
        let users = pg
            .query_i64(&format!(
                "SELECT count(*) FROM dashboard_users WHERE email = '{email}'"
            ))
            .await;
        assert_eq!(users, 0, "{case} makes no user");
    }

    // A look-alike of a user's email: the Kelvin sign (U+212A) lower-cases to `k`, so the
    // claim `\u{212A}ate@domain` matched `kate@domain`. It is refused, and `kate` keeps no
    // session.
    let kate = format!("kate{}@{domain}", unique_name("k").replace('-', ""));
    issuer.next_token(&kate, Tamper::None);
    let (cookie, callback) = started(gw).await;
    let (status, session, page) = follow(&callback, &cookie).await;
    assert_eq!((status, session), (303, true), "kate herself: {page}");
    let before = sessions_of(&pg, &kate).await;
    let look_alike = kate.replacen('k', "\u{212A}", 1);
    issuer.next_token(&look_alike, Tamper::None);
    let (cookie, callback) = started(gw).await;
    let (status, session, page) = follow(&callback, &cookie).await;
    assert_eq!((status, session), (403, false), "the Kelvin sign: {page}");
    assert!(page.contains("look-alike"), "{page}");
    assert_eq!(
        sessions_of(&pg, &kate).await,
        before,
        "no session of kate's"
    );

    // An email whose domain no organization claimed.
    let stranger = format!(
        "{}@unclaimed-{}.example",
        unique_name("x"),
        unique_name("d")
    );
    issuer.next_token(&stranger, Tamper::None);
    let (cookie, callback) = started(gw).await;
    let (status, session, page) = follow(&callback, &cookie).await;
    assert_eq!((status, session), (403, false), "unclaimed domain: {page}");
    assert!(page.contains("No organization"), "{page}");

    // A good callback signs in once; the same callback (code, state and cookie) again does not.
    let email = format!("{}@{domain}", unique_name("replay"));
    issuer.next_token(&email, Tamper::None);
    let (cookie, callback) = started(gw).await;
    let (status, session, page) = follow(&callback, &cookie).await;
    assert_eq!((status, session), (303, true), "the good callback: {page}");
    let (status, session, page) = follow(&callback, &cookie).await;
    assert_eq!((status, session), (403, false), "replayed callback: {page}");
    assert_eq!(
        sessions_of(&pg, &email).await,
        1,
        "only the first signed in"
    );
}

/// "Require single sign-on" is the claiming organization's rule for its own members: the
/// owner's password sign-in is refused (403, audited `sso_required`, no session), while a user
/// of the domain with an organization of their own signs in with a password as before. Once
/// the claim is released (audited), the owner's password works again.
#[tokio::test]
async fn password_sign_in_is_refused_to_the_claiming_organizations_members_only() {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let cluster = dashboard(&pg, &issuer.issuer()).await;
    let gw = &cluster.pods[0];
    let (mut owner, domain) = owner_claiming(gw, false).await;
    let owner_email = format!("owner@{domain}");
    // A user of the domain with a password and an organization of their own.
    let email = format!("{}@{domain}", unique_name("pw"));
    Visitor::new(gw).sign_up(&email, &[]).await;
    let mut visitor = Visitor::new(gw);
    let (_, page) = visitor.sign_in(&email, PASSWORD).await;
    // Its user owns an organization of their own, which cannot take the claimed domain.
    let (_, page_members) = visitor.get("/developers/members").await;
    let csrf = hidden_csrf(&page_members);
    let (status, page_claim, _) = visitor
        .post(
            "/developers/members/domains",
            &[("csrf", &csrf), ("domain", &domain)],
            &[],
        )
        .await;
    assert_eq!(status, 409, "{page_claim} (after {page})");
    assert!(
        page_claim.contains("Another organization has proven this domain"),
        "{page_claim}"
    );

    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let form = [
        ("csrf", csrf.as_str()),
        ("domain", domain.as_str()),
        ("require_sso", "on"),
    ];
    let (status, page, _) = owner.post("/developers/members/domains", &form, &[]).await;
    assert_eq!(status, 200, "{page}");

    // Not a member of the claiming organization: signs in with a password.
    let (status, page) = Visitor::new(gw).sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303, "another organization's user: {page}");

    // The claiming organization's own member: refused.
    let before = sessions_of(&pg, &owner_email).await;
    let attempt = || async {
        let mut visitor = Visitor::new(gw);
        let (_, form) = visitor.get("/developers/sign-in").await;
        assert!(form.contains("Sign in with SSO"), "{form}");
        let csrf = hidden_csrf(&form);
        visitor
            .post(
                "/developers/sign-in",
                &[
                    ("csrf", &csrf),
                    ("email", &owner_email),
                    ("password", PASSWORD),
                ],
                &[],
            )
            .await
    };
    let (status, page, set) = attempt().await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("requires single sign-on"), "{page}");
    assert!(
        !set.iter().any(|c| c.starts_with("svc_session=")),
        "{set:?}"
    );
    assert_eq!(sessions_of(&pg, &owner_email).await, before);
    let reason = pg
        .query(&format!(
            "SELECT after->>'reason' FROM audit_log
             WHERE action = 'sign_in_failed' AND target = '{owner_email}'"
        ))
        .await;
    assert_eq!(reason, "sso_required");
    let refused_others = pg
        .query_i64(&format!(
            "SELECT count(*) FROM audit_log
             WHERE action = 'sign_in_failed' AND target = '{email}'"
        ))
        .await;
    assert_eq!(
        refused_others, 0,
        "the other organization's user was not refused"
    );

    // Released: audited, and the owner's password works again.
    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = owner
        .post(
            "/developers/members/domains/release",
            &[("csrf", csrf.as_str()), ("domain", domain.as_str())],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        !page.contains(&format!("data-domain=\"{domain}\"")),
        "{page}"
    );
    let released = pg
        .query_i64(&format!(
            "SELECT count(*) FROM audit_log WHERE action = 'domain_released' AND target = '{domain}'"
        ))
        .await;
    assert_eq!(released, 1);
    let (status, _, set) = attempt().await;
    assert_eq!(status, 303, "released: the password works");
    assert!(set.iter().any(|c| c.starts_with("svc_session=")), "{set:?}");
}

/// A claim has no effect until a TXT record proves it: pending, "Require single sign-on"
/// refuses no password and a new SSO user of the domain joins no organization; a missing
/// record and a wrong value prove nothing; the record with the claim's value proves it, and
/// then the members' password sign-in is 403 and new SSO users join. Each step audited.
#[tokio::test]
async fn a_claim_takes_effect_only_once_its_txt_record_proves_it() {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let dns = DnsServer::start().await;
    let cluster = dashboard_dns(&pg, &issuer.issuer(), &dns, &[]).await;
    let gw = &cluster.pods[0];
    let (mut owner, domain) = owner_pending(gw, true).await;
    let owner_email = format!("owner@{domain}");
    let (_, page) = owner.get("/developers/members").await;
    let value = record_value(&page, &domain);
    assert!(value.starts_with("svc-gateway-verification="), "{value}");
    let name = format!("_svc-gateway-challenge.{domain}");
    assert!(page.contains(&name), "{page}");

    // Pending: the password works, and a new SSO user of the domain joins nobody.
    assert_eq!(
        password_sign_in(gw, &owner_email).await,
        303,
        "pending: no SSO required"
    );
    let newcomer = format!("{}@{domain}", unique_name("early"));
    issuer.next_token(&newcomer, Tamper::None);
    let (cookie, callback) = started(gw).await;
    let (status, session, page) = follow(&callback, &cookie).await;
    assert_eq!(
        (status, session),
        (403, false),
        "pending: no joining: {page}"
    );

    // No record, then a wrong value: not proven.
    let (status, page) = verify(&mut owner, &domain).await;
    assert_eq!(status, 422, "no record: {page}");
    dns.set_txt(&[(&name, &["svc-gateway-verification=not-the-token"])]);
    let (status, page) = verify(&mut owner, &domain).await;
    assert_eq!(status, 422, "a wrong value: {page}");
    // The value under another name proves nothing either.
    dns.set_txt(&[(&domain, &[&value])]);
    let (status, page) = verify(&mut owner, &domain).await;
    assert_eq!(status, 422, "the value at the domain itself: {page}");
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM dashboard_domains").await,
        0
    );
    assert_eq!(
        password_sign_in(gw, &owner_email).await,
        303,
        "still pending"
    );
    assert_eq!(audited(&pg, "domain_proven", &domain).await, 0);

    // The record, among others: proven.
    dns.set_txt(&[(&name, &["v=spf1 -all", &value])]);
    let (status, page) = verify(&mut owner, &domain).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Domain proven."), "{page}");
    assert!(
        page.contains(&format!("data-domain=\"{domain}\" data-status=\"proven\"")),
        "{page}"
    );
    assert_eq!(
        password_sign_in(gw, &owner_email).await,
        403,
        "proven: SSO required"
    );
    issuer.next_token(&newcomer, Tamper::None);
    let (cookie, callback) = started(gw).await;
    let (status, session, page) = follow(&callback, &cookie).await;
    assert_eq!((status, session), (303, true), "proven: joins: {page}");
    assert_eq!(audited(&pg, "domain_claimed", &domain).await, 1);
    let proof = pg
        .query(&format!(
            "SELECT after->>'proof' FROM audit_log WHERE action = 'domain_proven' AND target = '{domain}'"
        ))
        .await;
    assert_eq!(proof, "txt");
    // The token is in no log line (it is public once published, but never logged).
    let token = value.trim_start_matches("svc-gateway-verification=");
    assert!(!gw.stderr().contains(token), "the token was logged");
}

/// A proof link mailed to an address at the domain proves the claim once, within its
/// lifetime: a replayed link, an expired one, and one whose claim another organization proved
/// first are refused; a second organization cannot claim the proven domain.
#[tokio::test]
async fn a_mailed_link_proves_a_claim_once_within_its_lifetime_and_a_proven_domain_is_one_organizations(
) {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let cluster = dashboard(&pg, &issuer.issuer()).await;
    let gw = &cluster.pods[0];
    let (mut owner, domain) = owner_pending(gw, true).await;
    let owner_email = format!("owner@{domain}");
    // Only an address at the domain.
    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = owner
        .post(
            "/developers/members/domains/mail",
            &[
                ("csrf", &csrf),
                ("domain", &domain),
                ("email", "it@elsewhere.example"),
            ],
            &[],
        )
        .await;
    assert_eq!(status, 422, "{page}");

    // An expired link proves nothing (and is spent).
    let it = format!("it@{domain}");
    let expired = mail_proof(gw, &mut owner, &domain, &it).await;
    pg.query(&format!(
        "UPDATE dashboard_pending_domains SET mail_expires_at = now() - interval '1 second'
         WHERE domain = '{domain}'"
    ))
    .await;
    let (status, page) = follow_proof(&mut Visitor::new(gw), &expired).await;
    assert_eq!(status, 410, "expired: {page}");
    assert_eq!(
        password_sign_in(gw, &owner_email).await,
        303,
        "still pending"
    );

    // A link mailed before a newer one stops working; the newer proves, once.
    let older = mail_proof(gw, &mut owner, &domain, &it).await;
    let link = mail_proof(gw, &mut owner, &domain, &it).await;
    assert_ne!(older, link);
    let (status, page) = follow_proof(&mut Visitor::new(gw), &older).await;
    assert_eq!(status, 410, "superseded: {page}");
    let (status, page) = follow_proof(&mut Visitor::new(gw), &link).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(&domain), "{page}");
    let (status, page) = follow_proof(&mut Visitor::new(gw), &link).await;
    assert_eq!(status, 410, "replayed: {page}");
    assert_eq!(audited(&pg, "domain_proven", &domain).await, 1);
    let (proof, by) = (
        pg.query(&format!(
            "SELECT after->>'proof' FROM audit_log WHERE action = 'domain_proven' AND target = '{domain}'"
        ))
        .await,
        pg.query(&format!(
            "SELECT actor_id FROM audit_log WHERE action = 'domain_proven' AND target = '{domain}'"
        ))
        .await,
    );
    assert_eq!((proof.as_str(), by.as_str()), ("mail", it.as_str()));
    assert_eq!(
        password_sign_in(gw, &owner_email).await,
        403,
        "proven: SSO required"
    );

    // A second organization: its claim of the proven domain is refused; its pending claim made
    // before the proof cannot be proven any more.
    let mut rival = Visitor::new(gw);
    rival
        .sign_up(&format!("{}@rival.example", unique_name("rival")), &[])
        .await;
    let (_, page) = rival.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = rival
        .post(
            "/developers/members/domains",
            &[("csrf", &csrf), ("domain", &domain)],
            &[],
        )
        .await;
    assert_eq!(status, 409, "{page}");
    assert!(
        page.contains("Another organization has proven this domain"),
        "{page}"
    );
    let rivals = pg
        .query_i64(&format!(
            "SELECT count(*) FROM dashboard_pending_domains WHERE domain = '{domain}'"
        ))
        .await;
    assert_eq!(rivals, 0, "the refused claim left nothing");
}

/// A second organization's pending claim, made while the domain was unproven, is refused its
/// proof once the first organization proved the domain.
#[tokio::test]
async fn a_pending_claim_of_a_domain_another_organization_proved_is_never_proven() {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let cluster = dashboard(&pg, &issuer.issuer()).await;
    let gw = &cluster.pods[0];
    let (mut owner, domain) = owner_pending(gw, false).await;
    let mut rival = Visitor::new(gw);
    rival
        .sign_up(&format!("{}@rival.example", unique_name("rival")), &[])
        .await;
    let (_, page) = rival.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = rival
        .post(
            "/developers/members/domains",
            &[("csrf", &csrf), ("domain", &domain)],
            &[],
        )
        .await;
    assert_eq!(status, 200, "two pending claims of one domain: {page}");
    let rival_link = mail_proof(gw, &mut rival, &domain, &format!("x@{domain}")).await;
    let link = mail_proof(gw, &mut owner, &domain, &format!("owner@{domain}")).await;
    let (status, page) = follow_proof(&mut Visitor::new(gw), &link).await;
    assert_eq!(status, 200, "{page}");
    let (status, page) = follow_proof(&mut Visitor::new(gw), &rival_link).await;
    assert_eq!(status, 409, "the rival's link: {page}");
    let proven = pg
        .query(&format!(
            "SELECT count(*) || ' ' || bool_and(d.account_id = u.account_id)::text
             FROM dashboard_domains d JOIN dashboard_users u ON u.email = 'owner@{domain}'
             WHERE d.domain = '{domain}'"
        ))
        .await;
    assert_eq!(
        proven, "1 true",
        "one proven claim, the first organization's"
    );
}

/// Each Verify is a lookup made on the organization's behalf: at most 10 a minute per
/// organization (429 past them, nothing looked up), another organization's unaffected.
#[tokio::test]
async fn verify_is_braked_per_organization() {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let dns = DnsServer::start().await;
    let cluster = dashboard_dns(&pg, &issuer.issuer(), &dns, &[]).await;
    let gw = &cluster.pods[0];
    let (mut owner, domain) = owner_pending(gw, false).await;
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(verify(&mut owner, &domain).await.0);
    }
    assert_eq!(statuses, [vec![422; 10], vec![429]].concat());
    let (mut other, other_domain) = owner_pending(gw, false).await;
    assert_eq!(
        verify(&mut other, &other_domain).await.0,
        422,
        "another organization"
    );
}

/// A TXT-proven claim is looked up again (here every few seconds, grace 0): once its record is
/// removed, the re-check lapses it back to pending (audited), and the members' passwords work
/// again.
#[tokio::test]
async fn a_removed_txt_record_lapses_the_claim_to_pending_at_the_recheck() {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let dns = DnsServer::start().await;
    let cluster = dashboard_dns(
        &pg,
        &issuer.issuer(),
        &dns,
        &["--domain-recheck-hours=0.0005", "--domain-grace-hours=0"],
    )
    .await;
    let gw = &cluster.pods[0];
    let (mut owner, domain) = owner_pending(gw, true).await;
    let owner_email = format!("owner@{domain}");
    let (_, page) = owner.get("/developers/members").await;
    let name = format!("_svc-gateway-challenge.{domain}");
    dns.set_txt(&[(&name, &[&record_value(&page, &domain)])]);
    let (status, page) = verify(&mut owner, &domain).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(password_sign_in(gw, &owner_email).await, 403, "proven");

    dns.set_txt(&[]);
    poll_until(
        "the claim's lapse in the audit log",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (audited(&pg, "domain_lapsed", &domain).await == 1).then_some(()) },
    )
    .await;
    assert_eq!(
        pg.query_i64(&format!(
            "SELECT count(*) FROM dashboard_pending_domains WHERE domain = '{domain}'"
        ))
        .await,
        1,
        "pending again"
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM dashboard_domains").await,
        0
    );
    assert_eq!(
        password_sign_in(gw, &owner_email).await,
        303,
        "lapsed: no SSO required"
    );
    let (_, page) = owner.get("/developers/members").await;
    assert!(
        page.contains(&format!("data-domain=\"{domain}\" data-status=\"pending\"")),
        "{page}"
    );
    let actor = pg
        .query(&format!(
            "SELECT actor_kind || ':' || actor_id FROM audit_log
             WHERE action = 'domain_lapsed' AND target = '{domain}'"
        ))
        .await;
    assert_eq!(actor, "sweep:domain-recheck");
}

#[tokio::test]
async fn a_public_mail_domain_is_never_claimed_another_domain_only_pending_and_sign_in_starts_are_braked_per_address(
) {
    let pg = PostgresServer::start().await;
    let issuer = MockIssuer::start().await;
    let cluster = dashboard_with(&pg, &issuer.issuer(), "5").await;
    let gw = &cluster.pods[0];
    let domain = format!("{}.example", unique_name("corp"));
    let mut owner = Visitor::new(gw);
    owner.sign_up(&format!("owner@{domain}"), &[]).await;
    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = owner
        .post(
            "/developers/members/domains",
            &[("csrf", &csrf), ("domain", "gmail.com")],
            &[],
        )
        .await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("public mail provider"), "{page}");
    // Another company's domain: a claim, pending until proven, with no effect.
    let other = format!("{}.example", unique_name("another-company"));
    let (status, page, _) = owner
        .post(
            "/developers/members/domains",
            &[("csrf", &csrf), ("domain", &other)],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&format!("data-domain=\"{other}\" data-status=\"pending\"")),
        "{page}"
    );
    // Nor its own email's domain when that is a public mail provider's.
    let mut public = Visitor::new(gw);
    public
        .sign_up(&format!("{}@gmail.com", unique_name("owner")), &[])
        .await;
    let (_, page) = public.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = public
        .post(
            "/developers/members/domains",
            &[("csrf", csrf.as_str()), ("domain", "gmail.com")],
            &[],
        )
        .await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("public mail provider"), "{page}");
    let claims = pg.query_i64("SELECT count(*) FROM dashboard_domains").await;
    assert_eq!(claims, 0, "nothing proven");
    let pending = pg
        .query_i64("SELECT count(*) FROM dashboard_pending_domains")
        .await;
    assert_eq!(pending, 1, "only the other company's domain, pending");

    // Each start stores a record: one address gets the sign-in allowance, then 429s that
    // store nothing.
    let http = no_redirects();
    let mut started = 0;
    let mut braked = 0;
    for _ in 0..12 {
        let start = http
            .get(gw.url("/developers/sso"))
            .send()
            .await
            .expect("start");
        match start.status().as_u16() {
            303 => started += 1,
            429 => {
                assert!(start.headers().contains_key("retry-after"));
                braked += 1;
            }
            other => panic!("start answered {other}"),
        }
    }
    assert!(
        started >= 1 && braked >= 1,
        "{started} started, {braked} braked"
    );
    let records = pg
        .query_i64("SELECT count(*) FROM dashboard_sso_logins")
        .await;
    assert_eq!(records, started, "a braked start stores nothing");
}

#[test]
fn the_chart_passes_the_sso_settings_with_the_client_secret_mounted_from_a_secret() {
    let off = e2e::helm::template(&["t", "charts/gateway"]);
    assert!(off.contains("--dashboard-invitation-days=7"), "{off}");
    assert!(!off.contains("--dashboard-oidc"), "off without an issuer");
    let on = e2e::helm::template(&[
        "t",
        "charts/gateway",
        "--set",
        "gateway.oidc.issuer=https://idp.example.com",
        "--set",
        "gateway.oidc.clientId=gw",
        "--set",
        "gateway.oidc.clientSecret=gw-oidc",
        "--set",
        "gateway.invitationDays=3",
    ]);
    for arg in [
        "--dashboard-invitation-days=3",
        "--dashboard-oidc-issuer=https://idp.example.com",
        "--dashboard-oidc-client-id=gw",
        "--dashboard-oidc-client-secret-file=/etc/gateway/oidc/client-secret",
        "--dashboard-oidc-default-role=developer",
        "secretName: gw-oidc",
    ] {
        assert!(on.contains(arg), "{arg} in {on}");
    }
}
