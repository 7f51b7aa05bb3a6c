//! `/developers/audit`: the account's own audit log (who created or revoked its keys, topped it
//! up, refunded or disputed a payment, signed in or failed to), newest first, filtered by
//! action, and as a CSV download. Only the signed-in account's rows are ever read.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;
use serde_json::Value;

use super::error::DashboardError;
use super::layout::{datetime, notice, page, with_status, Nav};
use super::session::{needs, Allowed};
use super::usage::csv_field;
use crate::state::DashboardState;
use store::accounts::StoreError;
use store::audit::{Action, AuditQuery, AuditRecord, ACTIONS};
use store::developers::Session;

/// Rows on one page; older ones are a link away.
const PAGE_ROWS: usize = 100;
/// Rows in one CSV download, newest first.
const CSV_ROWS: usize = 10_000;

#[derive(Deserialize)]
pub struct Filter {
    action: Option<String>,
    /// Only rows older than this id: the next page. Read as text, so that a mangled link is
    /// this page's own error, not the extractor's.
    before: Option<String>,
}

impl Filter {
    /// The account's rows this filter asks for; `Err` names an action the log does not know.
    fn query(&self, session: &Session, limit: usize) -> Result<AuditQuery, String> {
        let action = match self.action.as_deref().filter(|a| !a.is_empty()) {
            None => None,
            Some(name) => {
                Some(Action::parse(name).ok_or_else(|| format!("There is no action “{name}”."))?)
            }
        };
        let before_id = match self.before.as_deref().filter(|b| !b.is_empty()) {
            None => None,
            Some(id) => Some(
                id.parse()
                    .map_err(|_| format!("“{id}” is not a page of this log."))?,
            ),
        };
        Ok(AuditQuery {
            action,
            before_id,
            ..own_rows(session, limit)
        })
    }
}

/// The latest `limit` rows of the session's account, whatever else a filter asks.
fn own_rows(session: &Session, limit: usize) -> AuditQuery {
    AuditQuery {
        account_id: Some(session.account_id.clone()),
        limit,
        ..AuditQuery::default()
    }
}

fn json_cell(value: &Value) -> String {
    if value.is_null() {
        String::new()
    } else {
        value.to_string()
    }
}

pub async fn show(
    State(state): State<Arc<DashboardState>>,
    Allowed { session, .. }: Allowed<needs::Audit>,
    Query(filter): Query<Filter>,
) -> Result<Response, DashboardError> {
    let (query, error) = match filter.query(&session, PAGE_ROWS + 1) {
        Ok(query) => (query, None),
        Err(message) => (own_rows(&session, PAGE_ROWS + 1), Some(message)),
    };
    let mut rows = state.audit.list(&query).await.map_err(StoreError::from)?;
    let older = (rows.len() > PAGE_ROWS).then(|| rows[PAGE_ROWS - 1].id);
    rows.truncate(PAGE_ROWS);
    let chosen = query.action.map(Action::as_str).unwrap_or_default();
    let content = html! {
        @if let Some(error) = &error { (notice("error", error)) }
        form.range.card method="get" action="/developers/audit" {
            div.field {
                label for="action" { "Action" }
                select #action name="action" {
                    option value="" { "Every action" }
                    @for action in ACTIONS {
                        @let name = action.as_str();
                        option value=(name) selected[name == chosen] { (name) }
                    }
                }
            }
            div.field.actions {
                button.primary type="submit" { "Show" }
                a.button #csv href=(format!("/developers/audit.csv?action={chosen}")) download { "Download CSV" }
            }
        }
        section.card {
            h2 { "Changes to money and access" }
            @if rows.is_empty() {
                p.empty { "Nothing recorded yet." }
            } @else {
                div.table-wrap {
                    table #audit-log {
                        thead { tr {
                            th scope="col" { "When" } th scope="col" { "Who" } th scope="col" { "From" }
                            th scope="col" { "Action" } th scope="col" { "Target" }
                            th scope="col" { "Before" } th scope="col" { "After" }
                        } }
                        tbody {
                            @for row in &rows {
                                tr data-action=(row.entry.action.as_str()) {
                                    td { (datetime(row.at)) }
                                    td { (row.entry.actor.id) " " span.badge { (row.entry.actor.kind.as_str()) } }
                                    td { (row.entry.actor.client.as_deref().unwrap_or("")) }
                                    td { (row.entry.action.as_str()) }
                                    td { code { (row.entry.target) } }
                                    td { code { (json_cell(&row.entry.before)) } }
                                    td { code { (json_cell(&row.entry.after)) } }
                                }
                            }
                        }
                    }
                }
                @if let Some(older) = older {
                    p.alt { a #older href=(format!("/developers/audit?action={chosen}&before={older}")) { "Older" } }
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
        page(&session, Nav::Audit, "Audit log", content),
    ))
}

fn csv_row(row: &AuditRecord) -> String {
    let e = &row.entry;
    let at = row
        .at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    [
        row.id.to_string(),
        at,
        e.actor.kind.as_str(),
        e.actor.id.clone(),
        e.actor.client.clone().unwrap_or_default(),
        e.action.as_str(),
        e.target.clone(),
        json_cell(&e.before),
        json_cell(&e.after),
    ]
    .iter()
    .map(|field| csv_field(field))
    .collect::<Vec<_>>()
    .join(",")
}

pub async fn csv(
    State(state): State<Arc<DashboardState>>,
    Allowed { session, .. }: Allowed<needs::Audit>,
    Query(filter): Query<Filter>,
) -> Result<Response, DashboardError> {
    let Ok(query) = filter.query(&session, CSV_ROWS) else {
        return Err(DashboardError::NotFound);
    };
    let rows = state.audit.list(&query).await.map_err(StoreError::from)?;
    let mut out = String::from("id,at,actor_kind,actor_id,client,action,target,before,after\n");
    for row in &rows {
        out.push_str(&csv_row(row));
        out.push('\n');
    }
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"audit-log.csv\"",
            ),
        ],
        out,
    )
        .into_response())
}
