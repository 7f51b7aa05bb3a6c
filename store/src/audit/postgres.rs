//! The audit log in Postgres (`audit_log`, migration 0011). The Postgres stores append a row
//! with [`append_in`] inside the transaction of the change it records. Statements are unnamed
//! (`persistent(false)`) so they also work through a transaction pooler (see `db::pool`).

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::{Action, Actor, ActorKind, AuditEntry, AuditError, AuditLog, AuditQuery, AuditRecord};
use crate::db::{Database, DbError};

pub struct PostgresAuditLog {
    db: Database,
}

impl PostgresAuditLog {
    pub fn new(db: Database) -> Self {
        Self { db }
    }
}

/// Appends `entry` on `conn`, a transaction that also makes the change.
pub async fn append_in(conn: &mut PgConnection, entry: &AuditEntry) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit_log
             (actor_kind, actor_id, client, account_id, action, target, before, after)
         VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb)",
    )
    .bind(entry.actor.kind.as_str())
    .bind(&entry.actor.id)
    .bind(&entry.actor.client)
    .bind(&entry.account_id)
    .bind(entry.action.as_str())
    .bind(&entry.target)
    .bind(json_text(&entry.before))
    .bind(json_text(&entry.after))
    .persistent(false)
    .execute(conn)
    .await?;
    Ok(())
}

/// `null` is stored as SQL NULL.
fn json_text(value: &Value) -> Option<String> {
    (!value.is_null()).then(|| value.to_string())
}

fn json_of(text: Option<String>) -> Result<Value, sqlx::Error> {
    text.map_or(Ok(Value::Null), |t| {
        serde_json::from_str(&t).map_err(|e| sqlx::Error::Decode(e.into()))
    })
}

fn record_of(row: &PgRow) -> Result<AuditRecord, sqlx::Error> {
    let kind: String = row.try_get("actor_kind")?;
    let action: String = row.try_get("action")?;
    Ok(AuditRecord {
        id: row.try_get("id")?,
        at: row.try_get("at")?,
        entry: AuditEntry {
            actor: Actor {
                kind: ActorKind::parse(&kind).ok_or_else(|| {
                    sqlx::Error::Decode(format!("unknown actor kind `{kind}`").into())
                })?,
                id: row.try_get("actor_id")?,
                client: row.try_get("client")?,
            },
            account_id: row.try_get("account_id")?,
            action: Action::parse(&action)
                .ok_or_else(|| sqlx::Error::Decode(format!("unknown action `{action}`").into()))?,
            target: row.try_get("target")?,
            before: json_of(row.try_get("before")?)?,
            after: json_of(row.try_get("after")?)?,
        },
    })
}

#[async_trait]
impl AuditLog for PostgresAuditLog {
    async fn list(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, AuditError> {
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT id, at, actor_kind, actor_id, client, account_id, action, target,
                            before::text AS before, after::text AS after
                     FROM audit_log
                     WHERE ($1::text IS NULL OR account_id = $1)
                       AND ($2::text IS NULL OR action = $2)
                       AND ($3::text IS NULL OR actor_kind = $3)
                       AND ($4::timestamptz IS NULL OR at >= $4)
                       AND ($5::timestamptz IS NULL OR at < $5)
                       AND ($6::bigint IS NULL OR id < $6)
                     ORDER BY id DESC LIMIT $7",
                )
                .bind(&query.account_id)
                .bind(query.action.map(Action::as_str))
                .bind(query.actor_kind.map(ActorKind::as_str))
                .bind(query.from)
                .bind(query.to)
                .bind(query.before_id)
                .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
                .fetch_all(self.db.pool()),
            )
            .await?;
        Ok(rows
            .iter()
            .map(record_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DbError::Sql)?)
    }
}
