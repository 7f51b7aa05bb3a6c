//! The Postgres file store of cluster mode: a file is one row, its content a `bytea`.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;
use time::OffsetDateTime;

use super::{FileInfo, FilePage, FileStore, GeneratedFile, NewFile, Order};
use crate::accounts::StoreError;
use crate::db::{from_db, Database, DbError};

const INFO_COLUMNS: &str = "id, account_id, filename, purpose, bytes, created_at, expires_at";
/// An upload that has not expired (a generated file has no expiry of its own).
pub(crate) const UNEXPIRED: &str = "(expires_at IS NULL OR expires_at > now())";

pub struct PostgresFileStore {
    db: Database,
}

impl PostgresFileStore {
    pub fn new(db: Database) -> Self {
        Self { db }
    }
}

fn info_of(row: &PgRow) -> Result<FileInfo, sqlx::Error> {
    Ok(FileInfo {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        filename: row.try_get("filename")?,
        purpose: row.try_get("purpose")?,
        bytes: from_db(row.try_get("bytes")?),
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
    })
}

/// What the account's unexpired uploads hold of its quota: content and names.
async fn held_bytes(db: impl sqlx::PgExecutor<'_>, account_id: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!(
        "SELECT coalesce(sum(bytes + octet_length(filename)), 0)::bigint FROM files
         WHERE account_id = $1 AND batch_id IS NULL AND {UNEXPIRED}"
    ))
    .bind(account_id)
    .persistent(false)
    .fetch_one(db)
    .await
}

