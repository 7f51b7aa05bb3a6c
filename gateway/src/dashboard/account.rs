//! Sign-up (throttled per client address), email verification, sign-in (throttled per
//! client address, and per email from each client address) and sign-out. A user owns exactly
//! one account, created with it, named by the user's email.
//!
//! Sign-up answers alike whatever the email, so it tells nobody which emails have accounts:
//! it mails a verification link (a new user, or one not verified yet) or a notice (a verified
//! one), and signs nobody in. Following the link verifies the email, sets the password chosen
//! with that sign-up and adds the sign-up credits (once per user, asked again at sign-in in
//! case a crash fell between the two); until then the account takes no keys and no credits
//! from anyone.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{html, Markup};
use serde::Deserialize;
use time::{Duration, OffsetDateTime};

use super::error::DashboardError;
use super::form::HtmlForm;
use super::layout::{bare, notice, with_status};
use super::mail::{self, Mail};
use super::session::{self, AnySession, CSRF_COOKIE, SESSION_COOKIE};
use super::settings::SSO_START_PATH;
use crate::client_address::ClientAddress;
use crate::state::DashboardState;
use gateway_core::ids;
use gateway_core::limits::AddressBucket;
use gateway_core::limits::{AddressBrake, LimitError};
use store::accounts::KeyHash;
use store::developers::{domain_of, EmailVerification, Role, SignInMethod, User};
use store::ledger::signup_credits_reference;

const MIN_PASSWORD_CHARS: usize = 10;
const MAX_PASSWORD_CHARS: usize = 256;
/// Failed sign-ins allowed per email from one client address within the window before
/// sign-in from that address is refused: a stranger's failures never lock the owner out
/// from their own address, and each address gets this many guesses per window.
const MAX_FAILURES: u32 = 5;
/// How long a verification link works.
const LINK_LIFETIME: Duration = Duration::hours(24);
const FAILURE_WINDOW: Duration = Duration::minutes(15);
/// A valid argon2id hash of no one's password, checked for unknown emails so that their
/// answer takes as long as a wrong password.
const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$0sfpM5FpYlNO1Q4kZr0D1+9oYtWDa8Cc7Y1FtG2mVlg";

#[derive(Deserialize)]
pub struct Credentials {
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf: String,
}

#[derive(Deserialize)]
pub struct VerificationLink {
    #[serde(default)]
    token: String,
}

#[derive(Deserialize)]
pub struct CsrfOnly {
    #[serde(default)]
    csrf: String,
}

#[derive(Clone, Copy)]
enum Which {
    SignIn,
    SignUp,
}

