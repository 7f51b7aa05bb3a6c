//! `/developers/usage`: credits and tokens by day and model over a chosen range, as charts, a
//! table and a CSV download, of every turn or of one end user's. The numbers come from the very
//! function behind `GET /v1/usage`.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;
use time::Duration;

use super::charts::{stacked, Stacked};
use super::error::DashboardError;
use super::keys::{self, Listed};
use super::layout::{notice, page, thousands, with_status, Nav};
use super::session::SignedIn;
use crate::state::DashboardState;
use gateway_core::usage_report::{format_date, report, UsageError, UsageQuery, UsageReport};

#[derive(Deserialize)]
pub struct Range {
    start_date: Option<String>,
    end_date: Option<String>,
    /// Only this end user's turns (the `metadata.user_id`, `user` or `safety_identifier` their
    /// requests named), taken as typed: an end user may have spaces.
    end_user: Option<String>,
}

impl Range {
    fn query(&self) -> UsageQuery {
        let given = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
        UsageQuery {
            start_date: given(&self.start_date),
            end_date: given(&self.end_date),
            group_by: Some("day,model".to_owned()),
            end_user: given(&self.end_user),
        }
    }
}

/// Every day of the range, the models seen, and `values[day][model]` of one counter.
fn matrix(
    report: &UsageReport,
    models: &[String],
    counter: impl Fn(&store::ledger::UsageTotals) -> u64,
) -> (Vec<String>, Vec<Vec<u64>>) {
    let days_count = (report.end - report.start).whole_days() + 1;
    let days: Vec<_> = (0..days_count)
        .map(|d| report.start + Duration::days(d))
        .collect();
    let mut values = vec![vec![0; models.len()]; days.len()];
    for group in &report.groups {
        let (Some(date), Some(model)) = (group.date, &group.model) else {
            continue;
        };
        let d = (date - report.start).whole_days();
        if let (Ok(d), Some(m)) = (usize::try_from(d), models.iter().position(|x| x == model)) {
            values[d][m] += counter(&group.totals);
        }
    }
    (days.into_iter().map(format_date).collect(), values)
}

fn models_of(report: &UsageReport) -> Vec<String> {
    let mut models: Vec<String> = report
        .groups
        .iter()
        .filter_map(|g| g.model.clone())
        .collect();
    models.sort();
    models.dedup();
    models
}

