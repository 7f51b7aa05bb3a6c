//! A dashboard visitor speaking plain HTTP (no browser): sign-up, sign-in and forms with the
//! session's CSRF token, cookies carried by hand, redirects not followed (so that the tests
//! see the cookies and the `Location` they carry). The mails the gateway sends are read from
//! its log, where it writes them with no mail server configured. The site is one gateway
//! process, or pods behind an ingress ([`Site`]).

use std::time::Duration;

use crate::gateway::{unique_name, Gateway};
use crate::poll_until;

/// Where a verification link leads.
pub const VERIFY_PATH: &str = "/developers/verify-email";
/// Where an invitation to an organization leads.
pub const INVITATION_PATH: &str = "/developers/invitations/accept";

/// The password every visitor signs up with.
pub const PASSWORD: &str = "correct horse battery";

/// Where a visitor finds the dashboard, and the log the mails sent from it are written to.
pub trait Site {
    /// Base URL of the public API and the dashboard.
    fn api(&self) -> &str;
    /// The log lines of every gateway process serving the site.
    fn log(&self) -> String;
}

impl Site for Gateway {
    fn api(&self) -> &str {
        &self.api
    }

    fn log(&self) -> String {
        self.stderr()
    }
}

/// A signed-out or signed-in visitor speaking plain HTTP, carrying its cookies by hand.
pub struct Visitor<'a> {
    gw: &'a dyn Site,
    /// Redirects are not followed, so that the cookies they set are seen.
    http: reqwest::Client,
    pub cookies: Vec<(String, String)>,
    /// The `Location` of the last response that had one.
    pub location: Option<String>,
}

pub fn hidden_csrf(html: &str) -> String {
    hidden_field(html, "csrf")
}

/// The value of the form field `name` in `html`.
pub fn hidden_field(html: &str, name: &str) -> String {
    html.split(&format!("name=\"{name}\" value=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a {name} field in {html}"))
        .to_owned()
}

/// The log lines of the mails the gateway sent to `email` so far, oldest first.
pub fn mails_to(gw: &dyn Site, email: &str) -> Vec<String> {
    let to = format!("\"{email}\"");
    gw.log()
        .lines()
        .filter(|line| line.contains("gateway::mail") && line.contains(&to))
        .map(str::to_owned)
        .collect()
}

/// The newest verification link mailed to `email` (waiting for it a few seconds).
pub async fn verification_link(gw: &dyn Site, email: &str) -> String {
    newest_link(gw, email, VERIFY_PATH).await
}

/// The newest invitation link mailed to `email` (waiting for it a few seconds).
pub async fn invitation_link(gw: &dyn Site, email: &str) -> String {
    newest_link(gw, email, INVITATION_PATH).await
}

async fn newest_link(gw: &dyn Site, email: &str, path: &str) -> String {
    poll_until(
        &format!("a link to {path} in the gateway's log"),
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            mails_to(gw, email)
                .iter()
                .rev()
                .find_map(|line| link_to(line, path))
        },
    )
    .await
}

/// The verification link in a mail (or the log line of one).
pub fn link_in(line: &str) -> Option<String> {
    link_to(line, VERIFY_PATH)
}

/// The link to `to` (a path with a `token` query) in a mail or its log line.
pub fn link_to(line: &str, to: &str) -> Option<String> {
    let path = line.find(&format!("{to}?token="))?;
    let start = line[..path].rfind("http")?;
    let token_start = path + to.len() + "?token=".len();
    let token_len = line[token_start..]
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(line.len() - token_start);
    Some(line[start..token_start + token_len].to_owned())
}

impl<'a> Visitor<'a> {
    pub fn new(gw: &'a dyn Site) -> Self {
        Self::with_client(
            gw,
            reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
        )
    }

    /// A visitor speaking through `http` (a client resolving the site's host name to an
    /// ingress, say), which must not follow redirects.
    pub fn with_client(gw: &'a dyn Site, http: reqwest::Client) -> Self {
        Self {
            gw,
            http,
            cookies: Vec::new(),
            location: None,
        }
    }

    pub fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn keep_cookies(&mut self, response: &reqwest::Response) -> Vec<String> {
        let set: Vec<String> = response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect();
        for line in &set {
            if let Some((name, value)) = line.split(';').next().and_then(|p| p.split_once('=')) {
                self.cookies.retain(|(k, _)| k != name);
                self.cookies.push((name.to_owned(), value.to_owned()));
            }
        }
        set
    }

