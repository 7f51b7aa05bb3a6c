//! `/developers`: balance, tier and its limits, the way to the next tier, this month's spend
//! and the latest messages.

use std::sync::Arc;

use axum::extract::State;
use maud::{html, Markup};
use time::{Date, OffsetDateTime};

use super::error::DashboardError;
use super::layout::{datetime, dollars, page, thousands, Nav};
use super::session::SignedIn;
use crate::state::DashboardState;
use crds::config::TIER_IDS;
use gateway_core::payments::MIN_TOP_UP_CENTS;
use gateway_core::usage_report::{format_date, report, UsageQuery};
use store::accounts::promotion::{standing, ENTERPRISE};
use store::accounts::KeyRecord;
use store::developers::Permission;
use store::ledger::MessageStatus;

const RECENT_MESSAGES: usize = 10;

fn month_start(today: Date) -> Date {
    today.replace_day(1).unwrap_or(today)
}

fn status_label(status: MessageStatus) -> &'static str {
    match status {
        MessageStatus::Reserved => "running",
        MessageStatus::Completed => "completed",
        MessageStatus::ClientDisconnected => "client disconnected",
        MessageStatus::Interrupted => "interrupted",
        MessageStatus::Failed => "failed",
        MessageStatus::Abandoned => "abandoned",
        MessageStatus::Unbilled => "unbilled",
    }
}

/// Whether a live key of the account is in a tier below `tier`, the one its confirmed top-up
/// reached: the spec moves keys at the promotion sweep (every 5 minutes), so until then the
/// page says so rather than show a tier whose limits the keys do not have yet.
fn awaiting_the_sweep(keys: &[KeyRecord], tier: &str) -> bool {
    let live = keys.iter().filter(|k| !k.revoked).map(|k| k.tier.as_str());
    below(live, tier)
}

/// Whether one of `tiers` ranks below `tier` (enterprise, granted by hand, never does).
fn below<'a>(mut tiers: impl Iterator<Item = &'a str>, tier: &str) -> bool {
    let rank = |t: &str| TIER_IDS.iter().position(|id| *id == t);
    let Some(target) = rank(tier) else {
        return false;
    };
    tiers.any(|t| t != ENTERPRISE && rank(t).is_some_and(|r| r < target))
}

pub async fn show(
    State(state): State<Arc<DashboardState>>,
    SignedIn(session): SignedIn,
) -> Result<Markup, DashboardError> {
    let account_id = &session.account_id;
    let balance = state.ledger.balance(account_id).await?;
    let standing = standing(state.catalog().tiers(), balance.lifetime_top_up_cents);
    let limits = state.catalog().tier_limits(&standing.tier);
    let awaiting = awaiting_the_sweep(&state.accounts.keys_of(account_id).await?, &standing.tier);
    let today = OffsetDateTime::now_utc().date();
    let month = report(
        state.ledger.as_ref(),
        &state.catalog(),
        account_id,
        &UsageQuery {
            start_date: Some(format_date(month_start(today))),
            end_date: Some(format_date(today)),
            group_by: Some("model".to_owned()),
            end_user: None,
        },
    )
    .await?;
    let recent = state
        .ledger
        .recent_messages(account_id, RECENT_MESSAGES)
        .await?;
    let available = balance.balance.saturating_sub(balance.reserved);
    let per_usd = state.credits_per_usd.max(1);
    let content = html! {
        section.cards aria-label="Summary" {
            div.card.stat {
                h2 { "apiCredits balance" }
                p.big #balance { (thousands(available)) }
                p.hint { "≈ " (dollars(available * 100 / per_usd)) @if balance.reserved > 0 { " · " (thousands(balance.reserved)) " held by running turns" } }
                @if session.role.may(Permission::Billing) {
                    a.button.primary href="/developers/billing" { "Top up" }
                }
            }
            div.card.stat {
                h2 { "Tier" }
                p.big #tier { (standing.tier) }
                @if awaiting {
                    p.hint #tier-pending { "Your keys move to " strong { (standing.tier) } " at the next promotion sweep (every 5 minutes); until then they keep their current tier's limits (the API keys page shows each key's tier)." }
                }
                @if let Some(limits) = limits {
                    ul.limits {
                        li { strong { (thousands(limits.requests_per_minute.into())) } " requests / min" }
                        li { strong { (thousands(limits.input_tokens_per_minute)) } " input tokens / min" }
                        li { strong { (limits.concurrent_streams) } " concurrent streams" }
                    }
                }
            }
            div.card.stat {
                h2 { "Lifetime top-up" }
                p.big #lifetime { (dollars(balance.lifetime_top_up_cents)) }
                @match &standing.next {
                    Some((tier, cents)) if *cents <= MIN_TOP_UP_CENTS => p.hint { "Your first top-up moves you to " strong { (tier) } "." },
                    Some((tier, cents)) => p.hint { (dollars(*cents)) " more to reach " strong { (tier) } },
                    None => p.hint { "Highest tier reached by top-ups." },
                }
            }
            div.card.stat {
                h2 { "Spend this month" }
                p.big #month-spend { (thousands(month.totals.credits)) }
                p.hint { "credits · " (thousands(month.totals.requests)) " requests · ≈ " (dollars(month.totals.credits * 100 / per_usd)) }
            }
        }
        // The operator credits or keys an account by this id, never by its name.
        p.hint { "Account ID (give it to your operator for credits or keys): " code #account-id { (account_id) } }
        section.card {
            div.card-head {
                h2 { "Recent messages" }
                a href="/developers/usage" { "All usage →" }
            }
            @if recent.is_empty() {
                p.empty { "No messages yet." @if session.role.may(Permission::Keys) { " Mint a key on the " a href="/developers/keys" { "API keys" } " page and send your first request." } }
            } @else {
                div.table-wrap {
                    table #recent-messages {
                        thead { tr {
                            th scope="col" { "Message" } th scope="col" { "Model" } th scope="col" { "When" }
                            th.num scope="col" { "Input tokens" } th.num scope="col" { "Output tokens" }
                            th.num scope="col" { "Credits" } th scope="col" { "Status" }
                        } }
                        tbody {
                            @for m in &recent {
                                tr {
                                    td { code { (m.id) } }
                                    td { (m.model) }
                                    td { (datetime(m.created_at)) }
                                    td.num { (thousands(m.usage.input_tokens.into())) }
                                    td.num { (thousands(m.usage.output_tokens.into())) }
                                    td.num { (thousands(m.billed)) }
                                    td { span class=(format!("badge {}", status_label(m.status).replace(' ', "-"))) { (status_label(m.status)) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&session, Nav::Overview, "Overview", content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_key_below_the_reached_tier_awaits_the_sweep() {
        assert!(below(["free"].into_iter(), "pay_as_you_go"));
        assert!(below(["high_volume", "free"].into_iter(), "high_volume"));
        assert!(!below(["pay_as_you_go"].into_iter(), "pay_as_you_go"));
        assert!(!below([ENTERPRISE].into_iter(), "high_volume"));
        assert!(!below([].into_iter(), "high_volume"));
    }
}
