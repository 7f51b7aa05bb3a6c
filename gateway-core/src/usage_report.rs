//! An account's usage from the ledger, by UTC day and/or model, over a range of days: what
//! `GET /v1/usage` answers and the dashboard's overview and usage pages draw.
//! Query: `start_date`, `end_date` (YYYY-MM-DD, inclusive; default the last 30 days),
//! `group_by` (`day`, `model` or `day,model`, the default).

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;
use time::macros::format_description;
use time::{Date, Duration, OffsetDateTime};

use crate::routing::Catalog;
use store::ledger::{Ledger, LedgerError, UsageTotals};

#[derive(Debug, Error)]
pub enum UsageError {
    /// The query asks for something the report cannot be (400).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

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

/// The account's usage from the ledger over the query's range, grouped as it asks.
pub async fn report(
    ledger: &dyn Ledger,
    catalog: &Catalog,
    account_id: &str,
    query: &UsageQuery,
) -> Result<UsageReport, UsageError> {
    let today = OffsetDateTime::now_utc().date();
    let end = date("end_date", query.end_date.as_deref())?.unwrap_or(today);
    let start = date("start_date", query.start_date.as_deref())?
        .unwrap_or(end - Duration::days(DEFAULT_DAYS - 1));
    if start > end {
        return Err(UsageError::Invalid(
            "start_date: must not be after end_date".to_owned(),
        ));
    }
    if (end - start).whole_days() >= MAX_DAYS {
        return Err(UsageError::Invalid(format!(
            "start_date: the range is at most {MAX_DAYS} days"
        )));
    }
    let (by_day, by_model) = group_by(query.group_by.as_deref())?;
    let rows = ledger.usage(account_id, start, end).await?;

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

fn date(field: &str, value: Option<&str>) -> Result<Option<Date>, UsageError> {
    value
        .map(|v| {
            Date::parse(v, format_description!("[year]-[month]-[day]"))
                .map_err(|_| UsageError::Invalid(format!("{field}: expected a date as YYYY-MM-DD")))
        })
        .transpose()
}

pub fn format_date(d: Date) -> String {
    d.format(format_description!("[year]-[month]-[day]"))
        .unwrap_or_default()
}

fn group_by(value: Option<&str>) -> Result<(bool, bool), UsageError> {
    let Some(value) = value else {
        return Ok((true, true));
    };
    let (mut day, mut model) = (false, false);
    for part in value.split(',').map(str::trim) {
        match part {
            "day" => day = true,
            "model" => model = true,
            other => {
                return Err(UsageError::Invalid(format!(
                    "group_by: unknown grouping `{other}`; use day, model or day,model"
                )))
            }
        }
    }
    Ok((day, model))
}
