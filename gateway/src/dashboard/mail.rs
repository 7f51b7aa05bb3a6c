//! The emails the dashboard sends: the link that verifies an address, and the notice to an
//! address that already has an account. No mail server is configured in this build: each is
//! written to the log at info level (target `gateway::mail`), its link the only secret in it,
//! for the operator to deliver by hand (and for tests to read).

use super::settings::PublicUrl;

pub enum Mail<'a> {
    /// Confirms `to` for the sign-up that chose a password: the link verifies the address.
    Verify { to: &'a str, token: &'a str },
    /// Someone signed up with the address of an existing, verified account: its owner is told,
    /// and nothing else happens.
    AlreadySignedUp { to: &'a str },
}

/// The path of a verification link (under the public URL).
pub const VERIFY_PATH: &str = "/developers/verify-email";

pub fn send(public_url: &PublicUrl, mail: Mail<'_>) {
    match mail {
        Mail::Verify { to, token } => {
            let link = public_url.to(&format!("{VERIFY_PATH}?token={token}"));
            tracing::info!(
                target: "gateway::mail",
                to,
                subject = "Confirm your email",
                link = %link,
                "mail: follow the link to confirm this address and finish signing up \
                 (it works once, within 24 hours; ignore it if you did not sign up)"
            );
        }
        Mail::AlreadySignedUp { to } => {
            let sign_in = public_url.to("/developers/sign-in");
            tracing::info!(
                target: "gateway::mail",
                to,
                subject = "You already have an account",
                link = %sign_in,
                "mail: someone tried to sign up with this address, which already has an \
                 account; sign in instead (nothing changed)"
            );
        }
    }
}
