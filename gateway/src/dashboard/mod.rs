//! The developer dashboard under `/developers`: sign-up and sign-in, the overview, API keys,
//! usage charts, billing, the audit log, the organization's members and single sign-on. Server-rendered HTML with plain forms (no script needed), its one
//! stylesheet embedded in the binary; served on the public listener in both modes.

mod account;
mod audit;
mod billing;
mod changelog;
mod charts;
pub mod domains;
pub mod error;
mod form;
mod keys;
mod layout;
pub mod mail;
mod members;
mod overview;
mod public_domains;
mod session;
pub mod settings;
mod sso;
mod usage;

use axum::http::{header, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::state::AppState;
use error::DashboardError;

pub use settings::DashboardSettings;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/developers", get(overview::show))
        .route("/developers/", get(overview::show))
        .route(
            "/developers/sign-up",
            get(account::sign_up_form).post(account::sign_up),
        )
        .route(
            "/developers/sign-in",
            get(account::sign_in_form).post(account::sign_in),
        )
        .route(
            mail::VERIFY_PATH,
            get(account::verify_email_form).post(account::verify_email),
        )
        .route(settings::SSO_START_PATH, get(sso::start))
        .route(settings::SSO_CALLBACK_PATH, get(sso::callback))
        .route("/developers/members/domains", post(members::claim_domain))
        .route(
            "/developers/members/domains/release",
            post(members::release_domain),
        )
        .route(
            "/developers/members/domains/verify",
            post(members::verify_domain),
        )
        .route(
            "/developers/members/domains/mail",
            post(members::mail_domain_proof),
        )
        .route(
            mail::DOMAIN_PROOF_PATH,
            get(members::domain_proof_form).post(members::prove_domain_by_mail),
        )
        .route(
            "/developers/members/invitations/{id}/withdraw",
            post(members::withdraw),
        )
        .route("/developers/sign-out", post(account::sign_out))
        .route(
            "/developers/sign-out-everywhere",
            post(account::sign_out_everywhere),
        )
        .route("/developers/keys", get(keys::show).post(keys::mint))
        .route(
            "/developers/keys/{id}/revoke",
            get(keys::confirm_revoke).post(keys::revoke),
        )
        .route("/developers/usage", get(usage::show))
        .route("/developers/usage.csv", get(usage::csv))
        .route("/developers/billing", get(billing::show))
        .route("/developers/billing/checkout", post(billing::checkout))
        .route(
            "/developers/billing/auto-reload",
            post(billing::auto_reload),
        )
        .route("/developers/members", get(members::show))
        .route("/developers/members/invite", post(members::invite))
        .route("/developers/members/{id}/role", post(members::change_role))
        .route("/developers/members/{id}/remove", post(members::remove))
        .route(
            mail::INVITATION_PATH,
            get(members::accept_form).post(members::accept),
        )
        .route("/developers/audit", get(audit::show))
        .route("/developers/audit.csv", get(audit::csv))
        .route("/developers/changelog", get(changelog::show))
        .route("/developers/assets/style.css", get(style))
        .route("/developers/{*rest}", get(not_found).post(not_found))
        // The pages need no script and nothing from elsewhere; the charts' legend swatches
        // are inline style attributes. No other site may frame them (clickjacking a revoke).
        .layer(SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        // Pages show account data, and the keys page a new secret once: no cache keeps them.
        // The stylesheet sets its own.
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
}

const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; \
    style-src-attr 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; \
    frame-ancestors 'none'";

async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        layout::STYLE,
    )
}

async fn not_found() -> DashboardError {
    DashboardError::NotFound
}
