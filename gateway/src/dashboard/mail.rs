//! The emails the dashboard sends: the link that verifies an address, and the notice to an
//! address that already has an account. Delivered by the [`Mailer`] chosen at start: an SMTP
//! server (`--smtp-url`), or, without one, the log (info level, target `gateway::mail`, the
//! link the only secret in it) for the operator to deliver by hand and for tests to read.
//!
//! Through SMTP a mail is sent in the background, so a slow mail server never holds a
//! sign-up's answer (nor tells by its timing which answer it was); at most [`IN_FLIGHT`] at
//! once, each within [`SEND_TIMEOUT`], the others queued in order (up to [`QUEUED`], counted by
//! `gateway_mail_queued`; past it a mail is dropped, logged and counted by
//! `gateway_mail_dropped_total`). A burst of mails waits its turn rather than dropping other users'
//! verification mails. A mail that cannot be sent is logged without its link; its user signs
//! up again for a new one.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use thiserror::Error;
use tokio::sync::Semaphore;

use gateway_core::telemetry::metrics;

/// A mail to write; each names its link, under the public URL.
pub enum Mail<'a> {
    /// Confirms `to` for the sign-up that chose a password: the link verifies the address.
    Verify { to: &'a str, link: String },
    /// Someone signed up with the address of an existing, verified account: its owner is told
    /// (the link is the sign-in page), and nothing else happens.
    AlreadySignedUp { to: &'a str, link: String },
    /// `by` invites `to` to join their organization as `role`: the link opens the page that
    /// accepts, for a user signed in with `to`.
    Invitation {
        to: &'a str,
        by: &'a str,
        role: &'a str,
        link: String,
    },
    /// A member of `by`'s organization asks `to`, an address at `domain`, to prove the
    /// organization controls it: the link proves the claim, once.
    DomainProof {
        to: &'a str,
        domain: &'a str,
        link: String,
    },
}

/// The path of a domain proof link (under the public URL).
pub const DOMAIN_PROOF_PATH: &str = "/developers/domains/prove";
/// How long a domain proof link works.
pub const DOMAIN_PROOF_LIFETIME: time::Duration = time::Duration::HOUR;

/// The path of a verification link (under the public URL).
pub const VERIFY_PATH: &str = "/developers/verify-email";
/// The path of an invitation link (under the public URL).
pub const INVITATION_PATH: &str = "/developers/invitations/accept";
/// Mails being sent at once; past it a mail waits in the queue.
pub const IN_FLIGHT: usize = 32;
/// Mails waiting or being sent at most; past it a mail is dropped (logged and counted). A few
/// KiB each: 4,096 of them are a few tens of MiB at worst.
pub const QUEUED: i64 = 4_096;
/// How long one mail may take to reach the mail server.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);

static SENDING: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(IN_FLIGHT)));

/// One mail, written.
#[derive(Debug)]
pub struct Letter {
    pub to: String,
    pub subject: &'static str,
    pub text: String,
    /// The link the text names (a secret for a verification mail).
    pub link: String,
}

