//! An account's usage from the ledger, by UTC day and/or model, over a range of days: what
//! `GET /v1/usage` answers and the dashboard's overview and usage pages draw.
//! Query: `start_date`, `end_date` (YYYY-MM-DD, inclusive; default the last 30 days),
//! `group_by` (any of `day`, `model` and `end_user`, comma-separated; default `day,model`),
//! `end_user` (only that end user's turns).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use thiserror::Error;
use time::macros::format_description;
use time::{Date, Duration, OffsetDateTime};

use crate::routing::Catalog;
use store::ledger::{Ledger, LedgerError, UsageRow, UsageTotals};

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
/// The most end users one report tells apart: a report grouped by end user over more is
/// refused (400), naming what narrows it (fewer days, or one `end_user`). End users are the
/// clients' own ids, unbounded in number; the cap bounds the answer and the work behind it.
pub const MAX_END_USERS: usize = 1_000;

/// The query of `GET /v1/usage`; the dashboard's usage page takes the same one.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    pub start_date: Option<String>,
    pub end_date: Option<String>,
    pub group_by: Option<String>,
    pub end_user: Option<String>,
}

/// Usage totals of one group: a day, a model, or a day and a model.
pub struct UsageGroup {
    pub date: Option<Date>,
    pub model: Option<String>,
    /// When grouped by end user: the group's (`None` inside: the turns that named none).
    pub end_user: Option<Option<String>>,
    pub totals: UsageTotals,
    /// Credits the group's cache reads saved against fresh input, at the models' prices now.
    pub cache_read_credits_saved: u64,
}

pub struct UsageReport {
    pub start: Date,
    pub end: Date,
    pub by_day: bool,
    pub by_model: bool,
    pub by_end_user: bool,
    /// Only this end user's turns.
    pub end_user: Option<String>,
    /// In order of day, then model, then end user.
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
    let (by_day, by_model, by_end_user) = group_by(query.group_by.as_deref())?;
    let end_user = query.end_user.as_deref().filter(|u| !u.is_empty());
    if let Some(end_user) = end_user {
        crate::validate::end_user("end_user", end_user)
            .map_err(|e| UsageError::Invalid(e.to_string()))?;
    }
    // The rollups have no end user: the rows are read only when the query needs one.
    let rows: Vec<(Option<String>, UsageRow)> = if by_end_user || end_user.is_some() {
        ledger
            .end_user_usage(account_id, start, end, end_user)
            .await?
            .into_iter()
            .map(|r| (r.end_user, r.usage))
            .collect()
    } else {
        ledger
            .usage(account_id, start, end)
            .await?
            .into_iter()
            .map(|r| (None, r))
            .collect()
    };
    if by_end_user {
        let users: BTreeSet<&Option<String>> = rows.iter().map(|(u, _)| u).collect();
        if users.len() > MAX_END_USERS {
            return Err(UsageError::Invalid(format!(
                "group_by: {} end users between {} and {}, more than the {MAX_END_USERS} a \
                 report groups; narrow start_date and end_date, or ask for one end_user",
                users.len(),
                format_date(start),
                format_date(end)
            )));
        }
    }

    type Key = (Option<Date>, Option<String>, Option<Option<String>>);
    let mut groups: BTreeMap<Key, (UsageTotals, u64)> = BTreeMap::new();
    let (mut totals, mut saved) = (UsageTotals::default(), 0);
    for (row_user, row) in &rows {
        let key = (
            by_day.then_some(row.date),
            by_model.then(|| row.model.clone()),
            by_end_user.then(|| row_user.clone()),
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
        by_end_user,
        end_user: end_user.map(str::to_owned),
        groups: groups
            .into_iter()
            .map(|((date, model, end_user), (totals, saved))| UsageGroup {
                date,
                model,
                end_user,
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

/// Whether to group by day, model and end user.
fn group_by(value: Option<&str>) -> Result<(bool, bool, bool), UsageError> {
    let Some(value) = value else {
        return Ok((true, true, false));
    };
    let (mut day, mut model, mut end_user) = (false, false, false);
    for part in value.split(',').map(str::trim) {
        match part {
            "day" => day = true,
            "model" => model = true,
            "end_user" => end_user = true,
            other => {
                return Err(UsageError::Invalid(format!(
                    "group_by: unknown grouping `{other}`; use day, model, end_user or a \
                     comma-separated list of them"
                )))
            }
        }
    }
    Ok((day, model, end_user))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::config::GatewayConfig;
    use store::audit::{Actor, ActorKind};
    use store::ledger::{MemoryLedger, MessageRecord, MessageStatus, NewReservation, Settlement};

    /// One settled turn for each of `end_users` end users of account `acct`.
    async fn ledger_of(end_users: usize) -> MemoryLedger {
        let ledger = MemoryLedger::default();
        let by = Actor::new(ActorKind::Cli, "test", None);
        ledger.add_credits("acct", 1_000_000, &by).await.unwrap();
        for n in 0..end_users {
            let id = format!("msg_{n}");
            let record = MessageRecord {
                id: id.clone(),
                account_id: "acct".into(),
                key_id: "key".into(),
                model: "svc/haiku".into(),
                end_user: Some(format!("user-{n}")),
                ..MessageRecord::default()
            };
            let reservation = NewReservation {
                record,
                spend_cap: None,
                min: 1,
                max: 1,
            };
            ledger.reserve(reservation).await.unwrap();
            let settlement = Settlement {
                cost: 1,
                ..Settlement::nothing(id, MessageStatus::Completed)
            };
            ledger.settle(settlement).await.unwrap();
        }
        ledger
    }

    fn by_end_user() -> UsageQuery {
        UsageQuery {
            group_by: Some("end_user".into()),
            ..UsageQuery::default()
        }
    }

    #[tokio::test]
    async fn a_report_groups_at_most_the_cap_of_end_users_and_refuses_more_naming_what_narrows_it()
    {
        let catalog = Catalog::new(GatewayConfig::default(), 1_000);
        let full = ledger_of(MAX_END_USERS).await;
        let grouped = report(&full, &catalog, "acct", &by_end_user())
            .await
            .unwrap();
        assert_eq!(grouped.groups.len(), MAX_END_USERS);
        assert_eq!(grouped.totals.requests, MAX_END_USERS as u64);

        let over = ledger_of(MAX_END_USERS + 1).await;
        let Err(UsageError::Invalid(message)) =
            report(&over, &catalog, "acct", &by_end_user()).await
        else {
            panic!("more end users than the cap were grouped");
        };
        assert!(
            message.starts_with("group_by: 1001 end users")
                && message.contains("ask for one end_user"),
            "{message}"
        );
        // One end user of them is still reported.
        let one = UsageQuery {
            end_user: Some("user-7".into()),
            ..by_end_user()
        };
        let filtered = report(&over, &catalog, "acct", &one).await.unwrap();
        assert_eq!(filtered.groups.len(), 1);
        assert_eq!(filtered.totals.requests, 1);
    }
}
