//! The dashboard's settings.

use std::sync::Arc;

use clap::Args;
use lettre::message::Mailbox;
use time::Duration;

use super::secrets::{LONG_SECRET, SMTP_URL};
use crate::dashboard::domains::DomainChecks;
use crate::dashboard::mail::{LogMailer, Mailer, SmtpMailer, SmtpServer};
use crate::dashboard::settings::{PublicUrl, SsoSettings};
use crate::dashboard::DashboardSettings;
use openidconnect::{ClientId, ClientSecret, IssuerUrl};
use store::developers::Role;

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Mark dashboard cookies `Secure` on every request (behind TLS). Without it they are
    /// `Secure` only when `X-Forwarded-Proto: https` says the request came over TLS.
    #[arg(long, env = "GATEWAY_DASHBOARD_SECURE_COOKIES")]
    pub dashboard_secure_cookies: bool,
    /// Minutes a dashboard session may go unused before it ends (sign in again). Fractions
    /// are allowed.
    #[arg(long, env = "GATEWAY_DASHBOARD_SESSION_IDLE_MINS", default_value_t = 30.0,
          value_parser = positive)]
    pub dashboard_session_idle_mins: f64,
    /// Hours after sign-in a dashboard session ends, however busy. Fractions are allowed.
    #[arg(long, env = "GATEWAY_DASHBOARD_SESSION_MAX_HOURS", default_value_t = 12.0,
          value_parser = positive)]
    pub dashboard_session_max_hours: f64,
    /// Days an invitation to a dashboard organization may be accepted. Fractions are allowed.
    #[arg(long, env = "GATEWAY_DASHBOARD_INVITATION_DAYS", default_value_t = 7.0,
          value_parser = positive)]
    pub dashboard_invitation_days: f64,
    /// apiCredits granted to each account signed up in the dashboard once its email is
    /// verified (a trial; not a top-up, so it does not count towards tiers).
    #[arg(long, env = "GATEWAY_SIGNUP_CREDITS", default_value_t = 0)]
    pub signup_credits: u64,
    /// The URL browsers reach the gateway at (e.g. https://gateway.example.com): the base of
    /// the email verification links and of the payment provider's return URLs. Without it,
    /// the API listener's own address (loopback when it listens on every address).
    #[arg(long, env = "GATEWAY_PUBLIC_URL", value_parser = public_url)]
    pub public_url: Option<String>,
    /// The SMTP server that delivers the dashboard's mail (verification links):
    /// `smtp://host:25`, `smtp://user:password@host:587?tls=required` (STARTTLS) or
    /// `smtps://user:password@host:465`. Without it each mail is written to the log instead,
    /// for the operator to deliver.
    #[arg(long, env = "GATEWAY_SMTP_URL", hide_env_values = true, value_parser = SMTP_URL)]
    pub smtp_url: Option<SmtpServer>,
    /// The sender of the dashboard's mail.
    #[arg(long, env = "GATEWAY_MAIL_FROM", default_value = "svc gateway <no-reply@localhost>",
          value_parser = mailbox)]
    pub mail_from: Mailbox,
    /// The OpenID Connect provider the dashboard's "Sign in with SSO" goes to (its issuer URL,
    /// where `/.well-known/openid-configuration` is). Without it there is no single sign-on.
    #[arg(long, env = "GATEWAY_DASHBOARD_OIDC_ISSUER", value_parser = issuer_url,
          requires_all = ["dashboard_oidc_client_id", "oidc_secret"])]
    pub dashboard_oidc_issuer: Option<IssuerUrl>,
    /// The gateway's client id at the provider (its redirect URI:
    /// `<public URL>/developers/sso/callback`).
    #[arg(
        long,
        env = "GATEWAY_DASHBOARD_OIDC_CLIENT_ID",
        requires = "dashboard_oidc_issuer"
    )]
    pub dashboard_oidc_client_id: Option<String>,
    /// The client's secret at the provider. Prefer `--dashboard-oidc-client-secret-file`.
    #[arg(long, env = "GATEWAY_DASHBOARD_OIDC_CLIENT_SECRET", hide_env_values = true,
          group = "oidc_secret", value_parser = LONG_SECRET)]
    pub dashboard_oidc_client_secret: Option<String>,
    /// A file holding the client's secret (a mounted Kubernetes Secret); surrounding
    /// whitespace is dropped.
    #[arg(long, env = "GATEWAY_DASHBOARD_OIDC_CLIENT_SECRET_FILE", group = "oidc_secret",
          value_parser = secret_file)]
    pub dashboard_oidc_client_secret_file: Option<String>,
    /// The role of a new member signing in through the provider, placed in the organization
    /// that claimed their email's domain.
    #[arg(long, env = "GATEWAY_DASHBOARD_OIDC_DEFAULT_ROLE", default_value = "developer",
          value_parser = role)]
    pub dashboard_oidc_default_role: Role,
    /// The DNS server (`HOST:PORT`, an IP address) that looks up the TXT records proving
    /// domain claims; without it, the system's resolver (`/etc/resolv.conf`).
    #[arg(long, env = "GATEWAY_DNS_RESOLVER", value_name = "HOST:PORT")]
    pub dns_resolver: Option<std::net::SocketAddr>,
    /// How often each domain claim proven by a TXT record is looked up again.
    #[arg(long, env = "GATEWAY_DOMAIN_RECHECK_HOURS", default_value_t = 24.0, value_parser = positive_hours)]
    pub domain_recheck_hours: f64,
    /// How long a TXT-proven claim's record may be missing at re-checks before the claim lapses
    /// back to pending (0: at the first re-check that misses it).
    #[arg(long, env = "GATEWAY_DOMAIN_GRACE_HOURS", default_value_t = 72.0, value_parser = hours)]
    pub domain_grace_hours: f64,
}

