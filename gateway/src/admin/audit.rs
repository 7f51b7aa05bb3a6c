//! `GET /admin/audit`: the audit log, newest first, filtered by `account_id`, `action`,
//! `actor_kind` and a time range (`from` inclusive, `to` exclusive, RFC 3339), paged like the
//! API's lists: `limit` rows (1 to 1000, default 100) and `has_more`; the next page is asked
//! with `after_id` = the page's `last_id`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::Admin;
use crate::error::ApiError;
use store::accounts::StoreError;
use store::audit::{Action, ActorKind, AuditQuery, ACTIONS, ACTOR_KINDS};

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

#[derive(Deserialize)]
pub struct Params {
    account_id: Option<String>,
    action: Option<String>,
    actor_kind: Option<String>,
    from: Option<String>,
    to: Option<String>,
    after_id: Option<String>,
    limit: Option<String>,
}

fn names<T: Copy>(all: &[T], name: impl Fn(T) -> String) -> String {
    all.iter().map(|v| name(*v)).collect::<Vec<_>>().join(", ")
}

fn time_of(field: &str, value: Option<&str>) -> Result<Option<OffsetDateTime>, ApiError> {
    value
        .map(|v| {
            OffsetDateTime::parse(v, &Rfc3339).map_err(|_| {
                ApiError::invalid(format!(
                    "{field}: `{v}` is not an RFC 3339 time like 2026-01-31T00:00:00Z"
                ))
            })
        })
        .transpose()
}

impl Params {
    fn query(self) -> Result<AuditQuery, ApiError> {
        let action = self
            .action
            .map(|a| {
                Action::parse(&a).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "action: unknown action `{a}`; known: {}",
                        names(&ACTIONS, Action::as_str)
                    ))
                })
            })
            .transpose()?;
        let actor_kind = self
            .actor_kind
            .map(|k| {
                ActorKind::parse(&k).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "actor_kind: unknown kind `{k}`; known: {}",
                        names(&ACTOR_KINDS, ActorKind::as_str)
                    ))
                })
            })
            .transpose()?;
        let before_id = self
            .after_id
            .map(|id| {
                id.parse::<i64>().map_err(|_| {
                    ApiError::invalid(format!("after_id: `{id}` is not a row id of this log"))
                })
            })
            .transpose()?;
        let limit = match self.limit {
            None => DEFAULT_LIMIT,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|l| (1..=MAX_LIMIT).contains(l))
                .ok_or_else(|| {
                    ApiError::invalid(format!("limit: must be from 1 to {MAX_LIMIT}"))
                })?,
        };
        Ok(AuditQuery {
            account_id: self.account_id,
            action,
            actor_kind,
            from: time_of("from", self.from.as_deref())?,
            to: time_of("to", self.to.as_deref())?,
            before_id,
            // One more than the page, to tell whether there is a next one.
            limit: limit + 1,
        })
    }
}

pub async fn list(
    State(admin): State<Admin>,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid(format!("query: {e}")))?;
    let query = params.query()?;
    let mut rows = admin
        .state
        .audit
        .list(&query)
        .await
        .map_err(StoreError::from)?;
    let has_more = rows.len() == query.limit;
    rows.truncate(query.limit - 1);
    Ok(Json(json!({
        "data": rows,
        "has_more": has_more,
        "first_id": rows.first().map(|r| r.id.to_string()),
        "last_id": rows.last().map(|r| r.id.to_string()),
    })))
}
