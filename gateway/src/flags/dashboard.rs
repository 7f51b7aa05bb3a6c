//! The dashboard's settings.

use std::sync::Arc;

use clap::Args;
use lettre::message::Mailbox;

use super::secrets::SMTP_URL;
use crate::dashboard::mail::{LogMailer, Mailer, SmtpMailer, SmtpServer};
use crate::dashboard::settings::PublicUrl;
use crate::dashboard::DashboardSettings;

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Mark dashboard cookies `Secure` on every request (behind TLS). Without it they are
    /// `Secure` only when `X-Forwarded-Proto: https` says the request came over TLS.
    #[arg(long, env = "GATEWAY_DASHBOARD_SECURE_COOKIES")]
    pub dashboard_secure_cookies: bool,
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
            signup_credits: args.signup_credits,
            public_url: PublicUrl::configured(args.public_url.as_deref()),
            mailer: match &args.smtp_url {
                Some(server) => Arc::new(SmtpMailer::new(server.clone(), args.mail_from.clone()))
                    as Arc<dyn Mailer>,
                None => Arc::new(LogMailer),
            },
        }
    }
}
