//! OpenID Providers for the dashboard's single sign-on tests:
//! - [`OidcProvider`]: the certified npm `oidc-provider` (tests/src/oidc_provider.mjs), one
//!   static client, its development login (any login name is an account whose verified email
//!   it is);
//! - [`MockIssuer`]: discovery, JWKS, an authorization endpoint that sends the browser straight
//!   back, and a token endpoint whose ID token a test breaks on purpose ([`Tamper`]), signed
//!   with an RSA key made for the run, so that each check of the gateway can be seen refusing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openidconnect::core::{
    CoreHmacKey, CoreIdToken, CoreIdTokenClaims, CoreJsonWebKeySet, CoreJwsSigningAlgorithm,
    CoreRsaPrivateSigningKey,
};
use openidconnect::{JsonWebKeyId, PrivateSigningKey};
use serde_json::{json, Value};
use tokio::process::Command;

use crate::gateway::workspace_root;
use crate::server::{listening_on, ServerProcess};

/// The gateway's client at either provider.
pub const CLIENT_ID: &str = "svc-gateway-dashboard";
pub const CLIENT_SECRET: &str = "oidc-client-secret-0123456789abcdef";

/// The node_modules folder scripts/test installs `oidc-provider` in (`NODE_CLIENTS` names
/// another).
fn node_modules() -> PathBuf {
    std::env::var_os("NODE_CLIENTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache/node-clients/node_modules"))
}

/// The real provider on `port`, its one client redirecting to `redirect_uri`.
pub struct OidcProvider {
    pub port: u16,
    process: ServerProcess,
}

impl OidcProvider {
    pub async fn start(port: u16, redirect_uri: &str) -> OidcProvider {
        let modules = node_modules();
        assert!(
            modules.join("oidc-provider").is_dir(),
            "oidc-provider not found in {}; scripts/test installs it",
            modules.display()
        );
        let mut cmd = Command::new("node");
        cmd.env("NODE_MODULES", &modules)
            .arg(workspace_root().join("tests/src/oidc_provider.mjs"))
            .arg(port.to_string())
            .args([CLIENT_ID, CLIENT_SECRET, redirect_uri]);
        match listening_on("oidc-provider", cmd, port, Duration::from_secs(20)).await {
            Ok((port, process)) => OidcProvider { port, process },
            Err(e) => panic!("oidc-provider did not start: {e}"),
        }
    }

    /// Its issuer URL, for `--dashboard-oidc-issuer`.
    pub fn issuer(&self) -> String {
        issuer_on(self.port)
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        self.process.abandon(libc::SIGKILL);
    }
}

/// The issuer URL of a provider listening on `port`.
pub fn issuer_on(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// How the mock's next ID token is broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tamper {
    None,
    /// Not the nonce the gateway sent.
    WrongNonce,
    /// `exp` an hour ago.
    Expired,
    /// Signed with another key under the JWKS key's id.
    BadSignature,
    /// For another client.
    WrongAudience,
    /// `email_verified: false`.
    EmailUnverified,
    /// Signed `HS256` with the client secret (which the discovery document lists too).
    Hs256ClientSecret,
    /// `iat` a day ahead.
    IssuedAhead,
}

struct Shared {
    issuer: String,
    key: CoreRsaPrivateSigningKey,
    other_key: CoreRsaPrivateSigningKey,
    tamper: Tamper,
    /// The email the next ID token names.
    email: String,
    /// The nonce of the last authorization request.
    nonce: String,
}

/// The mock provider (see the module's comment).
pub struct MockIssuer {
    pub port: u16,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

const KEY_ID: &str = "mock-key";

/// A new 2048-bit RSA key, PKCS#1 PEM, from the `openssl` command.
fn rsa_key() -> CoreRsaPrivateSigningKey {
    let out = std::process::Command::new("openssl")
        .args(["genrsa", "-traditional", "2048"])
        .output()
        .expect("openssl genrsa");
    let pem = String::from_utf8(out.stdout).expect("PEM");
    CoreRsaPrivateSigningKey::from_pem(&pem, Some(JsonWebKeyId::new(KEY_ID.to_owned())))
        .expect("an RSA key")
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl MockIssuer {
    pub async fn start() -> MockIssuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the mock issuer");
        let port = listener.local_addr().expect("local addr").port();
        let shared = Arc::new(Mutex::new(Shared {
            issuer: issuer_on(port),
            key: rsa_key(),
            other_key: rsa_key(),
            tamper: Tamper::None,
            email: String::new(),
            nonce: String::new(),
        }));
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/jwks", get(jwks))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockIssuer { port, shared, task }
    }

    pub fn issuer(&self) -> String {
        issuer_on(self.port)
    }

    /// The next ID token names `email` and is broken as `tamper` says.
    pub fn next_token(&self, email: &str, tamper: Tamper) {
        let mut shared = lock(&self.shared);
        shared.email = email.to_owned();
        shared.tamper = tamper;
    }
}

impl Drop for MockIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn discovery(State(shared): State<Arc<Mutex<Shared>>>) -> Json<Value> {
    let issuer = lock(&shared).issuer.clone();
    Json(json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"),
        "jwks_uri": format!("{issuer}/jwks"),
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
        // HS256 listed too, as providers that offer it to confidential clients do: the gateway
        // must still take RS256 against the JWKS only.
        "id_token_signing_alg_values_supported": ["RS256", "HS256"],
    }))
}

async fn jwks(State(shared): State<Arc<Mutex<Shared>>>) -> Json<CoreJsonWebKeySet> {
    let key = lock(&shared).key.as_verification_key();
    Json(CoreJsonWebKeySet::new(vec![key]))
}

/// Sends the browser straight back with a code, as a provider does once the user signed in.
async fn authorize(
    State(shared): State<Arc<Mutex<Shared>>>,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let field = |name: &str| query.get(name).cloned().unwrap_or_default();
    lock(&shared).nonce = field("nonce");
    let back = format!(
        "{}?code=mock-code&state={}",
        field("redirect_uri"),
        field("state")
    );
    Redirect::to(&back).into_response()
}

async fn token(State(shared): State<Arc<Mutex<Shared>>>) -> Json<Value> {
    let shared = lock(&shared);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let tamper = shared.tamper;
    let claims = json!({
        "iss": shared.issuer,
        "aud": if tamper == Tamper::WrongAudience { "someone-else" } else { CLIENT_ID },
        "sub": shared.email,
        "iat": if tamper == Tamper::IssuedAhead { now + 86_400 } else { now },
        "exp": if tamper == Tamper::Expired { now - 3600 } else { now + 300 },
        "nonce": if tamper == Tamper::WrongNonce { "not-the-nonce".to_owned() } else { shared.nonce.clone() },
        "email": shared.email,
        "email_verified": tamper != Tamper::EmailUnverified,
    });
    let claims: CoreIdTokenClaims = serde_json::from_value(claims).expect("ID token claims");
    let key = if tamper == Tamper::BadSignature {
        &shared.other_key
    } else {
        &shared.key
    };
    let id_token = if tamper == Tamper::Hs256ClientSecret {
        CoreIdToken::new(
            claims,
            &CoreHmacKey::new(CLIENT_SECRET.as_bytes()),
            CoreJwsSigningAlgorithm::HmacSha256,
            None,
            None,
        )
    } else {
        CoreIdToken::new(
            claims,
            key,
            CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
            None,
            None,
        )
    }
    .expect("a signed ID token");
    Json(json!({
        "access_token": "mock-access-token",
        "token_type": "Bearer",
        "expires_in": 300,
        "id_token": id_token.to_string(),
    }))
}
