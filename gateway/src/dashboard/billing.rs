//! `/developers/billing`: top-up packs and a custom amount ($10 to $10,000), checkout through
//! the payment provider (Stripe sends the browser to its own page and back), and the history
//! of top-ups with their status, refunds and disputes, and any credits owed.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use time::OffsetDateTime;

use super::error::DashboardError;
use super::form::HtmlForm;
use super::layout::{datetime, dollars, notice, page, thousands, with_status, Nav};
use super::session::{self, needs, Allowed};
use crate::client_address::ClientAddress;
use crate::error::ApiError;
use crate::state::DashboardState;
use gateway_core::ids;
use gateway_core::payments::reload::{Rule, MAX_DECLINES};
use gateway_core::payments::{
    credits_for, parse_usd, Order, Started, MAX_TOP_UP_CENTS, MIN_TOP_UP_CENTS,
};
use store::developers::{Checkout, CheckoutStatus, Session};
use store::ledger::ReversalKind;

pub const PACKS_CENTS: [u64; 7] = [1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000];

#[derive(Deserialize)]
pub struct CheckoutForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    amount: String,
}

#[derive(Deserialize)]
pub struct AutoReloadForm {
    #[serde(default)]
    csrf: String,
    /// A checkbox: present when ticked.
    #[serde(default)]
    enabled: Option<String>,
    #[serde(default)]
    threshold: String,
    #[serde(default)]
    amount: String,
}

#[derive(Deserialize)]
pub struct Shown {
    paid: Option<String>,
    cancelled: Option<String>,
}

/// A dollar amount as typed ("25", "$1,000", "99.50") in cents, within the top-up range.
pub fn parse_amount(input: &str) -> Result<u64, String> {
    let range = format!(
        "Enter an amount from {} to {}.",
        dollars(MIN_TOP_UP_CENTS),
        dollars(MAX_TOP_UP_CENTS)
    );
    let cleaned: String = input
        .trim()
        .trim_start_matches('$')
        .chars()
        .filter(|c| *c != ',')
        .collect();
    let Some(total) = parse_usd(&cleaned) else {
        return Err(format!(
            "“{}” is not a dollar amount. {range}",
            input.trim()
        ));
    };
    if total < MIN_TOP_UP_CENTS {
        return Err(format!(
            "{} is below the minimum top-up. {range}",
            dollars(total)
        ));
    }
    if total > MAX_TOP_UP_CENTS {
        return Err(format!(
            "{} is above the maximum top-up. {range}",
            dollars(total)
        ));
    }
    Ok(total)
}

struct HistoryRow {
    reference: String,
    usd_cents: u64,
    /// Negative for credits taken back.
    credits: i128,
    status: &'static str,
    at: OffsetDateTime,
}

fn signed_thousands(credits: i128) -> String {
    let sign = if credits < 0 { "−" } else { "" };
    format!(
        "{sign}{}",
        thousands(u64::try_from(credits.unsigned_abs()).unwrap_or(u64::MAX))
    )
}

