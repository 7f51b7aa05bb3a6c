//! `GET /v1/usage`: the account's usage report (`usage_report`) as JSON.

use std::sync::Arc;

use axum::extract::State;
use axum::http::Uri;
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::list_query;
use crate::error::ApiError;
use crate::state::AccountApi;
use gateway_core::auth::Principal;
use gateway_core::usage_report::{format_date, report, UsageQuery};
use store::ledger::UsageTotals;

pub async fn get(
    State(state): State<Arc<AccountApi>>,
    Extension(principal): Extension<Arc<Principal>>,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let query: UsageQuery = list_query::parse(&uri)?;
    let report = report(
        state.ledger.as_ref(),
        &state.catalog(),
        &principal.account.id,
        &query,
    )
    .await?;
    let data: Vec<Value> = report
        .groups
        .iter()
        .map(|group| {
            let mut entry = Map::new();
            if let Some(day) = group.date {
                entry.insert("date".into(), json!(format_date(day)));
            }
            if let Some(model) = &group.model {
                entry.insert("model".into(), json!(model));
            }
            // `null`: the turns that named no end user.
            if let Some(end_user) = &group.end_user {
                entry.insert("end_user".into(), json!(end_user));
            }
            if let Value::Object(counters) =
                totals_json(&group.totals, group.cache_read_credits_saved)
            {
                entry.extend(counters);
            }
            Value::Object(entry)
        })
        .collect();
    let group_by: Vec<&str> = [
        (report.by_day, "day"),
        (report.by_model, "model"),
        (report.by_end_user, "end_user"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    Ok(Json(json!({
        "object": "usage",
        "start_date": format_date(report.start),
        "end_date": format_date(report.end),
        "group_by": group_by,
        "end_user": report.end_user,
        "data": data,
        "totals": totals_json(&report.totals, report.cache_read_credits_saved),
    })))
}

/// The counters of a group, with what its cache reads saved.
fn totals_json(totals: &UsageTotals, saved: u64) -> Value {
    let mut value = json!(totals);
    if let Value::Object(fields) = &mut value {
        fields.insert("cache_read_credits_saved".into(), json!(saved));
    }
    value
}