    pub async fn get(&mut self, path: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.gw.api()))
            .header("cookie", self.cookie_header())
            .send()
            .await
            .expect("GET");
        self.keep_cookies(&response);
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    /// Posts a form; returns the status, the body and the Set-Cookie lines.
    pub async fn post(
        &mut self,
        path: &str,
        form: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> (u16, String, Vec<String>) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.gw.api()))
            .header("cookie", self.cookie_header())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(
                form.iter()
                    .map(|(k, v)| format!("{k}={}", v.replace('@', "%40").replace(' ', "+")))
                    .collect::<Vec<_>>()
                    .join("&"),
            );
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("POST");
        let set = self.keep_cookies(&response);
        if let Some(location) = response.headers().get("location") {
            self.location = location.to_str().ok().map(str::to_owned);
        }
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"), set)
    }

    /// Signs up as a user would: submits the form, follows the link mailed to `email` and
    /// signs in. Returns the sign-in's Set-Cookie lines (the session).
    pub async fn sign_up(&mut self, email: &str, headers: &[(&str, &str)]) -> Vec<String> {
        let (status, page, _) = self.try_sign_up(email, headers).await;
        assert_eq!(status, 200, "sign-up asks to check the email: {page}");
        let (status, page) = self.verify_email(email).await;
        assert_eq!(status, 200, "the link verifies the email: {page}");
        let (_, form) = self.get("/developers/sign-in").await;
        let csrf = hidden_csrf(&form);
        let (status, page, set) = self
            .post(
                "/developers/sign-in",
                &[("csrf", &csrf), ("email", email), ("password", PASSWORD)],
                headers,
            )
            .await;
        assert_eq!(status, 303, "sign-in redirects to the overview: {page}");
        set
    }

    /// Follows the newest verification link mailed to `email`, as its owner would: opens it
    /// and confirms. The confirmation's status and page.
    pub async fn verify_email(&mut self, email: &str) -> (u16, String) {
        let link = verification_link(self.gw, email).await;
        self.follow_verification_link(&link).await
    }

    /// Opens a verification link and confirms on the page it opens: the status and page.
    pub async fn follow_verification_link(&mut self, link: &str) -> (u16, String) {
        // Under the gateway's public URL, which routes to this gateway.
        let path = &link[link.find(VERIFY_PATH).unwrap_or_default()..];
        let (status, page) = self.get(path).await;
        assert_eq!(status, 200, "{page}");
        let token = hidden_field(&page, "token");
        let (status, page, _) = self.post(VERIFY_PATH, &[("token", &token)], &[]).await;
        (status, page)
    }

    /// Submits the sign-up form: the status, the page and the cookies set.
    pub async fn try_sign_up(
        &mut self,
        email: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String, Vec<String>) {
        let (_, page) = self.get("/developers/sign-up").await;
        let csrf = hidden_csrf(&page);
        self.post(
            "/developers/sign-up",
            &[("csrf", &csrf), ("email", email), ("password", PASSWORD)],
            headers,
        )
        .await
    }

    pub async fn sign_in(&mut self, email: &str, password: &str) -> (u16, String) {
        self.sign_in_with(email, password, &[]).await
    }

    /// Signs in sending `headers` too (e.g. `X-Forwarded-For` through a trusted proxy).
    pub async fn sign_in_with(
        &mut self,
        email: &str,
        password: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String) {
        let (_, page) = self.get("/developers/sign-in").await;
        let csrf = hidden_csrf(&page);
        let (status, body, _) = self
            .post(
                "/developers/sign-in",
                &[("csrf", &csrf), ("email", email), ("password", password)],
                headers,
            )
            .await;
        (status, body)
    }
}

pub fn new_email() -> String {
    format!("{}@example.com", unique_name("dev"))
}

impl Visitor<'_> {
    /// Starts a top-up of `amount` (as typed) from the billing page: the status, the body,
    /// and where the browser is sent.
    pub async fn checkout(&mut self, amount: &str) -> (u16, String, Option<String>) {
        let (_, page) = self.get("/developers/billing").await;
        let csrf = hidden_csrf(&page);
        self.location = None;
        let (status, body, _) = self
            .post(
                "/developers/billing/checkout",
                &[("csrf", &csrf), ("amount", amount)],
                &[],
            )
            .await;
        (status, body, self.location.clone())
    }

    /// Invites `email` as `role` from the members page: the status and the page.
    pub async fn invite(&mut self, email: &str, role: &str) -> (u16, String) {
        let (_, page) = self.get("/developers/members").await;
        let csrf = hidden_csrf(&page);
        let (status, page, _) = self
            .post(
                "/developers/members/invite",
                &[("csrf", &csrf), ("email", email), ("role", role)],
                &[],
            )
            .await;
        (status, page)
    }

    /// Opens an invitation link and accepts on the page it opens: the status and page.
    pub async fn accept_invitation(&mut self, link: &str) -> (u16, String) {
        let path = &link[link.find(INVITATION_PATH).unwrap_or_default()..];
        let (status, page) = self.get(path).await;
        assert_eq!(status, 200, "{page}");
        let (csrf, token) = (hidden_csrf(&page), hidden_field(&page, "token"));
        let (status, page, _) = self
            .post(INVITATION_PATH, &[("csrf", &csrf), ("token", &token)], &[])
            .await;
        (status, page)
    }

    /// Mints an API key named `name` from the keys page: the status and the page.
    pub async fn create_key(&mut self, name: &str) -> (u16, String) {
        let (_, page) = self.get("/developers/keys").await;
        let csrf = hidden_csrf(&page);
        let (status, page, _) = self
            .post(
                "/developers/keys",
                &[("csrf", &csrf), ("name", name), ("kind", "api")],
                &[],
            )
            .await;
        (status, page)
    }
}

/// `n` with thousands separators, as the dashboard shows numbers.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
