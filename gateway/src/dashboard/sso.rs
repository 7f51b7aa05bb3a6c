//! Single sign-on through the deployment's OpenID Connect provider: the authorization code
//! flow with PKCE, `state` and `nonce` (the `openidconnect` crate builds the request and
//! checks the ID token: its signature against the provider's JWKS with an algorithm its
//! discovery document lists (never an HMAC with the client secret), `iss`, `aud`, `exp`, `iat`
//! at most 5 minutes ahead, the nonce). An email claim must be in NFKC form.
//!
//! `/developers/sso` starts a sign-in: the `state`, `nonce` and PKCE verifier go to the
//! browser in a short-lived `HttpOnly`, `SameSite=Lax` cookie, and the SHA-256 of the `state`
//! to the store; `/developers/sso/callback` takes that record once (a replayed callback finds
//! it gone), so a callback is accepted only by the browser that started it, only once.
//!
//! Who gets in: a verified email (`email_verified`) of an existing, verified user signs in as
//! them; a new email joins the organization that claimed its domain, in the configured default
//! role. An email whose domain no organization claimed is refused (no organization would own
//! the account; an owner claims the domain on the members page first). Refusals after the ID
//! token was verified are audited on the account they concern; those before it (forged,
//! replayed or tampered callbacks) name no one trustworthy and are only logged, so that
//! anonymous traffic cannot grow the append-only log.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreIdTokenVerifier, CoreJwsSigningAlgorithm,
    CoreProviderMetadata,
};
use openidconnect::{
    AuthorizationCode, CsrfToken, Nonce, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope,
    TokenResponse,
};
use serde::Deserialize;
use time::{Duration, OffsetDateTime};

use super::account::{client_wait, normalize};
use super::error::DashboardError;
use super::layout::{bare, notice, with_status};
use super::session::{self, SESSION_COOKIE};
use super::settings::{Provider, SsoSettings, DISCOVERY_TTL, SSO_CALLBACK_PATH, SSO_START_PATH};
use crate::client_address::ClientAddress;
use crate::state::DashboardState;
use gateway_core::ids;
use store::accounts::KeyHash;
use store::developers::{domain_of, SignInMethod, User};

/// The cookie that binds a sign-in started here to the browser that started it.
pub const SSO_COOKIE: &str = "svc_sso";
/// How long the provider may take to send the browser back.
const LOGIN_LIFETIME: Duration = Duration::minutes(10);
/// The longest `code` or `state` read from a callback: longer is not the provider's.
const MAX_PARAM_CHARS: usize = 2048;

#[derive(Deserialize)]
pub struct Callback {
    #[serde(default)]
    code: String,
    #[serde(default)]
    state: String,
    /// The provider's refusal (`access_denied`, …).
    #[serde(default)]
    error: Option<String>,
}

/// Why a callback is refused: the page says the first line, the log the rest.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("no sign-in was started from this browser, or it expired")]
    NoCookie,
    #[error("the callback's state is not this browser's")]
    WrongState,
    #[error("this sign-in was already used or expired")]
    Spent,
    #[error("the provider refused: {0}")]
    Provider(String),
    #[error("the code could not be exchanged: {0}")]
    Exchange(String),
    #[error("the provider sent no ID token")]
    NoIdToken,
    #[error("the ID token could not be verified: {0}")]
    IdToken(String),
    #[error("the provider did not say the email is verified")]
    EmailUnverified,
    #[error("the email claim is not in NFKC form (look-alike characters)")]
    EmailNotNormal,
    #[error("no organization here claimed the email's domain")]
    DomainNotClaimed(String),
    #[error("the dashboard user of this email has not verified it yet")]
    UserUnverified(Box<User>),
    /// Not a refusal: the store failed; answered as any store failure.
    #[error(transparent)]
    Store(#[from] store::accounts::StoreError),
}

impl Refused {
    /// What the refusal page says: nothing that helps a forger.
    fn message(&self) -> &'static str {
        match self {
            Self::NoCookie | Self::WrongState | Self::Spent => {
                "This sign-in link has expired or was already used. Start again."
            }
            Self::Provider(_) | Self::Exchange(_) | Self::NoIdToken | Self::IdToken(_) => {
                "The sign-in provider's answer could not be verified. Start again."
            }
            Self::EmailUnverified => "Your provider has not verified your email address.",
            Self::EmailNotNormal => {
                "Your provider's email address holds look-alike characters this dashboard does not accept."
            }
            Self::DomainNotClaimed(_) => {
                "No organization here uses single sign-on for your email's domain. Ask your organization's owner to claim it on the members page."
            }
            Self::UserUnverified(_) => {
                "Confirm your email with the link we sent at sign-up first, then sign in."
            }
            Self::Store(_) => "",
        }
    }

    /// The short name an audit row gives the refusal.
    fn reason(&self) -> &'static str {
        match self {
            Self::EmailUnverified => "email_unverified",
            Self::EmailNotNormal => "email_not_normal",
            Self::DomainNotClaimed(_) => "domain_not_claimed",
            Self::UserUnverified(_) => "user_unverified",
            _ => "callback",
        }
    }
}