#[derive(Debug, Error)]
pub enum MailError {
    #[error("the address is not a mailbox: {0}")]
    Address(#[from] lettre::address::AddressError),
    #[error("the mail could not be built: {0}")]
    Build(#[from] lettre::error::Error),
    #[error("the mail server refused or could not be reached: {0}")]
    Smtp(#[from] lettre::transport::smtp::Error),
}

/// Where mail goes; chosen once at start. Sending never waits for delivery.
pub trait Mailer: fmt::Debug + Send + Sync {
    fn send(&self, letter: Letter);
}

/// No mail server: the log, at once.
#[derive(Debug)]
pub struct LogMailer;

impl Mailer for LogMailer {
    fn send(&self, letter: Letter) {
        tracing::info!(
            target: "gateway::mail",
            to = letter.to,
            subject = letter.subject,
            link = %letter.link,
            "mail: {}",
            letter.text
        );
    }
}

/// An SMTP server (`--smtp-url`), sending from `--mail-from`.
#[derive(Debug)]
pub struct SmtpMailer {
    server: SmtpServer,
    from: Mailbox,
}

impl SmtpMailer {
    pub fn new(server: SmtpServer, from: Mailbox) -> Self {
        Self { server, from }
    }

    async fn deliver(server: SmtpServer, from: Mailbox, letter: Letter) -> Result<(), MailError> {
        let message = Message::builder()
            .from(from)
            .to(Mailbox::new(None, letter.to.parse()?))
            .subject(letter.subject)
            .body(format!("{}\n\n{}\n", letter.text, letter.link))?;
        server.0.send(message).await?;
        Ok(())
    }
}

impl Mailer for SmtpMailer {
    fn send(&self, letter: Letter) {
        if metrics::mails_queued() >= QUEUED {
            metrics::mail_dropped();
            tracing::warn!(target: "gateway::mail", subject = letter.subject,
                "mail not sent: {QUEUED} mails are queued already");
            return;
        }
        let queued = metrics::mail_queued();
        let (server, from) = (self.server.clone(), self.from.clone());
        tokio::spawn(async move {
            // The semaphore is fair: the mails are sent in the order they were queued.
            let Ok(slot) = SENDING.clone().acquire_owned().await else {
                return;
            };
            let subject = letter.subject;
            let sent = tokio::time::timeout(SEND_TIMEOUT, Self::deliver(server, from, letter));
            match sent.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(target: "gateway::mail", subject, error = %e, "mail not sent")
                }
                Err(_) => tracing::warn!(target: "gateway::mail", subject,
                    "mail not sent: the mail server took too long"),
            }
            drop(slot);
            drop(queued);
        });
    }
}

/// A mail server's transport, parsed from `--smtp-url` at start (so a bad URL stops the
/// process then, not a sign-up later). Its `Debug` names nothing: the URL holds a password.
#[derive(Clone)]
pub struct SmtpServer(AsyncSmtpTransport<Tokio1Executor>);

impl SmtpServer {
    /// `smtp://host:port` (plain, or `?tls=required` for STARTTLS), `smtps://host:port` (TLS),
    /// with `user:password@` when the server asks for it.
    pub fn parse(url: &str) -> Result<Self, String> {
        AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map(|builder| Self(builder.timeout(Some(SEND_TIMEOUT)).build()))
            // Not lettre's message: it may quote the URL, password and all.
            .map_err(|_| {
                "expected smtp://[user:password@]host[:port][?tls=required] or smtps://..."
                    .to_owned()
            })
    }
}

impl fmt::Debug for SmtpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SmtpServer(..)")
    }
}

/// Writes `mail` and hands it to `mailer`.
pub fn send(mailer: &dyn Mailer, mail: Mail<'_>) {
    mailer.send(letter(mail));
}

fn letter(mail: Mail<'_>) -> Letter {
    match mail {
        Mail::Verify { to, link } => Letter {
            to: to.to_owned(),
            subject: "Confirm your email",
            text: "Follow the link to confirm this address and finish signing up (it works \
                   once, within 24 hours; ignore it if you did not sign up)."
                .to_owned(),
            link,
        },
        Mail::AlreadySignedUp { to, link } => Letter {
            to: to.to_owned(),
            subject: "You already have an account",
            text: "Someone tried to sign up with this address, which already has an account; \
                   sign in instead (nothing changed)."
                .to_owned(),
            link,
        },
        Mail::Invitation { to, by, role, link } => Letter {
            to: to.to_owned(),
            subject: "You are invited to an organization",
            text: format!(
                "{by} invites you to join their organization on svc developers as {role}. \
                 Follow the link and sign in (or sign up) with this address to accept; it works \
                 once, for this address only, and expires. Ignore it if you do not know them."
            ),
            link,
        },
        Mail::DomainProof { to, domain, link } => Letter {
            to: to.to_owned(),
            subject: "Confirm your organization's domain",
            text: format!(
                "An organization on svc developers claims {domain} for single sign-on and asks \
                 you to confirm it controls the domain. Follow the link and press the button to \
                 confirm (it works once, within an hour); ignore it if you do not know them."
            ),
            link,
        },
    }
}