fn form(which: Which, csrf: &str, email: &str, error: Option<&str>, sso: bool) -> Markup {
    let (title, action, button, autocomplete) = match which {
        Which::SignIn => (
            "Sign in",
            "/developers/sign-in",
            "Sign in",
            "current-password",
        ),
        Which::SignUp => (
            "Create your account",
            "/developers/sign-up",
            "Create account",
            "new-password",
        ),
    };
    bare(
        title,
        html! {
            @if let Some(error) = error { (notice("error", error)) }
            form.stack method="post" action=(action) {
                input type="hidden" name="csrf" value=(csrf);
                label for="email" { "Email" }
                input #email type="email" name="email" value=(email) required autocomplete="email" autofocus;
                label for="password" { "Password" }
                input #password type="password" name="password" required minlength=(MIN_PASSWORD_CHARS) autocomplete=(autocomplete)
                    aria-describedby="password-help";
                p #password-help.hint { "At least " (MIN_PASSWORD_CHARS) " characters." }
                button.primary type="submit" { (button) }
            }
            @if sso && matches!(which, Which::SignIn) {
                p.alt { a.button #sso href=(SSO_START_PATH) { "Sign in with SSO" } }
            }
            @match which {
                Which::SignIn => p.alt { "New here? " a href="/developers/sign-up" { "Create an account" } },
                Which::SignUp => p.alt { "Already have an account? " a href="/developers/sign-in" { "Sign in" } },
            }
        },
    )
}

/// A signed-out form with a fresh double-submit CSRF token (cookie and hidden field).
fn render(
    state: &DashboardState,
    headers: &HeaderMap,
    status: StatusCode,
    which: Which,
    email: &str,
    error: Option<&str>,
) -> Response {
    let csrf = session::cookie(headers, CSRF_COOKIE)
        .filter(|c| {
            c.len() == ids::SESSION_TOKEN_CHARS && c.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map_or_else(ids::session_token, str::to_owned);
    let cookie = session::set_cookie(state, headers, CSRF_COOKIE, &csrf, Duration::hours(2));
    let sso = state.settings.sso.is_some();
    let mut response = with_status(status, form(which, &csrf, email, error, sso));
    response.headers_mut().append(cookie.0, cookie.1);
    response
}

const FORM_EXPIRED: &str = "This form has expired; please submit it again.";

/// The form `which` again, with `message` and the status that says why it was refused.
fn refusal<'a>(
    state: &'a DashboardState,
    headers: &'a HeaderMap,
    which: Which,
    email: &'a str,
) -> impl Fn(StatusCode, &str) -> Result<Response, DashboardError> + 'a {
    move |status, message| Ok(render(state, headers, status, which, email, Some(message)))
}

/// The form again with a 429, `message` and `Retry-After: secs`.
fn too_many(
    refuse: impl Fn(StatusCode, &str) -> Result<Response, DashboardError>,
    message: &str,
    secs: u64,
) -> Result<Response, DashboardError> {
    let mut page = refuse(StatusCode::TOO_MANY_REQUESTS, message)?;
    page.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    Ok(page)
}

fn csrf_ok(headers: &HeaderMap, presented: &str) -> bool {
    session::cookie(headers, CSRF_COOKIE)
        .is_some_and(|expected| session::tokens_match(presented, expected))
}

pub fn normalize(email: &str) -> String {
    email.trim().to_lowercase()
}

pub fn plausible_email(email: &str) -> bool {
    let Some((local, domain)) = email.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && email.len() <= 254
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
}

pub async fn sign_in_form(
    State(state): State<Arc<DashboardState>>,
    headers: HeaderMap,
) -> Response {
    render(&state, &headers, StatusCode::OK, Which::SignIn, "", None)
}

pub async fn sign_up_form(
    State(state): State<Arc<DashboardState>>,
    headers: HeaderMap,
) -> Response {
    render(&state, &headers, StatusCode::OK, Which::SignUp, "", None)
}

pub async fn sign_up(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    headers: HeaderMap,
    HtmlForm(form): HtmlForm<Credentials>,
) -> Result<Response, DashboardError> {
    let email = normalize(&form.email);
    let refuse = refusal(&state, &headers, Which::SignUp, &email);
    if !csrf_ok(&headers, &form.csrf) {
        return refuse(StatusCode::FORBIDDEN, FORM_EXPIRED);
    }
    if !plausible_email(&email) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Enter a valid email address.",
        );
    }
    let chars = form.password.chars().count();
    if !(MIN_PASSWORD_CHARS..=MAX_PASSWORD_CHARS).contains(&chars) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Choose a password of at least 10 characters (at most 256).",
        );
    }
    // Counted once the form is plausible (a mistyped form is not a sign-up) and before the
    // password hash and the account: a sign-up adds credits, so one client cannot mint
    // accounts faster than this, whatever the emails.
    if let Some(secs) = client_wait(&state.sign_ups, client).await? {
        return too_many(
            refuse,
            &format!("Too many sign-ups from your network. Try again in {secs} seconds."),
            secs,
        );
    }
    let password = form.password;
    // Hashed whether or not the email has an account, so that the answer takes as long
    // either way. argon2 takes 19 MiB and tens of milliseconds: on the bounded CPU pool, so
    // memory stays bounded whatever the number of concurrent sign-ups.
    let password_hash = gateway_core::cpu::run(move || session::hash_password(&password))
        .await
        .map_err(|_| DashboardError::PasswordHash)??;
    let user = match state.developers.user_by_email(&email).await? {
        Some(user) => user,
        None => {
            let account = state.accounts.create_account(&email).await?;
            let user = User {
                id: ids::user(),
                email: email.clone(),
                password_hash: password_hash.clone(),
                account_id: account.id,
                created_at: OffsetDateTime::now_utc(),
                email_verified_at: None,
                role: Role::Owner,
            };
            let by = session::actor(&email, client);
            if state.developers.insert_user(user.clone(), &by).await? {
                user
            } else {
                // Another sign-up of the same email won the race: answer as for it.
                state
                    .developers
                    .user_by_email(&email)
                    .await?
                    .ok_or(DashboardError::NotFound)?
            }
        }
    };
    if user.email_verified_at.is_some() {
        mail::send(
            state.settings.mailer.as_ref(),
            Mail::AlreadySignedUp {
                to: &email,
                link: state.settings.public_url.to("/developers/sign-in"),
            },
        );
    } else {
        let token = ids::session_token();
        state
            .developers
            .insert_email_verification(EmailVerification {
                token_hash: KeyHash::of(&token),
                user_id: user.id,
                password_hash,
                expires_at: OffsetDateTime::now_utc() + LINK_LIFETIME,
            })
            .await?;
        mail::send(
            state.settings.mailer.as_ref(),
            Mail::Verify {
                to: &email,
                link: state
                    .settings
                    .public_url
                    .to(&format!("{}?token={token}", mail::VERIFY_PATH)),
            },
        );
    }
    Ok(check_your_email(&email))
}