async fn render(
    state: &DashboardState,
    session: &Session,
    status: StatusCode,
    message: Option<(&str, &str)>,
    amount: &str,
) -> Result<Response, DashboardError> {
    let balance = state.ledger.balance(&session.account_id).await?;
    let confirmed = state.ledger.top_ups(&session.account_id).await?;
    let checkouts = state.developers.checkouts(&session.account_id).await?;
    let reversals = state.ledger.reversals(&session.account_id).await?;
    let reload = state.auto_reloads.settings(&session.account_id).await?;
    let stripe = state.payments.stripe.is_some();
    let per_usd = state.credits_per_usd;
    let mut history: Vec<HistoryRow> = confirmed
        .iter()
        .map(|t| HistoryRow {
            reference: t.reference.clone(),
            usd_cents: t.usd_cents,
            credits: t.credits.into(),
            status: "confirmed",
            at: t.confirmed_at,
        })
        .chain(reversals.iter().map(|r| {
            let moved = i128::from(r.credits) + i128::from(r.owed);
            HistoryRow {
                reference: r.reference.clone(),
                usd_cents: r.usd_cents,
                credits: if r.kind == ReversalKind::DisputeWon {
                    moved
                } else {
                    -moved
                },
                status: match r.kind {
                    ReversalKind::Refund => "refunded",
                    ReversalKind::Dispute => "disputed",
                    ReversalKind::DisputeWon => "dispute won",
                },
                at: r.created_at,
            }
        }))
        .chain(
            checkouts
                .iter()
                .filter(|c| !confirmed.iter().any(|t| t.reference == c.reference))
                .map(|c| HistoryRow {
                    reference: c.reference.clone(),
                    usd_cents: c.usd_cents,
                    credits: credits_for(c.usd_cents, per_usd).into(),
                    status: match c.status {
                        CheckoutStatus::Pending => "pending",
                        CheckoutStatus::Failed => "failed",
                    },
                    at: c.created_at,
                }),
        )
        .collect();
    history.sort_by_key(|x| std::cmp::Reverse(x.at));
    let available = balance.balance.saturating_sub(balance.reserved);
    let owed = (balance.owed > 0).then(|| {
        format!(
            "A refund or dispute took back more credits than the balance held: {} credits are owed and will be taken from your next top-up.",
            thousands(balance.owed)
        )
    });
    let content = html! {
        @if let Some((kind, text)) = message { (notice(kind, text)) }
        @if let Some(owed) = &owed { div #owed { (notice("error", owed)) } }
        section.cards aria-label="Balance" {
            div.card.stat { h2 { "apiCredits balance" } p.big #balance { (thousands(available)) } }
            div.card.stat { h2 { "Rate" } p.big #rate { (thousands(per_usd)) } p.hint { "credits per $1" } }
            div.card.stat { h2 { "Lifetime top-up" } p.big #lifetime { (dollars(balance.lifetime_top_up_cents)) } }
        }
        section.card {
            h2 { "Add credits" }
            ul.packs {
                @for cents in PACKS_CENTS {
                    li {
                        form method="post" action="/developers/billing/checkout" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            input type="hidden" name="amount" value=(cents / 100);
                            button.pack id=(format!("pack-{}", cents / 100)) type="submit" {
                                span.price { (dollars(cents)) }
                                span.credits { (thousands(credits_for(cents, per_usd))) " credits" }
                            }
                        }
                    }
                }
            }
            form.custom method="post" action="/developers/billing/checkout" {
                input type="hidden" name="csrf" value=(session.csrf);
                label for="amount" { "Custom amount (US$)" }
                div.row {
                    input #amount type="text" inputmode="decimal" name="amount" value=(amount) placeholder="e.g. 75" aria-describedby="amount-help" required;
                    button.primary #custom-checkout type="submit" { "Top up" }
                }
                p #amount-help.hint { "From " (dollars(MIN_TOP_UP_CENTS)) " to " (dollars(MAX_TOP_UP_CENTS)) "." }
            }
        }
        @if stripe {
            section.card #auto-reload {
                h2 { "Auto-reload" }
                @if !reload.card_saved {
                    p.hint { "Pay once with a card to save it for auto-reload." }
                } @else {
                    p #auto-reload-status {
                        @if reload.enabled {
                            "On: when the balance falls below " (thousands(reload.threshold_credits))
                            " credits, " (dollars(reload.usd_cents)) " is charged to the saved card."
                        } @else { "Off." }
                    }
                    @if let Some(failure) = &reload.last_failure {
                        div #auto-reload-failure {
                            (notice("error", &format!("{failure} Declines in a row: {} of {}; auto-reload turns off at {}.", reload.declines, MAX_DECLINES, MAX_DECLINES)))
                        }
                    }
                    form method="post" action="/developers/billing/auto-reload" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        label { input #auto-reload-enabled type="checkbox" name="enabled" value="on" checked[reload.enabled]; " Reload automatically" }
                        label for="threshold" { "When the balance falls below (credits)" }
                        input #threshold type="text" inputmode="numeric" name="threshold" value=(reload.threshold_credits) required;
                        label for="reload-amount" { "Add (US$)" }
                        input #reload-amount type="text" inputmode="decimal" name="amount" value=(reload.usd_cents / 100) required;
                        button.primary #save-auto-reload type="submit" { "Save" }
                    }
                }
            }
        }
        section.card {
            h2 { "Top-up history" }
            @if history.is_empty() {
                p.empty { "No top-ups yet." }
            } @else {
                div.table-wrap {
                    table #top-ups {
                        thead { tr {
                            th scope="col" { "Date" } th scope="col" { "Reference" } th.num scope="col" { "Amount" }
                            th.num scope="col" { "Credits" } th scope="col" { "Status" }
                        } }
                        tbody {
                            @for row in &history {
                                tr {
                                    td { (datetime(row.at)) }
                                    td { code { (row.reference) } }
                                    td.num { (dollars(row.usd_cents)) }
                                    td.num { (signed_thousands(row.credits)) }
                                    td { span class=(format!("badge {}", row.status.replace(' ', "-"))) { (row.status) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(with_status(
        status,
        page(session, Nav::Billing, "Billing", content),
    ))
}

pub async fn show(
    State(state): State<Arc<DashboardState>>,
    Allowed { session, .. }: Allowed<needs::Billing>,
    Query(shown): Query<Shown>,
) -> Result<Response, DashboardError> {
    let message = match shown.paid {
        Some(reference) => {
            let confirmed = state
                .ledger
                .top_ups(&session.account_id)
                .await?
                .into_iter()
                .find(|t| t.reference == reference);
            Some(match confirmed {
                Some(t) => (
                    "success",
                    format!(
                        "Payment of {} confirmed: {} credits added.",
                        dollars(t.usd_cents),
                        thousands(t.credits)
                    ),
                ),
                None => (
                    "info",
                    "Payment received; the credits appear once the provider confirms it."
                        .to_owned(),
                ),
            })
        }
        None => shown.cancelled.map(|_| {
            (
                "info",
                "Checkout cancelled: nothing was charged.".to_owned(),
            )
        }),
    };
    let message = message.as_ref().map(|(k, m)| (*k, m.as_str()));
    render(&state, &session, StatusCode::OK, message, "").await
}

/// This page's absolute URL under the configured public URL, for the payment provider's way
/// back: never from the request's `Host`, which would let whoever sent it choose where the
/// provider sends the browser.
fn billing_url(state: &DashboardState) -> String {
    state.settings.public_url.to("/developers/billing")
}

pub async fn checkout(
    State(state): State<Arc<DashboardState>>,
    signed_in: Allowed<needs::Billing>,
    HtmlForm(form): HtmlForm<CheckoutForm>,
) -> Result<Response, DashboardError> {
    signed_in.check_csrf(&form.csrf)?;
    let session = &signed_in.session;
    let usd_cents = match parse_amount(&form.amount) {
        Ok(cents) => cents,
        Err(message) => {
            return render(
                &state,
                session,
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(("error", &message)),
                &form.amount,
            )
            .await
        }
    };
    let order = Order {
        reference: ids::payment_reference(),
        account_id: session.account_id.clone(),
        usd_cents,
        return_url: billing_url(&state),
    };
    state
        .developers
        .insert_checkout(Checkout {
            reference: order.reference.clone(),
            account_id: order.account_id.clone(),
            usd_cents,
            status: CheckoutStatus::Pending,
            created_at: OffsetDateTime::now_utc(),
        })
        .await?;
    let started = state.payments.provider.checkout(&state.books, &order).await;
    if let Ok(Started::Redirect(url)) = &started {
        return Ok(Redirect::to(url).into_response());
    }
    if let Err(e) = started {
        state
            .developers
            .set_checkout_status(&order.reference, CheckoutStatus::Failed)
            .await?;
        let refusal = ApiError::from(e);
        refusal.record();
        return render(
            &state,
            session,
            refusal.status,
            Some(("error", &refusal.message)),
            &form.amount,
        )
        .await;
    }
    Ok(Redirect::to(&format!("/developers/billing?paid={}", order.reference)).into_response())
}

/// Saves the auto-reload rule: a threshold in credits and an amount within the top-up range.
pub async fn auto_reload(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    signed_in: Allowed<needs::Billing>,
    HtmlForm(form): HtmlForm<AutoReloadForm>,
) -> Result<Response, DashboardError> {
    signed_in.check_csrf(&form.csrf)?;
    let session = &signed_in.session;
    let threshold: Result<u64, String> = form
        .threshold
        .trim()
        .replace(',', "")
        .parse()
        .map_err(|_| format!("“{}” is not a number of credits.", form.threshold.trim()));
    let rule = threshold.and_then(|t| parse_amount(&form.amount).map(|cents| (t, cents)));
    let (threshold, usd_cents) = match rule {
        Ok(rule) => rule,
        Err(message) => {
            return render(
                &state,
                session,
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(("error", &message)),
                "",
            )
            .await
        }
    };
    let rule = Rule {
        enabled: form.enabled.is_some(),
        threshold_credits: threshold,
        usd_cents,
    };
    let by = session::actor(&session.email, client);
    let saved = state
        .auto_reloads
        .configure(&session.account_id, rule, &by)
        .await?;
    let (status, message) = if saved {
        (StatusCode::OK, ("success", "Auto-reload saved."))
    } else {
        (
            StatusCode::CONFLICT,
            (
                "error",
                "Pay once with a card to save it for auto-reload first.",
            ),
        )
    };
    render(&state, session, status, Some(message), "").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_from_ten_to_ten_thousand_dollars_are_accepted() {
        assert_eq!(parse_amount("10"), Ok(1_000));
        assert_eq!(parse_amount("$1,000"), Ok(100_000));
        assert_eq!(parse_amount(" 99.5 "), Ok(9_950));
        assert_eq!(parse_amount("10000.00"), Ok(1_000_000));
    }

    #[test]
    fn amounts_outside_the_range_or_not_money_are_refused_with_the_range() {
        for bad in [
            "9", "9.99", "10000.01", "10001", "", "abc", "-20", "1e3", "10.001",
        ] {
            let message = parse_amount(bad).expect_err(bad);
            assert!(message.contains("from $10 to $10,000"), "{bad}: {message}");
        }
    }
}