pub async fn show(
    State(state): State<Arc<DashboardState>>,
    SignedIn(session): SignedIn,
    Query(range): Query<Range>,
) -> Result<Response, DashboardError> {
    let (ledger, catalog) = (state.ledger.as_ref(), state.catalog());
    let (report, error) = match report(ledger, &catalog, &session.account_id, &range.query()).await
    {
        Ok(report) => (report, None),
        Err(UsageError::Invalid(message)) => (
            report(
                ledger,
                &catalog,
                &session.account_id,
                &UsageQuery::default(),
            )
            .await?,
            Some(message),
        ),
        Err(e) => return Err(e.into()),
    };
    let capped: Vec<Listed> = keys::listed(&state, &session)
        .await?
        .into_iter()
        .filter(|k| k.cap.is_some() && !k.key.revoked)
        .collect();
    let models = models_of(&report);
    let (days, credits) = matrix(&report, &models, |t| t.credits);
    let (_, tokens) = matrix(&report, &models, |t| t.input_tokens + t.output_tokens);
    let start = format_date(report.start);
    let end = format_date(report.end);
    let end_user = report.end_user.clone().unwrap_or_default();
    let mut csv_query = vec![("start_date", start.as_str()), ("end_date", end.as_str())];
    if !end_user.is_empty() {
        csv_query.push(("end_user", end_user.as_str()));
    }
    let csv_href = format!(
        "/developers/usage.csv?{}",
        serde_html_form::to_string(&csv_query).unwrap_or_default()
    );
    let content = html! {
        @if let Some(error) = &error { (notice("error", error)) }
        form.range.card method="get" action="/developers/usage" {
            div.field { label for="start_date" { "From" } input #start_date type="date" name="start_date" value=(start); }
            div.field { label for="end_date" { "To" } input #end_date type="date" name="end_date" value=(end); }
            div.field { label for="end_user" { "End user" } input #end_user type="text" name="end_user" value=(end_user) maxlength="256" placeholder="all"; }
            div.field.actions {
                button.primary type="submit" { "Show" }
                a.button #csv href=(csv_href) download { "Download CSV" }
            }
        }
        @if !end_user.is_empty() {
            p #end-user-filter { "Turns of the end user " code { (end_user) } " only." }
        }
        section.cards aria-label="Totals" {
            div.card.stat { h2 { "Requests" } p.big #total-requests { (thousands(report.totals.requests)) } }
            div.card.stat { h2 { "Input tokens" } p.big #total-input { (thousands(report.totals.input_tokens)) } }
            div.card.stat { h2 { "Output tokens" } p.big #total-output { (thousands(report.totals.output_tokens)) } }
            div.card.stat { h2 { "Credits" } p.big #total-credits { (thousands(report.totals.credits)) } }
            div.card.stat { h2 { "Credits of Message Batches" } p.big #total-batch-credits { (thousands(report.totals.batch_credits)) } }
            div.card.stat { h2 { "Saved by cache reads" } p.big #total-cache-saved { (thousands(report.cache_read_credits_saved)) } }
        }
        @if !capped.is_empty() {
            section.card {
                h2 { "Keys with a monthly spend cap (this UTC month)" }
                div.table-wrap {
                    table #key-caps {
                        thead { tr {
                            th scope="col" { "Key" } th.num scope="col" { "Spent" }
                            th.num scope="col" { "Running now" } th.num scope="col" { "Cap" }
                        } }
                        tbody {
                            @for k in &capped {
                                tr data-key-id=(k.key.id) {
                                    td { (k.key.name) " " code { (k.key.prefix) "…" } }
                                    td.num.spent { (thousands(k.spend.spent)) }
                                    td.num { (thousands(k.spend.reserved)) }
                                    td.num.cap { (thousands(k.cap.unwrap_or_default())) }
                                }
                            }
                        }
                    }
                }
            }
        }
        section.card {
            h2 { "Credits by day" }
            (stacked(&Stacked { id: "credits-chart", title: "Credits", unit: "credits", days: &days, series: &models, values: &credits }))
        }
        section.card {
            h2 { "Tokens by day (input + output)" }
            (stacked(&Stacked { id: "tokens-chart", title: "Tokens", unit: "tokens", days: &days, series: &models, values: &tokens }))
        }
        section.card {
            h2 { "By day and model" }
            @if report.groups.is_empty() {
                p.empty { "No usage in this range." }
            } @else {
                div.table-wrap {
                    table #usage-table {
                        thead { tr {
                            th scope="col" { "Day" } th scope="col" { "Model" } th.num scope="col" { "Requests" }
                            th.num scope="col" { "Input tokens" } th.num scope="col" { "Output tokens" }
                            th.num scope="col" { "Cache read" } th.num scope="col" { "Cache write" } th.num scope="col" { "Credits" }
                            th.num scope="col" { "Saved by cache" }
                        } }
                        tbody {
                            @for g in &report.groups {
                                tr {
                                    td { (g.date.map(format_date).unwrap_or_default()) }
                                    td { (g.model.clone().unwrap_or_default()) }
                                    td.num { (thousands(g.totals.requests)) }
                                    td.num { (thousands(g.totals.input_tokens)) }
                                    td.num { (thousands(g.totals.output_tokens)) }
                                    td.num { (thousands(g.totals.cache_read_input_tokens)) }
                                    td.num { (thousands(g.totals.cache_creation_input_tokens)) }
                                    td.num { (thousands(g.totals.credits)) }
                                    td.num { (thousands(g.cache_read_credits_saved)) }
                                }
                            }
                        }
                        tfoot { tr {
                            th scope="row" colspan="2" { "Total" }
                            td.num { (thousands(report.totals.requests)) }
                            td.num { (thousands(report.totals.input_tokens)) }
                            td.num { (thousands(report.totals.output_tokens)) }
                            td.num { (thousands(report.totals.cache_read_input_tokens)) }
                            td.num { (thousands(report.totals.cache_creation_input_tokens)) }
                            td.num { (thousands(report.totals.credits)) }
                            td.num { (thousands(report.cache_read_credits_saved)) }
                        } }
                    }
                }
            }
        }
    };
    let status = if error.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    Ok(with_status(
        status,
        page(&session, Nav::Usage, "Usage", content),
    ))
}

/// A CSV cell: quoted when it holds a separator or a quote; one a spreadsheet would run as a
/// formula (`=`, `+`, `-`, `@` first) is quoted with a leading `'`, so that it is read as text.
pub(super) fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_owned()
    };
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

pub async fn csv(
    State(state): State<Arc<DashboardState>>,
    SignedIn(session): SignedIn,
    Query(range): Query<Range>,
) -> Result<Response, DashboardError> {
    let report = report(
        state.ledger.as_ref(),
        &state.catalog(),
        &session.account_id,
        &range.query(),
    )
    .await?;
    let mut out = String::from("date,model,requests,input_tokens,output_tokens,cache_creation_input_tokens,cache_read_input_tokens,credits,cache_read_credits_saved\n");
    for g in &report.groups {
        let t = &g.totals;
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            g.date.map(format_date).unwrap_or_default(),
            csv_field(g.model.as_deref().unwrap_or_default()),
            t.requests,
            t.input_tokens,
            t.output_tokens,
            t.cache_creation_input_tokens,
            t.cache_read_input_tokens,
            t.credits,
            g.cache_read_credits_saved
        ));
    }
    let filename = format!(
        "attachment; filename=\"usage-{}-{}.csv\"",
        format_date(report.start),
        format_date(report.end)
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (header::CONTENT_DISPOSITION, filename),
        ],
        out,
    )
        .into_response())
}
