//! Google OAuth access tokens for the `vertex` adapter, cached per credential and fetched
//! again five minutes before they expire (or half-way, for a token given with less time
//! left), one fetch at a time however many turns wait for it.
//!
//! Two sources, as Google's own client libraries have them:
//! - a service account's JSON key file (the route's `googleCredentialsSecretRef`): a JWT
//!   asserting the account (`iss`), the `cloud-platform` scope, the file's `token_uri` as the
//!   audience and an hour's lifetime, signed RS256 with the file's private key, exchanged at
//!   that `token_uri` (the JWT bearer grant of RFC 7523);
//! - else the metadata server (GKE Workload Identity, a GCE VM's service account), at
//!   `GCE_METADATA_HOST` when that is set (as Google's libraries read it; a test's mock), else
//!   `metadata.google.internal`.
//!
//! The signing is `jsonwebtoken` (RS256 with ring, the crypto every TLS client here uses).
//! `gcp_auth` and `yup-oauth2` do the same and cache too, but each brings its own HTTP client
//! stack (hyper with its own TLS set-up, outside the gateway's timeouts and proxies), and the
//! two token requests are one reqwest call each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crds::config::{Secret, Timeouts, Upstream};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use super::http::transport_error;
use super::ProviderError;

/// What the token lets the gateway do: Vertex AI takes the `cloud-platform` scope.
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// How long a signed assertion is valid: an hour, the most Google accepts.
const ASSERTION_SECS: u64 = 3600;
const METADATA_HOST: &str = "metadata.google.internal";
const METADATA_TOKEN: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// How long before its expiry a token is replaced.
const EARLY: Duration = Duration::from_secs(300);
const CONNECT: Duration = Duration::from_secs(5);

/// Where a route's tokens come from; its key names its cache slot.
#[derive(Clone)]
pub struct Source(Key);

#[derive(Clone, Hash, PartialEq, Eq)]
enum Key {
    /// A service account's key file, as the Secret holds it.
    KeyFile(String),
    Metadata,
}

/// The cached tokens, by source.
#[derive(Default)]
pub struct Tokens {
    slots: Mutex<HashMap<Key, Arc<Slot>>>,
    oauth: OnceLock<reqwest::Client>,
    metadata: OnceLock<reqwest::Client>,
}

#[derive(Default)]
struct Slot {
    cached: Mutex<Option<Cached>>,
    /// Held while a token is fetched: the turns that come meanwhile wait for that one.
    refresh: tokio::sync::Mutex<()>,
    /// When the last fetch failed, and how: the turns that waited for it fail the same way
    /// instead of each trying again in turn (behind a token endpoint that is down, the last of
    /// them would wait for all the others' timeouts).
    failed: Mutex<Option<(Instant, Failure)>>,
}

#[derive(Clone, Copy)]
enum Failure {
    Timeout,
    Unavailable,
    Upstream,
}

impl Failure {
    fn of(error: &ProviderError) -> Failure {
        match error {
            ProviderError::Timeout => Failure::Timeout,
            ProviderError::Unavailable => Failure::Unavailable,
            _ => Failure::Upstream,
        }
    }

    fn error(self) -> ProviderError {
        match self {
            Failure::Timeout => ProviderError::Timeout,
            Failure::Unavailable => ProviderError::Unavailable,
            Failure::Upstream => ProviderError::Upstream,
        }
    }
}

struct Cached {
    token: Secret,
    replace_at: Instant,
}

impl Slot {
    fn fresh(&self) -> Option<Secret> {
        let cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        cached
            .as_ref()
            .filter(|c| Instant::now() < c.replace_at)
            .map(|c| c.token.clone())
    }
}

/// The fields of a service account's key file that a token takes.
#[derive(Deserialize)]
struct KeyFile {
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    token_uri: String,
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

/// The answer of both token endpoints.
#[derive(Deserialize)]
struct Granted {
    access_token: String,
    expires_in: u64,
}

impl Tokens {
    /// The source of `upstream`'s tokens: its key file, else the metadata server.
    pub fn source(upstream: &Upstream) -> Source {
        Source(match &upstream.google_credentials {
            Some(file) => Key::KeyFile(file.expose().to_owned()),
            None => Key::Metadata,
        })
    }