/// What every plausible sign-up is answered, whether or not the email has an account.
fn check_your_email(email: &str) -> Response {
    with_status(
        StatusCode::OK,
        bare(
            "Check your email",
            html! {
                (notice("info", &format!("We sent a message to {email}. Follow its link to confirm the address; then sign in.")))
                p.hint { "The link works once, within 24 hours. No message? Sign up again with the same email to get a new link." }
                p.alt { a href="/developers/sign-in" { "Sign in" } }
            },
        ),
    )
}

/// A mailed link's token (verification, invitation) as the link carries it, or `None` for
/// anything else.
pub fn link_token(token: &str) -> Option<&str> {
    (token.len() == ids::SESSION_TOKEN_CHARS && token.chars().all(|c| c.is_ascii_alphanumeric()))
        .then_some(token)
}

/// The page a verification link opens: a button that confirms. Following the link changes
/// nothing by itself, so a mail scanner that fetches links does not spend it.
pub async fn verify_email_form(
    axum::extract::Query(link): axum::extract::Query<VerificationLink>,
) -> Result<Response, DashboardError> {
    let token = link_token(&link.token).ok_or(DashboardError::NotFound)?;
    Ok(with_status(
        StatusCode::OK,
        bare(
            "Confirm your email",
            html! {
                form.stack method="post" action=(mail::VERIFY_PATH) {
                    input type="hidden" name="token" value=(token);
                    button.primary #confirm type="submit" { "Confirm my email" }
                }
            },
        ),
    ))
}

pub async fn verify_email(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    HtmlForm(link): HtmlForm<VerificationLink>,
) -> Result<Response, DashboardError> {
    let verified = match link_token(&link.token) {
        Some(token) => {
            state
                .developers
                .verify_email(&KeyHash::of(token), client.0.map(|ip| ip.to_string()))
                .await?
        }
        None => None,
    };
    let Some(user) = verified else {
        return Ok(with_status(
            StatusCode::GONE,
            bare(
                "Link expired",
                html! {
                    (notice("error", "This link has expired or was already used. Sign up again with the same email for a new one, or sign in."))
                    p.alt { a href="/developers/sign-in" { "Sign in" } }
                },
            ),
        ));
    };
    add_signup_credits(&state, &user, client).await?;
    Ok(with_status(
        StatusCode::OK,
        bare(
            "Email confirmed",
            html! {
                (notice("success", "Your email is confirmed. Sign in to start."))
                p.alt { a href="/developers/sign-in" { "Sign in" } }
            },
        ),
    ))
}

