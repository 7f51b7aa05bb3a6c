//! Signing in: argon2id password hashes, the session cookie (a random token whose SHA-256 is
//! what the store keeps), CSRF tokens, and the `SignedIn` extractor of every page behind it.

use std::sync::Arc;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;
use time::{Duration, OffsetDateTime};

use super::error::DashboardError;
use crate::ids;
use crate::state::DashboardState;
use store::accounts::KeyHash;
use store::developers::Session;

pub const SESSION_COOKIE: &str = "svc_session";
/// The CSRF token of the signed-out forms (sign-in, sign-up): a double-submit cookie.
pub const CSRF_COOKIE: &str = "svc_csrf";
const SESSION_LIFETIME: Duration = Duration::hours(12);

pub fn hash_password(password: &str) -> Result<String, DashboardError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|_| DashboardError::PasswordHash)
}

/// Checks a password against a stored hash; also run against a dummy hash for unknown
/// emails, so that timing does not tell which emails have an account.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

pub fn tokens_match(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `Secure` when the operator says the dashboard is behind TLS, or the proxy in front says
/// this request came over https.
pub(super) fn secure(state: &DashboardState, headers: &HeaderMap) -> bool {
    state.config.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

pub fn set_cookie(
    state: &DashboardState,
    headers: &HeaderMap,
    name: &str,
    value: &str,
    max_age: Duration,
) -> (header::HeaderName, HeaderValue) {
    let secure = if secure(state, headers) {
        "; Secure"
    } else {
        ""
    };
    let value = format!(
        "{name}={value}; Path=/developers; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
        max_age.whole_seconds()
    );
    (
        header::SET_COOKIE,
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("")),
    )
}

/// Starts a session for a user; returns its cookie.
pub async fn start(
    state: &DashboardState,
    headers: &HeaderMap,
    user_id: &str,
    email: &str,
    account_id: &str,
) -> Result<(header::HeaderName, HeaderValue), DashboardError> {
    let token = ids::session_token();
    state
        .developers
        .insert_session(Session {
            token_hash: KeyHash::of(&token),
            user_id: user_id.to_owned(),
            email: email.to_owned(),
            account_id: account_id.to_owned(),
            csrf: ids::session_token(),
            expires_at: OffsetDateTime::now_utc() + SESSION_LIFETIME,
        })
        .await?;
    Ok(set_cookie(
        state,
        headers,
        SESSION_COOKIE,
        &token,
        SESSION_LIFETIME,
    ))
}

/// A signed-in request: its session. Pages behind sign-in take this; without a valid session
/// the browser is sent to the sign-in page.
pub struct SignedIn(pub Session);

impl SignedIn {
    /// Refuses a form whose CSRF token is not this session's.
    pub fn check_csrf(&self, token: &str) -> Result<(), DashboardError> {
        if tokens_match(token, &self.0.csrf) {
            Ok(())
        } else {
            Err(DashboardError::Csrf)
        }
    }
}

pub enum NotSignedIn {
    Redirect,
    Failed(DashboardError),
}

impl IntoResponse for NotSignedIn {
    fn into_response(self) -> Response {
        match self {
            Self::Redirect => Redirect::to("/developers/sign-in").into_response(),
            Self::Failed(e) => e.into_response(),
        }
    }
}

impl<S> FromRequestParts<S> for SignedIn
where
    S: Send + Sync,
    Arc<DashboardState>: FromRef<S>,
{
    type Rejection = NotSignedIn;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let token = cookie(&parts.headers, SESSION_COOKIE).ok_or(NotSignedIn::Redirect)?;
        let session = Arc::<DashboardState>::from_ref(state)
            .developers
            .session(&KeyHash::of(token))
            .await
            .map_err(|e| NotSignedIn::Failed(e.into()))?
            .ok_or(NotSignedIn::Redirect)?;
        Ok(Self(session))
    }
}