fn sso_of(state: &DashboardState) -> Result<&Arc<SsoSettings>, DashboardError> {
    state.settings.sso.as_ref().ok_or(DashboardError::NotFound)
}

/// The provider's discovery document and the client that fetched it, fetched again once
/// [`DISCOVERY_TTL`] old; `None` (logged) while it cannot be reached and was never fetched (a
/// stale one is used while a fetch fails).
async fn provider(sso: &SsoSettings) -> Option<Arc<Provider>> {
    let mut held = sso.provider.lock().await;
    if let Some(fresh) = held
        .as_ref()
        .filter(|p| p.fetched_at.elapsed() < DISCOVERY_TTL)
    {
        return Some(fresh.clone());
    }
    let discovered = async {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        let metadata = CoreProviderMetadata::discover_async(sso.issuer.clone(), &http)
            .await
            .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?;
        Ok::<_, String>(Provider {
            fetched_at: std::time::Instant::now(),
            metadata,
            http,
        })
    }
    .await;
    match discovered {
        Ok(provider) => {
            let provider = Arc::new(provider);
            *held = Some(provider.clone());
            Some(provider)
        }
        Err(e) => {
            tracing::warn!(issuer = %sso.issuer.as_str(), error = %e, "OpenID Connect discovery failed");
            held.clone()
        }
    }
}

fn too_many_page(secs: u64) -> Response {
    let mut page = with_status(
        StatusCode::TOO_MANY_REQUESTS,
        bare(
            "Too many sign-ins",
            html! {
                (notice("error", &format!("Too many sign-in attempts from your network. Try again in {secs} seconds.")))
                p.alt { a href="/developers/sign-in" { "Back to sign-in" } }
            },
        ),
    );
    page.headers_mut()
        .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    page
}

fn unreachable_page() -> Response {
    with_status(
        StatusCode::BAD_GATEWAY,
        bare(
            "Single sign-on unavailable",
            html! {
                (notice("error", "The sign-in provider cannot be reached right now. Try again in a minute."))
                p.alt { a href="/developers/sign-in" { "Back to sign-in" } }
            },
        ),
    )
}

fn redirect_url(state: &DashboardState) -> Result<RedirectUrl, DashboardError> {
    RedirectUrl::new(state.settings.public_url.to(SSO_CALLBACK_PATH))
        .map_err(|_| DashboardError::NotFound)
}

