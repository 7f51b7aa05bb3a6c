//! The page frame every dashboard page shares (navigation, account menu, sign-out), the
//! signed-out frame, error pages, and number formatting.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use super::error::DashboardError;
use crate::error::ApiError;
use store::developers::{Permission, Session};

pub const STYLE: &str = include_str!("style.css");

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Keys,
    Usage,
    Billing,
    Audit,
    Members,
    /// A page outside the navigation (the refusal page).
    None,
}

/// The navigation: each page with the permission it needs (none: every member's).
const NAV: [(Nav, &str, &str, Option<Permission>); 6] = [
    (Nav::Overview, "/developers", "Overview", None),
    (
        Nav::Keys,
        "/developers/keys",
        "API keys",
        Some(Permission::Keys),
    ),
    (Nav::Usage, "/developers/usage", "Usage", None),
    (
        Nav::Billing,
        "/developers/billing",
        "Billing",
        Some(Permission::Billing),
    ),
    (
        Nav::Audit,
        "/developers/audit",
        "Audit log",
        Some(Permission::Audit),
    ),
    (
        Nav::Members,
        "/developers/members",
        "Members",
        Some(Permission::Members),
    ),
];

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · svc developers" }
            link rel="stylesheet" href="/developers/assets/style.css";
        }
    }
}

/// A signed-in page: header with the account menu, navigation, and the content.
pub fn page(session: &Session, nav: Nav, title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                a.skip href="#main" { "Skip to content" }
                header.topbar {
                    a.brand href="/developers" { span.logo aria-hidden="true" { "◆" } " svc " span.muted { "developers" } }
                    div.account {
                        span.email { (session.email) " " span.badge.role { (session.role.as_str()) } }
                        form method="post" action="/developers/sign-out" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            button.link type="submit" { "Sign out" }
                        }
                        form method="post" action="/developers/sign-out-everywhere" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            button.link type="submit" title="Ends your sessions in every browser" { "Sign out everywhere" }
                        }
                    }
                }
                div.shell {
                    nav.sidenav aria-label="Dashboard" {
                        ul {
                            @for (item, href, label, needs) in NAV {
                                @if needs.is_none_or(|p| session.role.may(p)) { li {
                                    @if item == nav {
                                        a.active href=(href) aria-current="page" { (label) }
                                    } @else {
                                        a href=(href) { (label) }
                                    }
                                } }
                            }
                        }
                        p.small { a href="/developers/changelog" { "API changelog" } }
                    }
                    main #main tabindex="-1" {
                        h1 { (title) }
                        (content)
                    }
                }
            }
        }
    }
}

/// What a member sees of a page their role does not allow (403): the page frame and why.
pub fn refused(session: &Session) -> Markup {
    page(
        session,
        Nav::None,
        "Not available to your role",
        html! {
            (notice("error", &format!("Your role in this organization ({}) does not allow this page or action. An owner or admin can change your role on the Members page.", session.role.as_str())))
            p { a href="/developers" { "Back to the overview" } }
        },
    )
}

/// A signed-out page: sign-in, sign-up, errors before signing in.
pub fn bare(title: &str, content: Markup) -> Markup {
    framed("card narrow", title, content)
}

/// A public page of reading matter (the changelog), signed in or not.
pub fn wide(title: &str, content: Markup) -> Markup {
    framed(
        "card wide",
        title,
        html! {
            (content)
            p.alt { a href="/developers" { "Back to the dashboard" } }
        },
    )
}

fn framed(class: &str, title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body.bare {
                main #main class=(class) {
                    p.brand { span.logo aria-hidden="true" { "◆" } " svc " span.muted { "developers" } }
                    h1 { (title) }
                    (content)
                    p.alt.small { a href="/developers/changelog" { "API changelog" } }
                }
            }
        }
    }
}

pub fn notice(kind: &str, message: &str) -> Markup {
    let role = if kind == "error" { "alert" } else { "status" };
    html! { div class=(format!("notice {kind}")) role=(role) { (message) } }
}

/// The page for an error that ends a request: its status and the envelope's message, never
/// internal detail (the mapping to both is `error/mod.rs`'s).
impl IntoResponse for DashboardError {
    fn into_response(self) -> Response {
        let error = ApiError::from(self);
        error.record();
        let body = bare(
            "Something went wrong",
            html! {
                (notice("error", &error.message))
                p { a href="/developers" { "Back to the dashboard" } }
            },
        );
        (error.status, body).into_response()
    }
}

pub fn with_status(status: StatusCode, markup: Markup) -> Response {
    (status, markup).into_response()
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 2550 -> "$25.50", 2500 -> "$25".
pub fn dollars(cents: u64) -> String {
    if cents.is_multiple_of(100) {
        format!("${}", thousands(cents / 100))
    } else {
        format!("${}.{:02}", thousands(cents / 100), cents % 100)
    }
}

pub fn datetime(t: time::OffsetDateTime) -> String {
    t.format(time::macros::format_description!(
        "[year]-[month]-[day] [hour]:[minute] UTC"
    ))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_and_counts_read_like_a_console() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(10_000_000), "10,000,000");
        assert_eq!(dollars(2_500), "$25");
        assert_eq!(dollars(100_000), "$1,000");
        assert_eq!(dollars(1_005), "$10.05");
    }
}