    /// A token of `source` valid for at least a few more minutes: the cached one, else a new
    /// one fetched within the upstream's first-byte timeout.
    pub async fn token(
        &self,
        source: &Source,
        timeouts: Timeouts,
    ) -> Result<Secret, ProviderError> {
        let slot = self.slot(&source.0);
        if let Some(token) = slot.fresh() {
            return Ok(token);
        }
        let asked = Instant::now();
        let _refreshing = slot.refresh.lock().await;
        if let Some(token) = slot.fresh() {
            return Ok(token);
        }
        let failed = *slot.failed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, failure)) = failed.filter(|(at, _)| *at >= asked) {
            tracing::debug!(ago = ?at.elapsed(), "the token request this turn waited for failed");
            return Err(failure.error());
        }
        let wait = Duration::from_millis(timeouts.first_byte_ms);
        let fetched = tokio::time::timeout(wait, self.fetch(&source.0))
            .await
            .unwrap_or_else(|_| {
                tracing::warn!("the Google token request timed out");
                Err(ProviderError::Timeout)
            });
        let granted = fetched.inspect_err(|e| {
            *slot.failed.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((Instant::now(), Failure::of(e)));
        })?;
        let token = Secret(granted.access_token);
        *slot.cached.lock().unwrap_or_else(|e| e.into_inner()) = Some(Cached {
            token: token.clone(),
            replace_at: Instant::now() + kept_for(Duration::from_secs(granted.expires_in)),
        });
        Ok(token)
    }

    /// Drops `token` from `source`'s slot (Vertex refused it), unless another replaced it.
    pub fn forget(&self, source: &Source, token: &Secret) {
        let slot = self.slot(&source.0);
        let mut cached = slot.cached.lock().unwrap_or_else(|e| e.into_inner());
        if cached.as_ref().is_some_and(|c| c.token == *token) {
            *cached = None;
        }
    }

    fn slot(&self, key: &Key) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(key.clone()).or_default().clone()
    }

    async fn fetch(&self, key: &Key) -> Result<Granted, ProviderError> {
        let request = match key {
            Key::KeyFile(file) => {
                let (token_uri, body) = assertion(file)?;
                client(&self.oauth, false)?
                    .post(token_uri)
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(body)
            }
            Key::Metadata => {
                let host = std::env::var("GCE_METADATA_HOST")
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| METADATA_HOST.to_owned());
                client(&self.metadata, true)?
                    .get(format!("http://{host}{METADATA_TOKEN}"))
                    .header("metadata-flavor", "Google")
            }
        };
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        if !status.is_success() {
            // The body says why (`invalid_grant`...) but is not logged: it may quote the
            // assertion.
            tracing::warn!(
                status = status.as_u16(),
                source = match key {
                    Key::KeyFile(_) => "service account key",
                    Key::Metadata => "metadata server",
                },
                "the Google token request was refused"
            );
            return Err(ProviderError::Upstream);
        }
        response.json::<Granted>().await.map_err(|e| {
            tracing::warn!(error = %e, "the Google token answer is not a token");
            ProviderError::Upstream
        })
    }
}

/// How long a token given for `lifetime` is used: until 5 minutes before it expires, or for
/// half its life when that is shorter (a metadata server may hand out a token it got a while
/// ago).
fn kept_for(lifetime: Duration) -> Duration {
    lifetime - EARLY.min(lifetime / 2)
}

/// The token request of a service account's key file: its `token_uri`, and the form body
/// carrying the signed assertion.
fn assertion(file: &str) -> Result<(String, String), ProviderError> {
    // A Secret that is no key file was refused when the route was applied: this is a file
    // that changed since, or one no API server saw.
    let unusable = |what: &dyn std::fmt::Display| {
        tracing::error!(error = %what, "the vertex upstream's service account key is unusable");
        ProviderError::Unavailable
    };
    let file: KeyFile = serde_json::from_str(file).map_err(|e| unusable(&e))?;
    let key = EncodingKey::from_rsa_pem(file.private_key.as_bytes()).map_err(|e| unusable(&e))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let claims = Claims {
        iss: &file.client_email,
        scope: SCOPE,
        aud: &file.token_uri,
        iat: now,
        exp: now + ASSERTION_SECS,
    };
    let mut header = Header::new(Algorithm::RS256);
    header.kid = file.private_key_id.clone();
    let jwt = jsonwebtoken::encode(&header, &claims, &key).map_err(|e| unusable(&e))?;
    let body = format!(
        "grant_type={}&assertion={}",
        utf8_percent_encode(JWT_BEARER, NON_ALPHANUMERIC),
        utf8_percent_encode(&jwt, NON_ALPHANUMERIC)
    );
    Ok((file.token_uri, body))
}

/// The client of one kind of token request, built once. The metadata server is a link-local
/// address of the node: never asked through a proxy.
fn client(
    cell: &OnceLock<reqwest::Client>,
    metadata: bool,
) -> Result<reqwest::Client, ProviderError> {
    if let Some(client) = cell.get() {
        return Ok(client.clone());
    }
    let mut builder = reqwest::Client::builder().connect_timeout(CONNECT);
    if metadata {
        builder = builder.no_proxy();
    }
    let client = builder.build().map_err(|e| {
        tracing::error!(error = %e, "cannot build the Google token client");
        ProviderError::Unavailable
    })?;
    Ok(cell.get_or_init(|| client).clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metadata server that counts the requests it gets and refuses each, slowly.
    async fn refusing_metadata_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let host = listener.local_addr().expect("an address").to_string();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = asked.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = [0; 4096];
                    let _ = socket.read(&mut request).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = socket
                        .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        (host, asked)
    }

    #[tokio::test]
    async fn the_turns_waiting_for_a_token_request_that_fails_fail_with_it_without_asking_again() {
        let (host, asked) = refusing_metadata_server().await;
        // This test's process alone reads it (nextest runs each test in a process of its own).
        std::env::set_var("GCE_METADATA_HOST", &host);
        let tokens = Tokens::default();
        let source = Source(Key::Metadata);
        let turns = (0..5).map(|_| tokens.token(&source, Timeouts::default()));
        let outcomes = futures::future::join_all(turns).await;
        assert!(outcomes
            .iter()
            .all(|o| matches!(o, Err(ProviderError::Upstream))));
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one request for five turns"
        );
        // A turn that comes after the failure asks again.
        assert!(tokens.token(&source, Timeouts::default()).await.is_err());
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn a_token_is_replaced_five_minutes_before_it_expires_or_half_way_when_it_lives_less() {
        let secs = Duration::from_secs;
        assert_eq!(kept_for(secs(3599)), secs(3299));
        assert_eq!(kept_for(secs(600)), secs(300));
        assert_eq!(kept_for(secs(200)), secs(100));
        assert_eq!(kept_for(secs(0)), secs(0));
    }
}