/// `GET /developers/sso`: sends the browser to the provider.
pub async fn start(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    headers: HeaderMap,
) -> Result<Response, DashboardError> {
    let sso = sso_of(&state)?;
    // Each start stores a record (and may fetch the discovery document): braked per client
    // address like password sign-ins, so no client grows the table or calls the provider
    // without bound.
    if let Some(secs) = client_wait(&state.sign_ins, client).await? {
        return Ok(too_many_page(secs));
    }
    let Some(provider) = provider(sso).await else {
        return Ok(unreachable_page());
    };
    let client = CoreClient::from_provider_metadata(
        provider.metadata.clone(),
        sso.client_id.clone(),
        Some(sso.client_secret.clone()),
    )
    .set_redirect_uri(redirect_url(&state)?);
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let (url, csrf_state, nonce) = client
        .authorize_url(
            CoreAuthenticationFlow::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .add_scope(Scope::new("email".to_owned()))
        .set_pkce_challenge(challenge)
        .url();
    state
        .developers
        .insert_sso_login(
            &KeyHash::of(csrf_state.secret()),
            OffsetDateTime::now_utc() + LOGIN_LIFETIME,
        )
        .await?;
    // base64url, so `.` separates them.
    let value = format!(
        "{}.{}.{}",
        csrf_state.secret(),
        nonce.secret(),
        verifier.secret()
    );
    let cookie = session::set_cookie(&state, &headers, SSO_COOKIE, &value, LOGIN_LIFETIME);
    Ok(([cookie], Redirect::to(url.as_str())).into_response())
}

/// The browser's cookie: its `state`, `nonce` and PKCE verifier.
fn started(headers: &HeaderMap) -> Option<(&str, &str, &str)> {
    let mut parts = session::cookie(headers, SSO_COOKIE)?.split('.');
    let started = (parts.next()?, parts.next()?, parts.next()?);
    parts.next().is_none().then_some(started)
}

/// `GET /developers/sso/callback`: the provider sends the browser back with a code.
pub async fn callback(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    headers: HeaderMap,
    Query(callback): Query<Callback>,
) -> Result<Response, DashboardError> {
    let sso = sso_of(&state)?;
    // Spent whatever happens: the cookie is cleared by every answer.
    let clear = session::set_cookie(&state, &headers, SSO_COOKIE, "", Duration::ZERO);
    let answer = match verified_user(&state, sso, &headers, &callback, client).await {
        Ok(Some(user)) => {
            if let Some(before) = session::cookie(&headers, SESSION_COOKIE) {
                state
                    .developers
                    .delete_session(&KeyHash::of(before))
                    .await?;
            }
            let cookie = session::start(&state, &headers, &user, SignInMethod::Sso, client).await?;
            ([cookie], Redirect::to("/developers")).into_response()
        }
        Ok(None) => unreachable_page(),
        Err(Refused::Store(e)) => return Err(e.into()),
        Err(refused) => {
            tracing::warn!(reason = %refused, "single sign-on refused");
            audit_refusal(&state, &refused, client).await?;
            refusal_page(&refused)
        }
    };
    // Appended: the answer may set the session cookie (a header array would replace it).
    let mut answer = answer;
    answer.headers_mut().append(clear.0, clear.1);
    Ok(answer)
}

/// The audit row of a refusal that concerns an account (see the module's comment).
async fn audit_refusal(
    state: &DashboardState,
    refused: &Refused,
    client: ClientAddress,
) -> Result<(), DashboardError> {
    let by = |email: &str| session::actor(email, client);
    match refused {
        Refused::UserUnverified(user) => {
            state
                .developers
                .audit_refused_sso(user, SignInMethod::Sso, refused.reason(), &by(&user.email))
                .await?
        }
        Refused::DomainNotClaimed(email) => {
            // An account of that email (signed up with a password) is concerned.
            if let Some(user) = state.developers.user_by_email(email).await? {
                state
                    .developers
                    .audit_refused_sso(&user, SignInMethod::Sso, refused.reason(), &by(email))
                    .await?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn refusal_page(refused: &Refused) -> Response {
    let status = match refused {
        Refused::Provider(_) | Refused::Exchange(_) => StatusCode::BAD_GATEWAY,
        _ => StatusCode::FORBIDDEN,
    };
    with_status(
        status,
        bare(
            "Sign-in refused",
            html! {
                (notice("error", refused.message()))
                p.alt { a href=(SSO_START_PATH) { "Sign in with SSO" } " · " a href="/developers/sign-in" { "Sign in with a password" } }
            },
        ),
    )
}

/// The user the callback signs in, checked step by step; `Ok(None)` when the provider cannot
/// be reached.
async fn verified_user(
    state: &DashboardState,
    sso: &SsoSettings,
    headers: &HeaderMap,
    callback: &Callback,
    client: ClientAddress,
) -> Result<Option<User>, Refused> {
    let (state_sent, nonce, verifier) = started(headers).ok_or(Refused::NoCookie)?;
    if callback.state.len() > MAX_PARAM_CHARS || !session::tokens_match(&callback.state, state_sent)
    {
        return Err(Refused::WrongState);
    }
    // Once: the record is deleted as it is read, so a replayed callback finds nothing.
    let taken = state
        .developers
        .take_sso_login(&KeyHash::of(state_sent))
        .await?;
    if !taken {
        return Err(Refused::Spent);
    }
    if let Some(error) = &callback.error {
        return Err(Refused::Provider(error.chars().take(100).collect()));
    }
    if callback.code.is_empty() || callback.code.len() > MAX_PARAM_CHARS {
        return Err(Refused::Provider("no code".to_owned()));
    }
    let Some(provider) = provider(sso).await else {
        return Ok(None);
    };
    let oidc = CoreClient::from_provider_metadata(
        provider.metadata.clone(),
        sso.client_id.clone(),
        Some(sso.client_secret.clone()),
    )
    .set_redirect_uri(redirect_url(state).map_err(|e| Refused::Exchange(e.to_string()))?);
    let tokens = oidc
        .exchange_code(AuthorizationCode::new(callback.code.clone()))
        .map_err(|e| Refused::Exchange(e.to_string()))?
        .set_pkce_verifier(PkceCodeVerifier::new(verifier.to_owned()))
        .request_async(&provider.http)
        .await
        .map_err(|e| Refused::Exchange(e.to_string()))?;
    let id_token = tokens.id_token().ok_or(Refused::NoIdToken)?;
    let claims = id_token
        .claims(
            &id_token_verifier(&provider, sso),
            &Nonce::new(nonce.to_owned()),
        )
        .map_err(|e| Refused::IdToken(e.to_string()))?;
    if claims.email_verified() != Some(true) {
        return Err(Refused::EmailUnverified);
    }
    let email = claims.email().ok_or(Refused::EmailUnverified)?;
    let email = comparable_email(email.as_str())?;
    user_for(state, sso, &email, client).await.map(Some)
}

/// How far ahead of this clock an ID token's `iat` may be (the provider's clock may run a
/// little ahead; a day ahead is a token minted to outlive its `exp` checks).
const IAT_SKEW_SECS: i64 = 300;

/// The verifier of an ID token: signed with one of the algorithms the discovery document lists
/// for ID tokens (`id_token_signing_alg_values_supported`), against its JWKS alone. Never with
/// the client secret: the verifier is built without it, and the HMAC algorithms (`HS256`, which
/// a secret shared with the provider would sign) are dropped even when the document lists them,
/// so a holder of the secret, or a tampered header, cannot sign a token that verifies. An `iat`
/// more than [`IAT_SKEW_SECS`] ahead is refused.
fn id_token_verifier(provider: &Provider, sso: &SsoSettings) -> CoreIdTokenVerifier<'static> {
    let algs: Vec<CoreJwsSigningAlgorithm> = provider
        .metadata
        .id_token_signing_alg_values_supported()
        .iter()
        .filter(|alg| {
            !matches!(
                alg,
                CoreJwsSigningAlgorithm::HmacSha256
                    | CoreJwsSigningAlgorithm::HmacSha384
                    | CoreJwsSigningAlgorithm::HmacSha512
                    | CoreJwsSigningAlgorithm::None
            )
        })
        .cloned()
        .collect();
    CoreIdTokenVerifier::new_public_client(
        sso.client_id.clone(),
        provider.metadata.issuer().clone(),
        provider.metadata.jwks().clone(),
    )
    .set_allowed_algs(algs)
    .set_issue_time_verifier_fn(|iat| {
        let ahead = iat.timestamp() - OffsetDateTime::now_utc().unix_timestamp();
        if ahead > IAT_SKEW_SECS {
            Err(format!("issued {ahead} s in the future"))
        } else {
            Ok(())
        }
    })
}

/// An email claim as it is compared with the dashboard's users: refused unless it is in NFKC
/// form already (a look-alike such as the Kelvin sign, `\u{212A}`, is not: case folding alone
/// would make `\u{212A}ate@…` into `kate@…`), then trimmed and lowercased as every stored email
/// is.
fn comparable_email(claim: &str) -> Result<String, Refused> {
    if !unicode_normalization::is_nfkc(claim) {
        return Err(Refused::EmailNotNormal);
    }
    Ok(normalize(claim))
}

/// The user a verified `email` signs in as: theirs, or a new member of the organization that
/// claimed the email's domain.
async fn user_for(
    state: &DashboardState,
    sso: &SsoSettings,
    email: &str,
    client: ClientAddress,
) -> Result<User, Refused> {
    if let Some(user) = state.developers.user_by_email(email).await? {
        // An unverified user may be anyone's sign-up with this email and its password:
        // verifying it here would hand that password a verified account.
        if user.email_verified_at.is_none() {
            return Err(Refused::UserUnverified(Box::new(user)));
        }
        return Ok(user);
    }
    let claim = match domain_of(email) {
        Some(domain) => state.developers.domain_claim(&domain).await?,
        None => None,
    };
    let Some(claim) = claim else {
        return Err(Refused::DomainNotClaimed(email.to_owned()));
    };
    let now = OffsetDateTime::now_utc();
    let user = User {
        id: ids::user(),
        email: email.to_owned(),
        // No password: no hash verifies against an empty string.
        password_hash: String::new(),
        account_id: claim.account_id,
        created_at: now,
        email_verified_at: Some(now),
        role: sso.default_role,
    };
    let by = session::actor(email, client);
    if state.developers.insert_user(user.clone(), &by).await? {
        Ok(user)
    } else {
        // Signed up at the same moment: sign in as that user, by the same rules.
        let user = state
            .developers
            .user_by_email(email)
            .await?
            .ok_or_else(|| Refused::Exchange("user vanished".to_owned()))?;
        if user.email_verified_at.is_none() {
            return Err(Refused::UserUnverified(Box::new(user)));
        }
        Ok(user)
    }
}
