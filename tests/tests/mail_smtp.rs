//! The dashboard's mail through an SMTP server (`--smtp-url`, here aiosmtpd keeping a maildir):
//! a sign-up's verification link arrives in the mailbox from `--mail-from` and never in the
//! log, and following it verifies the email; a mail server that cannot be reached costs the
//! mail (logged without its link), never the sign-up's answer.

use std::time::Duration;

use e2e::smtp::SmtpSink;
use e2e::visitor::{link_in, new_email, Visitor, PASSWORD};
use e2e::*;

/// A mail's text with its quoted-printable soft line breaks and `=3D` undone (the links are
/// ASCII; nothing else is encoded in them).
fn unfolded(message: &str) -> String {
    message
        .replace("=\r\n", "")
        .replace("=\n", "")
        .replace("=3D", "=")
}

#[tokio::test]
async fn a_sign_ups_verification_link_is_mailed_through_smtp_and_never_logged() {
    let smtp = SmtpSink::start().await;
    let gw = Gateway::builder()
        .arg("--smtp-url")
        .arg(&smtp.url())
        .arg("--mail-from")
        .arg("Gateway <no-reply@gateway.example>")
        .start()
        .await;
    let email = new_email();
    let (status, page, _) = Visitor::new(&gw).try_sign_up(&email, &[]).await;
    assert_eq!(status, 200, "{page}");
    let message = poll_until(
        "the verification mail in the mailbox",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            smtp.messages()
                .into_iter()
                .map(|m| unfolded(&m))
                .find(|m| m.contains(&email))
        },
    )
    .await;
    assert!(
        message.contains("From: Gateway <no-reply@gateway.example>"),
        "{message}"
    );
    assert!(message.contains("Subject: Confirm your email"), "{message}");
    let link = link_in(&message).unwrap_or_else(|| panic!("no link in the mail:\n{message}"));
    let token = &link[link.find("token=").expect("a token") + "token=".len()..];
    assert!(token.len() >= 20, "{link}");
    assert!(
        !gw.stderr().contains(token),
        "the link's token is in the gateway's log"
    );

    let (status, page) = Visitor::new(&gw).follow_verification_link(&link).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Email confirmed"), "{page}");
    let (status, page) = Visitor::new(&gw).sign_in(&email, PASSWORD).await;
    assert_eq!(status, 303, "{page}");
}

#[tokio::test]
async fn a_mail_server_that_cannot_be_reached_costs_the_mail_not_the_sign_up() {
    let nobody = server::free_port();
    let gw = Gateway::builder()
        .arg("--smtp-url")
        .arg(&format!("smtp://127.0.0.1:{nobody}"))
        .start()
        .await;
    let email = new_email();
    let (status, page, _) = Visitor::new(&gw).try_sign_up(&email, &[]).await;
    assert_eq!(status, 200, "{page}");
    let logged = poll_until(
        "the failed mail in the log",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            gw.stderr()
                .lines()
                .find(|l| l.contains("mail not sent"))
                .map(str::to_owned)
        },
    )
    .await;
    assert!(logged.contains("Confirm your email"), "{logged}");
    assert!(
        !gw.stderr().contains("verify-email?token="),
        "a link reached the log"
    );
}
