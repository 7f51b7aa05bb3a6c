//! `GET /v1/usage`: the account's usage from the ledger, by UTC day and/or model.
//! Query: `start_date`, `end_date` (YYYY-MM-DD, inclusive; default the last 30 days),
//! `group_by` (`day`, `model` or `day,model`, the default).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::Uri;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use time::macros::format_description;
use time::{Date, Duration, OffsetDateTime};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::state::AppState;
use store::ledger::UsageTotals;

const DEFAULT_DAYS: i64 = 30;
const MAX_DAYS: i64 = 366;

/// The query of `GET /v1/usage`; the dashboard's usage page takes the same one.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    pub start_date: Option<String>,
    pub end_date: Option<String>,
    pub group_by: Option<String>,
}

/// Usage totals of one group: a day, a model, or a day and a model.
pub struct UsageGroup {
    pub date: Option<Date>,
    pub model: Option<String>,
    pub totals: UsageTotals,
    /// Credits the group's cache reads saved against fresh input, at the models' prices now.
    pub cache_read_credits_saved: u64,
}

pub struct UsageReport {
    pub start: Date,
    pub end: Date,
    pub by_day: bool,
    pub by_model: bool,
    /// In order of day, then model.
    pub groups: Vec<UsageGroup>,
    pub totals: UsageTotals,
    pub cache_read_credits_saved: u64,
}

pub async fn get(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = Query::<UsageQuery>::try_from_uri(&uri)
        .map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))?;
    let report = report(&state, &principal.account.id, &query).await?;
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
            if let Value::Object(counters) =
                totals_json(&group.totals, group.cache_read_credits_saved)
            {
                entry.extend(counters);
            }
            Value::Object(entry)
        })
        .collect();
    let group_by: Vec<&str> = [(report.by_day, "day"), (report.by_model, "model")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    Ok(Json(json!({
        "object": "usage",
        "start_date": format_date(report.start),
        "end_date": format_date(report.end),
        "group_by": group_by,
        "data": data,
        "totals": totals_json(&report.totals, report.cache_read_credits_saved),
    })))
}

/// The account's usage from the ledger over the query's range, grouped as it asks.
pub async fn report(
    state: &AppState,
    account_id: &str,
    query: &UsageQuery,
) -> Result<UsageReport, ApiError> {
    let today = OffsetDateTime::now_utc().date();
    let end = date("end_date", query.end_date.as_deref())?.unwrap_or(today);
    let start = date("start_date", query.start_date.as_deref())?
        .unwrap_or(end - Duration::days(DEFAULT_DAYS - 1));
    if start > end {
        return Err(ApiError::invalid("start_date: must not be after end_date"));
    }
    if (end - start).whole_days() >= MAX_DAYS {
        return Err(ApiError::invalid(format!(
            "start_date: the range is at most {MAX_DAYS} days"
        )));
    }
    let (by_day, by_model) = group_by(query.group_by.as_deref())?;
    let rows = state.ledger.usage(account_id, start, end).await?;

    let catalog = state.catalog();
    let mut groups: BTreeMap<(Option<Date>, Option<String>), (UsageTotals, u64)> = BTreeMap::new();
    let (mut totals, mut saved) = (UsageTotals::default(), 0);
    for row in &rows {
        let key = (
            by_day.then_some(row.date),
            by_model.then(|| row.model.clone()),
        );
        // A model no longer offered has no price to compare with: nothing counted as saved.
        let row_saved = catalog.model(&row.model).map_or(0, |m| {
            m.price
                .saved_by_cache_reads(row.totals.cache_read_input_tokens)
        });
        let group = groups.entry(key).or_default();
        group.0.add(&row.totals);
        group.1 += row_saved;
        totals.add(&row.totals);
        saved += row_saved;
    }
    Ok(UsageReport {
        start,
        end,
        by_day,
        by_model,
        groups: groups
            .into_iter()
            .map(|((date, model), (totals, saved))| UsageGroup {
                date,
                model,
                totals,
                cache_read_credits_saved: saved,
            })
            .collect(),
        totals,
        cache_read_credits_saved: saved,
    })
}

/// The counters of a group, with what its cache reads saved.
fn totals_json(totals: &UsageTotals, saved: u64) -> Value {
    let mut value = json!(totals);
    if let Value::Object(fields) = &mut value {
        fields.insert("cache_read_credits_saved".into(), json!(saved));
    }
    value
}

fn date(field: &str, value: Option<&str>) -> Result<Option<Date>, ApiError> {
    value
        .map(|v| {
            Date::parse(v, format_description!("[year]-[month]-[day]"))
                .map_err(|_| ApiError::invalid(format!("{field}: expected a date as YYYY-MM-DD")))
        })
        .transpose()
}

pub fn format_date(d: Date) -> String {
    d.format(format_description!("[year]-[month]-[day]"))
        .unwrap_or_default()
}

fn group_by(value: Option<&str>) -> Result<(bool, bool), ApiError> {
    let Some(value) = value else {
        return Ok((true, true));
    };
    let (mut day, mut model) = (false, false);
    for part in value.split(',').map(str::trim) {
        match part {
            "day" => day = true,
            "model" => model = true,
            other => {
                return Err(ApiError::invalid(format!(
                    "group_by: unknown grouping `{other}`; use day, model or day,model"
                )))
            }
        }
    }
    Ok((day, model))
}