/// Adds a verified user's sign-up credits, once whatever happens: asked when the link is
/// followed, and again at each sign-in, in case the process stopped between the two.
/// Audited as the user's, from `client`.
async fn add_signup_credits(
    state: &DashboardState,
    user: &User,
    client: ClientAddress,
) -> Result<(), DashboardError> {
    let credits = state.settings.signup_credits;
    if credits > 0 {
        state
            .ledger
            .add_credits_once(
                &user.account_id,
                credits,
                &signup_credits_reference(&user.id),
                &session::actor(&user.email, client),
            )
            .await?;
    }
    Ok(())
}

/// Counts an attempt against the client address under `brake`: how long to wait when it is
/// over the limit (an address known to be over is refused without asking the store).
pub(super) async fn client_wait(
    brake: &AddressBrake,
    client: ClientAddress,
) -> Result<Option<u64>, LimitError> {
    let Some(client) = client.0.map(AddressBucket::of) else {
        return Ok(None);
    };
    let counted = match brake.refused(client) {
        Some(refusal) => Err(refusal),
        None => brake.count(client).await.map(|_| ()),
    };
    match counted {
        Ok(()) => Ok(None),
        Err(LimitError::Exceeded {
            retry_after_secs, ..
        }) => Ok(Some(retry_after_secs)),
        Err(e) => Err(e),
    }
}

pub async fn sign_in(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    headers: HeaderMap,
    HtmlForm(form): HtmlForm<Credentials>,
) -> Result<Response, DashboardError> {
    let email = normalize(&form.email);
    let refuse = refusal(&state, &headers, Which::SignIn, &email);
    if !csrf_ok(&headers, &form.csrf) {
        return refuse(StatusCode::FORBIDDEN, FORM_EXPIRED);
    }
    // Per client address, whatever the email, before the email's count and the password
    // check: one client trying one password on many emails is stopped here.
    if let Some(secs) = client_wait(&state.sign_ins, client).await? {
        return too_many(
            refuse,
            &format!("Too many sign-in attempts from your network. Try again in {secs} seconds."),
            secs,
        );
    }
    // A member of the organization that claimed the email's domain and requires single
    // sign-on for it: no password is checked (and none counted), the attempt is audited on the
    // account. The claim is that organization's rule for its own members only: users of the
    // domain elsewhere (another organization, or none) sign in as before.
    if let Some(domain) = domain_of(&email) {
        if let Some(claim) = state.developers.domain_claim(&domain).await? {
            let member = if claim.require_sso {
                state
                    .developers
                    .user_by_email(&email)
                    .await?
                    .filter(|user| user.account_id == claim.account_id)
            } else {
                None
            };
            if let Some(user) = member {
                let by = session::actor(&email, client);
                state
                    .developers
                    .audit_refused_sso(&user, SignInMethod::Password, "sso_required", &by)
                    .await?;
                return refuse(
                    StatusCode::FORBIDDEN,
                    "Your organization requires single sign-on for this email: use \"Sign in with SSO\".",
                );
            }
        }
    }
    // Every attempt is counted as a failure before its password is checked, in one atomic
    // step of the store (a row upsert in Postgres), and cleared only when it succeeds: so of
    // any number of concurrent attempts, on any number of pods, at most MAX_FAILURES are
    // checked per window from one client address. Checking first and counting after let 40
    // concurrent guesses through. Counted per address so that nobody else's failures lock
    // the owner out: a guesser with many addresses gets MAX_FAILURES per address and window.
    let from = client.0.map(AddressBucket::of).map(|b| b.to_string());
    let from = from.as_deref().unwrap_or_default();
    let attempts = state
        .developers
        .record_sign_in_failure(&email, from, FAILURE_WINDOW)
        .await?;
    if attempts > MAX_FAILURES {
        let now = OffsetDateTime::now_utc();
        let until = state
            .developers
            .sign_in_failures(&email, from)
            .await?
            .map_or(now + FAILURE_WINDOW, |(_, until)| until);
        let secs = (until - now).whole_seconds().max(1);
        let minutes = (secs + 59) / 60;
        return too_many(
            refuse,
            &format!("Too many failed sign-ins for this email from your network. Try again in {minutes} minute(s)."),
            secs.unsigned_abs(),
        );
    }
    let user = state.developers.user_by_email(&email).await?;
    let hash = user
        .as_ref()
        .map_or(DUMMY_HASH.to_owned(), |u| u.password_hash.clone());
    let password = form.password;
    // On the bounded CPU pool: argon2 takes 19 MiB per check.
    let verified = gateway_core::cpu::run(move || session::verify_password(&password, &hash))
        .await
        .unwrap_or(false);
    match user {
        Some(user) if verified => {
            state
                .developers
                .clear_sign_in_failures(&email, from)
                .await?;
            if user.email_verified_at.is_some() {
                add_signup_credits(&state, &user, client).await?;
            }
            // The session the browser had before, if any, ends: signing in never keeps it.
            if let Some(before) = session::cookie(&headers, SESSION_COOKIE) {
                state
                    .developers
                    .delete_session(&KeyHash::of(before))
                    .await?;
            }
            let cookie =
                session::start(&state, &headers, &user, SignInMethod::Password, client).await?;
            Ok(([cookie], Redirect::to("/developers")).into_response())
        }
        Some(user) => {
            let by = session::actor(&email, client);
            state.developers.audit_refused_sign_in(&user, &by).await?;
            refuse(StatusCode::UNAUTHORIZED, "Wrong email or password.")
        }
        None => refuse(StatusCode::UNAUTHORIZED, "Wrong email or password."),
    }
}

