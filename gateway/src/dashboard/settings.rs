//! The dashboard's start-up settings, apart from its handlers so the shared state can hold
//! them without depending on the pages.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

use time::Duration;

use openidconnect::core::CoreProviderMetadata;
use openidconnect::{ClientId, ClientSecret, IssuerUrl};
use store::developers::Role;

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
    /// Single sign-on through an OpenID Connect provider, when configured.
    pub sso: Option<Arc<SsoSettings>>,
    /// How a claimed domain's proof is looked up and re-checked.
    pub domains: Arc<super::domains::DomainChecks>,
}

/// Where "Sign in with SSO" starts a sign-in at the provider.
pub const SSO_START_PATH: &str = "/developers/sso";
/// Where the provider sends the browser back: the client's redirect URI under the public URL.
pub const SSO_CALLBACK_PATH: &str = "/developers/sso/callback";

/// The deployment's OpenID Connect provider and this gateway's client at it. The secret is
/// `ClientSecret`, whose `Debug` shows no value, so these settings can be logged.
#[derive(Debug)]
pub struct SsoSettings {
    pub issuer: IssuerUrl,
    pub client_id: ClientId,
    pub client_secret: ClientSecret,
    /// The role of a new member placed in the organization that claimed their email's domain.
    pub default_role: Role,
    /// The provider's discovery document (its endpoints and signing keys), fetched at the
    /// first sign-in that needs it and again once it is [`DISCOVERY_TTL`] old, so a rotated
    /// key is known within that time (providers publish a new key well before signing with
    /// it). The lock is held while fetching, so concurrent sign-ins fetch once.
    pub provider: tokio::sync::Mutex<Option<Arc<Provider>>>,
}

/// How long a discovery document (and its keys) is used before it is fetched again.
pub const DISCOVERY_TTL: std::time::Duration = std::time::Duration::from_secs(300);

/// The provider as discovered, and the client that speaks to it.
#[derive(Debug)]
pub struct Provider {
    /// When it was fetched.
    pub fetched_at: std::time::Instant,
    /// Its endpoints and keys (JWKS).
    pub metadata: CoreProviderMetadata,
    /// No redirects followed (a token endpoint must not send the code elsewhere), bounded in
    /// time.
    pub http: reqwest::Client,
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
