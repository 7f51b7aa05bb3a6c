//! The dashboard's start-up settings, apart from its handlers so the shared state can hold
//! them without depending on the pages.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

use time::Duration;

use super::mail::Mailer;

/// Start-up settings of the dashboard.
#[derive(Clone, Debug)]
pub struct DashboardSettings {
    /// Mark cookies `Secure` on every request, not only those a proxy says came over https.
    pub secure_cookies: bool,
    /// A session unused this long is refused and deleted.
    pub session_idle: Duration,
    /// A session this old is refused and deleted, however busy.
    pub session_max: Duration,
    /// How long an invitation to an organization may be accepted.
    pub invitation_lifetime: Duration,
    /// apiCredits an account gets once its email is verified.
    pub signup_credits: u64,
    pub public_url: PublicUrl,
    /// Where the verification links and notices go.
    pub mailer: Arc<dyn Mailer>,
}

/// Where browsers reach the gateway: the base of the links the dashboard mails (email
/// verification) and of the payment provider's way back. Configured (`--public-url`), or else
/// the API listener's own address once bound (loopback when it listens on every address).
/// Never a request's `Host`, which whoever sends the request chooses.
#[derive(Clone, Debug, Default)]
pub struct PublicUrl {
    configured: Option<String>,
    listening: OnceLock<String>,
}

impl PublicUrl {
    /// `url` without its trailing slashes.
    pub fn configured(url: Option<&str>) -> Self {
        Self {
            configured: url.map(|u| u.trim_end_matches('/').to_owned()),
            listening: OnceLock::new(),
        }
    }

    pub fn is_configured(&self) -> bool {
        self.configured.is_some()
    }

    /// The API listener is bound to `addr`: the base when none is configured.
    pub fn listening_on(&self, addr: SocketAddr) {
        let ip = match addr.ip() {
            ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ip => ip,
        };
        // Set once, by the one listener; a second call changes nothing.
        let _ = self
            .listening
            .set(format!("http://{}", SocketAddr::new(ip, addr.port())));
    }

    /// `path` (from `/`) under the base.
    pub fn to(&self, path: &str) -> String {
        let base = self
            .configured
            .as_deref()
            .or(self.listening.get().map(String::as_str))
            .unwrap_or("http://127.0.0.1");
        format!("{base}{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_url_wins_over_the_listeners_address() {
        let url = PublicUrl::configured(Some("https://gw.example.com/"));
        url.listening_on("0.0.0.0:8080".parse().expect("addr"));
        assert_eq!(url.to("/developers"), "https://gw.example.com/developers");
    }

    #[test]
    fn without_one_links_go_to_the_listener_on_loopback() {
        let url = PublicUrl::configured(None);
        url.listening_on("0.0.0.0:8080".parse().expect("addr"));
        assert_eq!(url.to("/developers"), "http://127.0.0.1:8080/developers");
    }
}