pub async fn sign_out(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    headers: HeaderMap,
    signed_in: AnySession,
    HtmlForm(form): HtmlForm<CsrfOnly>,
) -> Result<Response, DashboardError> {
    signed_in.check_csrf(&form.csrf)?;
    let session = &signed_in.0;
    state
        .developers
        .sign_out(session, &session::actor(&session.email, client))
        .await?;
    Ok(signed_out(&state, &headers))
}

/// The answer to a sign-out: the session cookie cleared, back to the sign-in page.
fn signed_out(state: &DashboardState, headers: &HeaderMap) -> Response {
    let cookie = session::set_cookie(state, headers, SESSION_COOKIE, "", Duration::ZERO);
    ([cookie], Redirect::to("/developers/sign-in")).into_response()
}

/// Ends every session of the user, on every browser, this one included: one store step,
/// audited.
pub async fn sign_out_everywhere(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    headers: HeaderMap,
    signed_in: AnySession,
    HtmlForm(form): HtmlForm<CsrfOnly>,
) -> Result<Response, DashboardError> {
    signed_in.check_csrf(&form.csrf)?;
    let session = &signed_in.0;
    state
        .developers
        .end_all_sessions(session, &session::actor(&session.email, client))
        .await?;
    Ok(signed_out(&state, &headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dummy_hash_is_a_valid_argon2id_hash_of_no_password() {
        assert!(argon2::PasswordHash::new(DUMMY_HASH).is_ok());
        assert!(!session::verify_password("", DUMMY_HASH));
    }

    #[test]
    fn emails_are_compared_trimmed_and_lower_cased() {
        assert_eq!(normalize("  Dev@Example.COM "), "dev@example.com");
        assert!(plausible_email("dev@example.com"));
        assert!(!plausible_email("dev@example"));
        assert!(!plausible_email("dev example@x.com"));
        assert!(!plausible_email("@example.com"));
    }
}