async fn insert_file(
    db: &Database,
    file: &NewFile,
    max_account_bytes: u64,
) -> Result<bool, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    // One upload per account at a time, so two cannot both pass the quota.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 15))")
        .bind(&file.account_id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let held = held_bytes(&mut *tx, &file.account_id).await?;
    let bytes = i64::try_from(file.content.len()).unwrap_or(i64::MAX);
    let kept = i64::try_from(file.kept_bytes()).unwrap_or(i64::MAX);
    let max = i64::try_from(max_account_bytes).unwrap_or(i64::MAX);
    if held.saturating_add(kept) > max {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO files (id, account_id, filename, purpose, bytes, content, created_at, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(&file.id)
    .bind(&file.account_id)
    .bind(&file.filename)
    .bind(&file.purpose)
    .bind(bytes)
    .bind(&file.content)
    .bind(file.created_at)
    .bind(file.expires_at)
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Up to `len` bytes of the account's upload from `offset`, if it also meets `condition`.
async fn read_range(
    db: &Database,
    account_id: &str,
    id: &str,
    offset: u64,
    len: u32,
    condition: &str,
) -> Result<Option<Vec<u8>>, sqlx::Error> {
    // `substring` counts from 1. Postgres detoasts (and decompresses) the value to cut a
    // range out of it, but sends only the range: this process holds a range at a time.
    sqlx::query_scalar(&format!(
        "SELECT substring(content FROM $3 FOR $4) FROM files
         WHERE id = $1 AND account_id = $2 AND batch_id IS NULL AND {condition}"
    ))
    .bind(id)
    .bind(account_id)
    .bind(i32::try_from(offset).unwrap_or(i32::MAX).saturating_add(1))
    .bind(i32::try_from(len).unwrap_or(i32::MAX))
    .persistent(false)
    .fetch_optional(db.pool())
    .await
}

/// [`FileStore::delete`] as one statement, also within the batch store's transaction.
pub(crate) async fn delete_file(
    db: impl sqlx::PgExecutor<'_>,
    account_id: &str,
    id: &str,
) -> Result<bool, sqlx::Error> {
    // An expired upload is not found, as to the reads, and its row left to the sweep: see
    // the trait's `delete`.
    let deleted: i64 = sqlx::query_scalar(&format!(
        "WITH generated AS (
             UPDATE files SET deleted_at = now()
             WHERE id = $1 AND account_id = $2 AND batch_id IS NOT NULL
               AND deleted_at IS NULL
             RETURNING id
         ), upload AS (
             DELETE FROM files
             WHERE id = $1 AND account_id = $2 AND batch_id IS NULL AND {UNEXPIRED}
             RETURNING id
         )
         SELECT count(*) FROM (SELECT id FROM generated UNION ALL SELECT id FROM upload) d"
    ))
    .bind(id)
    .bind(account_id)
    .persistent(false)
    .fetch_one(db)
    .await?;
    Ok(deleted == 1)
}

#[async_trait]
impl FileStore for PostgresFileStore {
    async fn create(
        &self,
        file: NewFile,
        max_account_bytes: u64,
    ) -> Result<Option<FileInfo>, StoreError> {
        let info = file.info();
        let stored = self
            .db
            .bounded(insert_file(&self.db, &file, max_account_bytes))
            .await?;
        Ok(stored.then_some(info))
    }

    async fn held_bytes(&self, account_id: &str) -> Result<u64, StoreError> {
        let held = self
            .db
            .bounded(held_bytes(self.db.pool(), account_id))
            .await?;
        Ok(from_db(held))
    }

    async fn file(&self, account_id: &str, id: &str) -> Result<Option<FileInfo>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "SELECT {INFO_COLUMNS} FROM files
                     WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL AND {UNEXPIRED}"
                ))
                .bind(id)
                .bind(account_id)
                .persistent(false)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(row
            .as_ref()
            .map(info_of)
            .transpose()
            .map_err(DbError::Sql)?)
    }

    async fn content_range(
        &self,
        account_id: &str,
        id: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .db
            .bounded(read_range(&self.db, account_id, id, offset, len, UNEXPIRED))
            .await?)
    }

    async fn input_range(
        &self,
        account_id: &str,
        id: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        // Expired or not: the sweep keeps a file that a batch in progress reads.
        Ok(self
            .db
            .bounded(read_range(&self.db, account_id, id, offset, len, "TRUE"))
            .await?)
    }

    async fn content(&self, account_id: &str, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .db
            .bounded(
                sqlx::query_scalar(&format!(
                    "SELECT content FROM files
                     WHERE id = $1 AND account_id = $2 AND batch_id IS NULL AND {UNEXPIRED}"
                ))
                .bind(id)
                .bind(account_id)
                .persistent(false)
                .fetch_optional(self.db.pool()),
            )
            .await?)
    }

    async fn list(
        &self,
        account_id: &str,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: u32,
        order: Order,
    ) -> Result<FilePage, StoreError> {
        let (past, direction) = match order {
            Order::NewestFirst => ("<", "DESC"),
            Order::OldestFirst => (">", "ASC"),
        };
        let rows = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "SELECT {INFO_COLUMNS} FROM files
                     WHERE account_id = $1 AND deleted_at IS NULL AND {UNEXPIRED}
                       AND ($2::text IS NULL OR purpose = $2)
                       AND ($3::text IS NULL OR (created_at, id) {past}
                            (SELECT created_at, id FROM files WHERE id = $3 AND account_id = $1))
                     ORDER BY created_at {direction}, id {direction} LIMIT $4"
                ))
                .bind(account_id)
                .bind(purpose)
                .bind(after)
                .bind(i64::from(limit) + 1)
                .persistent(false)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let has_more = rows.len() > limit as usize;
        let files = rows
            .iter()
            .take(limit as usize)
            .map(info_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DbError::Sql)?;
        Ok(FilePage { files, has_more })
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .db
            .bounded(delete_file(self.db.pool(), account_id, id))
            .await?)
    }

    async fn record_generated(&self, file: GeneratedFile) -> Result<Option<FileInfo>, StoreError> {
        let bytes = i64::try_from(file.bytes).unwrap_or(i64::MAX);
        let row = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "WITH recorded AS (
                         INSERT INTO files
                             (id, account_id, filename, purpose, bytes, content, created_at, batch_id)
                         VALUES ($1, $2, $3, $4, $5, '', $6, $7)
                         ON CONFLICT (id) DO NOTHING
                         RETURNING {INFO_COLUMNS}, deleted_at
                     )
                     SELECT {INFO_COLUMNS}, deleted_at FROM recorded
                     UNION ALL
                     SELECT {INFO_COLUMNS}, deleted_at FROM files WHERE id = $1 AND account_id = $2"
                ))
                .bind(&file.id)
                .bind(&file.account_id)
                .bind(&file.filename)
                .bind(&file.purpose)
                .bind(bytes)
                .bind(file.created_at)
                .bind(&file.batch_id)
                .persistent(false)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        // Recorded by another pod at the same moment: its row was not in this statement's view.
        let row = match row {
            Some(row) => row,
            None => {
                let again = self
                    .db
                    .bounded(
                        sqlx::query(&format!(
                            "SELECT {INFO_COLUMNS}, deleted_at FROM files
                             WHERE id = $1 AND account_id = $2"
                        ))
                        .bind(&file.id)
                        .bind(&file.account_id)
                        .persistent(false)
                        .fetch_optional(self.db.pool()),
                    )
                    .await?;
                let Some(row) = again else {
                    return Ok(None);
                };
                row
            }
        };
        let deleted: Option<OffsetDateTime> = row.try_get("deleted_at").map_err(DbError::Sql)?;
        if deleted.is_some() {
            return Ok(None);
        }
        Ok(Some(info_of(&row).map_err(DbError::Sql)?))
    }

    async fn forget_generated(&self, ids: &[String]) -> Result<(), StoreError> {
        self.db
            .bounded(
                sqlx::query("DELETE FROM files WHERE id = ANY($1) AND batch_id IS NOT NULL")
                    .bind(ids)
                    .persistent(false)
                    .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }
}
