//! The dashboard's mail through an SMTP server (`--smtp-url`, here aiosmtpd keeping a maildir):
//! a sign-up's verification link arrives in the mailbox from `--mail-from` and never in the
//! log, and following it verifies the email; a mail server that cannot be reached costs the
//! mail (logged without its link), never the sign-up's answer. An invitation to an
//! organization is mailed the same way, and accepted in standalone mode's in-process stores.

use std::time::Duration;

use e2e::smtp::SmtpSink;
use e2e::visitor::{link_in, link_to, new_email, Visitor, INVITATION_PATH, PASSWORD, VERIFY_PATH};
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

/// The newest link to `path` in a mail to `email` in the sink's mailbox.
async fn mailed_link(smtp: &SmtpSink, email: &str, path: &str) -> String {
    poll_until(
        &format!("a mail to {email} with a link to {path}"),
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            smtp.messages()
                .into_iter()
                .map(|m| unfolded(&m))
                .filter(|m| m.contains(email))
                .find_map(|m| link_to(&m, path))
        },
    )
    .await
}

#[tokio::test]
async fn an_invitation_is_mailed_through_smtp_and_accepted_in_standalone_mode() {
    let smtp = SmtpSink::start().await;
    let gw = Gateway::builder()
        .arg("--smtp-url")
        .arg(&smtp.url())
        .arg("--sign-ups-per-minute=100")
        .start()
        .await;
    let (owner_email, invitee_email) = (new_email(), new_email());
    let (mut owner, mut invitee) = (Visitor::new(&gw), Visitor::new(&gw));
    for (visitor, email) in [(&mut owner, &owner_email), (&mut invitee, &invitee_email)] {
        let (status, page, _) = visitor.try_sign_up(email, &[]).await;
        assert_eq!(status, 200, "{page}");
        let link = mailed_link(&smtp, email, VERIFY_PATH).await;
        assert_eq!(visitor.follow_verification_link(&link).await.0, 200);
        assert_eq!(visitor.sign_in(email, PASSWORD).await.0, 303);
    }
    let (status, page) = owner.invite(&invitee_email, "billing").await;
    assert_eq!(status, 200, "{page}");
    let link = mailed_link(&smtp, &invitee_email, INVITATION_PATH).await;
    let token = &link[link.find("token=").expect("a token") + "token=".len()..];
    assert!(
        !gw.stderr().contains(token),
        "the invitation's token is in the gateway's log"
    );
    let (status, page) = invitee.accept_invitation(&link).await;
    assert_eq!(status, 303, "{page}");
    assert_eq!(
        invitee.get("/developers/billing").await.0,
        200,
        "billing now"
    );
    assert_eq!(invitee.get("/developers/keys").await.0, 403);
    let (_, members) = owner.get("/developers/members").await;
    assert!(
        members.contains(&format!("data-member=\"{invitee_email}\"")),
        "{members}"
    );
}

/// Past the 32 mails being sent at once, the next wait in the mailer's queue instead of being
/// dropped: with the mail server's link cut, 40 invitations hold 32 sends and queue 8
/// (`gateway_mail_queued` 40); once the link is restored the 8 queued mails are delivered.
#[tokio::test]
async fn mails_past_those_in_flight_are_queued_and_sent_not_dropped() {
    let smtp = SmtpSink::start().await;
    let link = TcpProxy::start(smtp.port).await;
    let gw = Gateway::builder()
        .arg("--smtp-url")
        .arg(&format!("smtp://127.0.0.1:{}", link.port))
        .arg("--sign-ups-per-minute=100")
        .start()
        .await;
    let owner_email = new_email();
    let mut owner = Visitor::new(&gw);
    let (status, page, _) = owner.try_sign_up(&owner_email, &[]).await;
    assert_eq!(status, 200, "{page}");
    let verify = mailed_link(&smtp, &owner_email, VERIFY_PATH).await;
    assert_eq!(owner.follow_verification_link(&verify).await.0, 200);
    assert_eq!(owner.sign_in(&owner_email, PASSWORD).await.0, 303);

    link.cut();
    let invitees: Vec<String> = (0..40).map(|_| new_email()).collect();
    for invitee in &invitees {
        let (status, page) = owner.invite(invitee, "developer").await;
        assert_eq!(status, 200, "{page}");
    }
    let queued = gw
        .metrics()
        .await
        .get("gateway_mail_queued", &[])
        .unwrap_or(0.0);
    assert_eq!(queued, 40.0, "32 being sent, 8 waiting");
    link.restore();
    // The 32 stalled sends end with their connections; the 8 queued ones are sent.
    let delivered = poll_until(
        "the queued invitations delivered",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let received = smtp
                .messages()
                .into_iter()
                .filter(|m| invitees.iter().any(|i| m.contains(i.as_str())))
                .count();
            (received >= 8).then_some(received)
        },
    )
    .await;
    assert!(delivered >= 8, "{delivered}");
}
