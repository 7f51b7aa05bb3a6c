//! Signing in: argon2id password hashes, the session cookie (a random token whose SHA-256 is
//! what the store keeps), CSRF tokens, the `SignedIn` extractor of every page behind it, and
//! `Allowed<…>`, which also checks the member's role for the page.

use std::marker::PhantomData;
use std::sync::Arc;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;
use time::{Duration, OffsetDateTime};

use maud::html;

use super::error::DashboardError;
use super::layout::{bare, notice, refused, with_status};
use crate::client_address::ClientAddress;
use crate::state::DashboardState;
use gateway_core::ids;
use store::accounts::KeyHash;
use store::audit::{Actor, ActorKind};
use store::developers::{Permission, Session, SignInMethod, User};

pub const SESSION_COOKIE: &str = "svc_session";
/// The CSRF token of the signed-out forms (sign-in, sign-up): a double-submit cookie.
pub const CSRF_COOKIE: &str = "svc_csrf";

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
fn secure(state: &DashboardState, headers: &HeaderMap) -> bool {
    state.settings.secure_cookies
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
    // `Lax`, not `Strict`: a link to the dashboard from mail or another site (the payment
    // provider sending the browser back) arrives signed in. Cross-site POSTs still come
    // without the cookie, and every form carries a CSRF token besides.
    let value = format!(
        "{name}={value}; Path=/developers; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
        max_age.whole_seconds()
    );
    (
        header::SET_COOKIE,
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("")),
    )
}

/// Whoever uses the dashboard as `email` from `client`, as the audit log names them.
pub fn actor(email: &str, client: ClientAddress) -> Actor {
    Actor::new(
        ActorKind::DashboardUser,
        email,
        client.0.map(|ip| ip.to_string()),
    )
}

/// Starts a session for a user signing in with a password from `client`; returns its
/// cookie. Always a new token (a session the browser had before is ended by the caller), so a
/// session id planted before sign-in never becomes a signed-in one.
pub async fn start(
    state: &DashboardState,
    headers: &HeaderMap,
    user: &User,
    method: SignInMethod,
    client: ClientAddress,
) -> Result<(header::HeaderName, HeaderValue), DashboardError> {
    let (token, session) = new_session(state, user);
    state
        .developers
        .insert_session(session, method, &actor(&user.email, client))
        .await?;
    Ok(set_cookie(
        state,
        headers,
        SESSION_COOKIE,
        &token,
        state.settings.session_max,
    ))
}

/// A new session of `user` and the token its cookie carries.
fn new_session(state: &DashboardState, user: &User) -> (String, Session) {
    let token = ids::session_token();
    let now = OffsetDateTime::now_utc();
    let session = Session {
        token_hash: KeyHash::of(&token),
        user_id: user.id.clone(),
        email: user.email.clone(),
        account_id: user.account_id.clone(),
        role: user.role,
        email_verified: user.email_verified_at.is_some(),
        csrf: ids::session_token(),
        expires_at: now + state.settings.session_max,
        last_used_at: now,
    };
    (token, session)
}

/// A signed-in request of a user whose email is verified: its session. Pages behind sign-in
/// take this; without a valid session the browser is sent to the sign-in page, and a user not
/// verified yet gets the page that asks to verify (nothing of the account is shown or changed
/// before).
pub struct SignedIn(pub Session);

/// A signed-in request, verified or not: signing out takes this.
pub struct AnySession(pub Session);

fn check_csrf(session: &Session, token: &str) -> Result<(), DashboardError> {
    if tokens_match(token, &session.csrf) {
        Ok(())
    } else {
        Err(DashboardError::Csrf)
    }
}

impl SignedIn {
    /// Refuses a form whose CSRF token is not this session's.
    pub fn check_csrf(&self, token: &str) -> Result<(), DashboardError> {
        check_csrf(&self.0, token)
    }
}

impl AnySession {
    pub fn check_csrf(&self, token: &str) -> Result<(), DashboardError> {
        check_csrf(&self.0, token)
    }
}

/// A signed-in request of a verified member whose role has the permission `P` names: pages
/// and forms beyond the overview and usage take this, so the check is in the handler's
/// signature. Any other role gets the refusal page (403), never the page.
pub struct Allowed<P> {
    pub session: Session,
    needs: PhantomData<P>,
}