/// A number of hours from 0 to a year.
fn hours(value: &str) -> Result<f64, String> {
    let number: f64 = value.parse().map_err(|e| format!("not a number: {e}"))?;
    if number.is_finite() && (0.0..=366.0 * 24.0).contains(&number) {
        Ok(number)
    } else {
        Err("expected a number of hours from 0 to a year".to_owned())
    }
}

/// A positive number of hours, at most a year.
fn positive_hours(value: &str) -> Result<f64, String> {
    hours(value).and_then(|h| {
        if h > 0.0 {
            Ok(h)
        } else {
            Err("expected a positive number of hours".to_owned())
        }
    })
}

/// A positive, finite number of at most a year's seconds, so its duration cannot overflow.
fn positive(value: &str) -> Result<f64, String> {
    let number: f64 = value.parse().map_err(|e| format!("not a number: {e}"))?;
    if number.is_finite() && number > 0.0 && number <= 366.0 * 24.0 * 3600.0 {
        Ok(number)
    } else {
        Err("expected a positive number".to_owned())
    }
}

fn issuer_url(value: &str) -> Result<IssuerUrl, String> {
    IssuerUrl::new(value.to_owned()).map_err(|e| format!("not a URL: {e}"))
}

fn role(value: &str) -> Result<Role, String> {
    Role::parse(value).ok_or_else(|| "expected owner, admin, developer or billing".to_owned())
}

/// A secret read from a file (a mounted Kubernetes Secret), surrounding whitespace dropped;
/// the refusal names the file, never its content.
fn secret_file(path: &str) -> Result<String, String> {
    let secret = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {path}: {e}"))?
        .trim()
        .to_owned();
    if secret.is_empty() {
        return Err(format!("{path} is empty"));
    }
    Ok(secret)
}

impl DashboardArgs {
    /// Single sign-on's settings, when an issuer is configured (clap requires the client id
    /// and one of the secrets with it).
    fn sso(&self) -> Option<Arc<SsoSettings>> {
        let issuer = self.dashboard_oidc_issuer.clone()?;
        let client_id = self.dashboard_oidc_client_id.clone()?;
        let secret = self
            .dashboard_oidc_client_secret
            .clone()
            .or_else(|| self.dashboard_oidc_client_secret_file.clone())?;
        Some(Arc::new(SsoSettings {
            issuer,
            client_id: ClientId::new(client_id),
            client_secret: ClientSecret::new(secret),
            default_role: self.dashboard_oidc_default_role,
            provider: tokio::sync::Mutex::new(None),
        }))
    }
}

fn mailbox(value: &str) -> Result<Mailbox, String> {
    value
        .parse()
        .map_err(|e| format!("not a mailbox (`Name <address>` or `address`): {e}"))
}

fn public_url(value: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(value).map_err(|e| format!("not a URL: {e}"))?;
    let bare = matches!(url.path(), "" | "/") && url.query().is_none() && url.fragment().is_none();
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() || !bare {
        return Err("expected http(s)://host[:port] with no path".to_owned());
    }
    Ok(value.to_owned())
}

impl From<&DashboardArgs> for DashboardSettings {
    fn from(args: &DashboardArgs) -> Self {
        Self {
            secure_cookies: args.dashboard_secure_cookies,
            session_idle: Duration::seconds_f64(args.dashboard_session_idle_mins * 60.0),
            session_max: Duration::seconds_f64(args.dashboard_session_max_hours * 3600.0),
            invitation_lifetime: Duration::seconds_f64(args.dashboard_invitation_days * 86_400.0),
            signup_credits: args.signup_credits,
            public_url: PublicUrl::configured(args.public_url.as_deref()),
            mailer: match &args.smtp_url {
                Some(server) => Arc::new(SmtpMailer::new(server.clone(), args.mail_from.clone()))
                    as Arc<dyn Mailer>,
                None => Arc::new(LogMailer),
            },
            sso: args.sso(),
            domains: Arc::new(DomainChecks::new(
                args.dns_resolver,
                std::time::Duration::from_secs_f64(args.domain_recheck_hours * 3600.0),
                Duration::seconds_f64(args.domain_grace_hours * 3600.0),
            )),
        }
    }
}
