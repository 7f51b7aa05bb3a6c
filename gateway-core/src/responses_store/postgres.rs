//! Stored responses in Postgres (`stored_responses`, migrations 0005 and 0008), shared by every
//! pod: each call bounded by the database timeout; rows past retention are invisible at once
//! and deleted by [`PostgresResponseStore::purge_expired`], which every pod runs on a timer
//! (deleting is idempotent, so pods never conflict).
//!
//! A put keeps its account within its [`Quota`] in one transaction: it takes the account's
//! advisory lock (so two pods' puts for one account never both see room that only one of
//! them has), evicts the account's oldest rows beyond what the new one leaves room for (their
//! `bytes` summed over the `(account_id, created_at)` index), and writes the row.

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{
    size_of, to_micros, Quota, ResponseStore, ResponseStoreError, Retention, StoredResponse,
};
use store::db::to_db;
use store::db::{Database, DbError};

/// Rows one purge statement deletes, so that a large backlog never holds long locks.
const PURGE_BATCH: i64 = 1_000;

pub struct PostgresResponseStore {
    db: Database,
    retention: Retention,
    quota: Quota,
}

fn unavailable(e: DbError) -> ResponseStoreError {
    ResponseStoreError::Unavailable(e.to_string())
}

fn malformed(e: serde_json::Error) -> ResponseStoreError {
    ResponseStoreError::Unavailable(format!("stored response is not valid JSON: {e}"))
}

impl PostgresResponseStore {
    pub fn new(db: Database, retention: Retention, quota: Quota) -> Self {
        Self {
            db,
            retention,
            quota,
        }
    }

    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// Deletes the responses past retention, a batch at a time; returns how many.
    pub async fn purge_expired(&self) -> Result<u64, ResponseStoreError> {
        let cutoff = self.retention.cutoff(OffsetDateTime::now_utc());
        let mut purged = 0;
        loop {
            let deleted = self
                .db
                .bounded(
                    sqlx::query(
                        "DELETE FROM stored_responses WHERE id IN (
                            SELECT id FROM stored_responses WHERE created_at <= $1
                            ORDER BY created_at LIMIT $2)",
                    )
                    .bind(cutoff)
                    .bind(PURGE_BATCH)
                    .execute(self.db.pool()),
                )
                .await
                .map_err(unavailable)?
                .rows_affected();
            purged += deleted;
            if deleted < PURGE_BATCH as u64 {
                return Ok(purged);
            }
        }
    }
}

#[async_trait]
impl ResponseStore for PostgresResponseStore {
    async fn put(&self, stored: StoredResponse) -> Result<(), ResponseStoreError> {
        let bytes = size_of(&stored);
        self.quota.admit(bytes)?;
        // JSON text cast to jsonb in the statement: the pool's sqlx has no JSON type support.
        let response = serde_json::to_string(&stored.response).map_err(malformed)?;
        let items = serde_json::to_string(&stored.input_items).map_err(malformed)?;
        let room = self.quota.account_max_bytes - bytes;
        let pool = self.db.pool();
        let put = async {
            let mut tx = pool.begin().await?;
            sqlx::query(
                "SELECT pg_advisory_xact_lock(hashtextextended('stored_responses:' || $1, 0))",
            )
            .bind(&stored.account_id)
            .persistent(false)
            .execute(&mut *tx)
            .await?;
            // Keeps the newest rows that fit in the room the new one leaves; a row the put
            // replaces is not counted, since it goes anyway.
            sqlx::query(
                "DELETE FROM stored_responses WHERE id IN (
                    SELECT id FROM (
                        SELECT id, sum(bytes) OVER (ORDER BY created_at DESC, id DESC) AS held
                        FROM stored_responses WHERE account_id = $1 AND id <> $2
                    ) newest WHERE held > $3)",
            )
            .bind(&stored.account_id)
            .bind(&stored.id)
            .bind(to_db(room as u64))
            .persistent(false)
            .execute(&mut *tx)
            .await?;
            let written = sqlx::query(
                "INSERT INTO stored_responses (id, account_id, created_at, response, input_items, bytes)
                 VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6)
                 ON CONFLICT (id) DO UPDATE SET
                     created_at = EXCLUDED.created_at,
                     response = EXCLUDED.response,
                     input_items = EXCLUDED.input_items,
                     bytes = EXCLUDED.bytes
                 WHERE stored_responses.account_id = EXCLUDED.account_id",
            )
            .bind(&stored.id)
            .bind(&stored.account_id)
            .bind(to_micros(stored.created_at))
            .bind(response)
            .bind(items)
            .bind(to_db(bytes as u64))
            .persistent(false)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if written == 0 {
                // Another account's id: nothing of this account is evicted for it.
                tx.rollback().await?;
            } else {
                tx.commit().await?;
            }
            Ok::<_, sqlx::Error>(written)
        };
        let written = self.db.bounded(put).await.map_err(unavailable)?;
        if written == 0 {
            return Err(ResponseStoreError::IdTaken(stored.id));
        }
        Ok(())
    }

    async fn get(
        &self,
        account_id: &str,
        id: &str,
    ) -> Result<Option<StoredResponse>, ResponseStoreError> {
        let cutoff = self.retention.cutoff(OffsetDateTime::now_utc());
        let row: Option<(OffsetDateTime, String, String)> = self
            .db
            .bounded(
                sqlx::query_as(
                    "SELECT created_at, response::text, input_items::text FROM stored_responses
                     WHERE id = $1 AND account_id = $2 AND created_at > $3",
                )
                .bind(id)
                .bind(account_id)
                .bind(cutoff)
                .fetch_optional(self.db.pool()),
            )
            .await
            .map_err(unavailable)?;
        let Some((created_at, response, items)) = row else {
            return Ok(None);
        };
        Ok(Some(StoredResponse {
            id: id.to_owned(),
            account_id: account_id.to_owned(),
            created_at,
            response: serde_json::from_str(&response).map_err(malformed)?,
            input_items: serde_json::from_str(&items).map_err(malformed)?,
        }))
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, ResponseStoreError> {
        let deleted = self
            .db
            .bounded(
                sqlx::query("DELETE FROM stored_responses WHERE id = $1 AND account_id = $2")
                    .bind(id)
                    .bind(account_id)
                    .execute(self.db.pool()),
            )
            .await
            .map_err(unavailable)?
            .rows_affected();
        Ok(deleted > 0)
    }

    fn quota(&self) -> Quota {
        self.quota
    }
}