/// The permission a page needs, named as a type for [`Allowed`].
pub trait Needs {
    const PERMISSION: Permission;
}

/// The marker types of [`Needs`].
pub mod needs {
    use super::{Needs, Permission};

    /// Creating keys and revoking one's own.
    pub struct Keys;
    pub struct Billing;
    pub struct Members;
    pub struct Audit;

    impl Needs for Keys {
        const PERMISSION: Permission = Permission::Keys;
    }
    impl Needs for Billing {
        const PERMISSION: Permission = Permission::Billing;
    }
    impl Needs for Members {
        const PERMISSION: Permission = Permission::Members;
    }
    impl Needs for Audit {
        const PERMISSION: Permission = Permission::Audit;
    }
}

impl<P> Allowed<P> {
    pub fn check_csrf(&self, token: &str) -> Result<(), DashboardError> {
        check_csrf(&self.session, token)
    }
}

pub enum NotSignedIn {
    Redirect,
    /// Signed in, in a role without the page's permission: the refusal page (403).
    Forbidden(Session),
    /// Signed in, email not verified yet: the page that says so (200 for a page, 403 for a
    /// form it would have changed something with).
    Unverified(Session, bool),
    Failed(DashboardError),
}

impl IntoResponse for NotSignedIn {
    fn into_response(self) -> Response {
        match self {
            Self::Redirect => Redirect::to("/developers/sign-in").into_response(),
            Self::Unverified(session, read_only) => {
                let status = if read_only {
                    StatusCode::OK
                } else {
                    StatusCode::FORBIDDEN
                };
                with_status(status, verify_first(&session))
            }
            Self::Forbidden(session) => with_status(StatusCode::FORBIDDEN, refused(&session)),
            Self::Failed(e) => e.into_response(),
        }
    }
}

/// What a user whose email is not verified sees of the dashboard.
fn verify_first(session: &Session) -> maud::Markup {
    bare(
        "Verify your email",
        html! {
            (notice("info", &format!("Follow the link we sent to {} to confirm the address. Until then you cannot create keys or add credits.", session.email)))
            p.hint { "No message, or the link expired? Sign up again with the same email and password to get a new link." }
            form method="post" action="/developers/sign-out" {
                input type="hidden" name="csrf" value=(session.csrf);
                button type="submit" { "Sign out" }
            }
        },
    )
}

async fn session_of<S>(parts: &Parts, state: &S) -> Result<Session, NotSignedIn>
where
    S: Send + Sync,
    Arc<DashboardState>: FromRef<S>,
{
    let token = cookie(&parts.headers, SESSION_COOKIE).ok_or(NotSignedIn::Redirect)?;
    let state = Arc::<DashboardState>::from_ref(state);
    state
        .developers
        .session(&KeyHash::of(token), state.settings.session_idle)
        .await
        .map_err(|e| NotSignedIn::Failed(e.into()))?
        .ok_or(NotSignedIn::Redirect)
}

impl<S> FromRequestParts<S> for SignedIn
where
    S: Send + Sync,
    Arc<DashboardState>: FromRef<S>,
{
    type Rejection = NotSignedIn;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let session = session_of(parts, state).await?;
        if !session.email_verified {
            let read_only = matches!(parts.method, Method::GET | Method::HEAD);
            return Err(NotSignedIn::Unverified(session, read_only));
        }
        Ok(Self(session))
    }
}

impl<S, P> FromRequestParts<S> for Allowed<P>
where
    S: Send + Sync,
    Arc<DashboardState>: FromRef<S>,
    P: Needs,
{
    type Rejection = NotSignedIn;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let SignedIn(session) = SignedIn::from_request_parts(parts, state).await?;
        if !session.role.may(P::PERMISSION) {
            return Err(NotSignedIn::Forbidden(session));
        }
        Ok(Self {
            session,
            needs: PhantomData,
        })
    }
}

impl<S> FromRequestParts<S> for AnySession
where
    S: Send + Sync,
    Arc<DashboardState>: FromRef<S>,
{
    type Rejection = NotSignedIn;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(session_of(parts, state).await?))
    }
}
