//! The Postgres batch store of cluster mode: every pod's workers claim items from the same
//! tables with `FOR UPDATE SKIP LOCKED`, under a lease (`claimed_by`, `lease_until`); a result
//! is written by a conditional update on the item's state and holder, so it is written once.

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;
use time::OffsetDateTime;

use super::{
    result_of, Batch, BatchDraft, BatchPage, BatchStore, CapReached, ClaimedItem, Cursor, Deleted,
    InputLine, ItemResult, ItemState, KeyCaps, NewBatch, NewItem, Outcome, RequestCounts,
    RequestFormat,
};
use crate::accounts::{KeyHash, StoreError};
use crate::db::{from_db, name_of, parse_name, Database, DbError};
use crate::files::postgres::{delete_file, UNEXPIRED};

/// A count or a byte offset as Postgres' `bigint`.
fn to_db(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Items written per statement when a batch is created (seven arrays of this many each).
const INSERT_CHUNK: usize = 5_000;

/// How long a draft's rows are kept before the sweep deletes them: longer than any body may
/// take to arrive (a create whose pod died midway leaves them).
const DRAFTS_KEPT: time::Duration = time::Duration::days(1);

/// Items deleted per statement when a batch past its retention is forgotten.
const FORGET_CHUNK: i64 = 1_000;

const BATCH_COLUMNS: &str =
    "id, account_id, key_id, created_at, expires_at, cancel_initiated_at, format, details";

pub struct PostgresBatchStore {
    db: Database,
}

impl PostgresBatchStore {
    pub fn new(db: Database) -> Self {
        Self { db }
    }

    /// The batches of these rows, with their counts.
    async fn with_counts(&self, rows: Vec<PgRow>) -> Result<Vec<Batch>, StoreError> {
        let mut batches = rows
            .iter()
            .map(batch_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DbError::Sql)?;
        let ids: Vec<String> = batches.iter().map(|b| b.id.clone()).collect();
        let counts = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT batch_id, state, count(*) AS n, max(ended_at) AS ended_at
                     FROM message_batch_items WHERE batch_id = ANY($1) GROUP BY batch_id, state",
                )
                .bind(&ids)
                .persistent(false)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let mut by_batch: HashMap<String, (RequestCounts, Option<OffsetDateTime>)> = HashMap::new();
        for row in &counts {
            let id: String = row.try_get("batch_id").map_err(DbError::Sql)?;
            let state: String = row.try_get("state").map_err(DbError::Sql)?;
            let n: i64 = row.try_get("n").map_err(DbError::Sql)?;
            let ended: Option<OffsetDateTime> = row.try_get("ended_at").map_err(DbError::Sql)?;
            let entry = by_batch.entry(id).or_default();
            if let Some(state) = parse_name(&ItemState::ALL, &state) {
                entry.0.add(state, from_db(n));
            }
            entry.1 = entry.1.max(ended);
        }
        for batch in &mut batches {
            let (counts, last_ended) = by_batch.remove(&batch.id).unwrap_or_default();
            batch.counts = counts;
            batch.ended_at =
                (counts.processing == 0).then(|| last_ended.unwrap_or(batch.created_at));
        }
        Ok(batches)
    }

    async fn one(&self, account_id: &str, id: &str) -> Result<Option<Batch>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "SELECT {BATCH_COLUMNS} FROM message_batches WHERE id = $1 AND account_id = $2"
                ))
                .bind(id)
                .bind(account_id)
                .persistent(false)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(self.with_counts(row.into_iter().collect()).await?.pop())
    }
}

fn format_of(row: &PgRow) -> Result<RequestFormat, sqlx::Error> {
    let format: String = row.try_get("format")?;
    parse_name(&RequestFormat::ALL, &format)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown batch format `{format}`").into()))
}

fn batch_of(row: &PgRow) -> Result<Batch, sqlx::Error> {
    Ok(Batch {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        key_id: row.try_get("key_id")?,
        counts: RequestCounts::default(),
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        cancel_initiated_at: row.try_get("cancel_initiated_at")?,
        ended_at: None,
        format: format_of(row)?,
        details: row.try_get("details")?,
    })
}

fn index_of(row: &PgRow) -> Result<u32, sqlx::Error> {
    let idx: i32 = row.try_get("idx")?;
    Ok(u32::try_from(idx).unwrap_or(0))
}

/// Refuses a new batch of `queued` items holding `queued_bytes` of params that would pass one
/// of its key's caps; takes the key's and the account's creation locks, held until `tx` ends,
/// so that two creations cannot both pass a cap.
async fn check_caps(
    tx: &mut sqlx::PgConnection,
    key_id: &str,
    account_id: &str,
    queued: u64,
    queued_bytes: u64,
    caps: KeyCaps,
) -> Result<Result<(), CapReached>, sqlx::Error> {
    // One creation per key at a time, so two cannot both pass the cap.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 38))")
        .bind(key_id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let in_progress: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM message_batches b WHERE b.key_id = $1 AND EXISTS (
             SELECT 1 FROM message_batch_items i
             WHERE i.batch_id = b.id AND i.state IN ('queued', 'running'))",
    )
    .bind(key_id)
    .persistent(false)
    .fetch_one(&mut *tx)
    .await?;
    if in_progress >= i64::from(caps.max_in_progress) {
        return Ok(Err(CapReached::InProgress));
    }
    // The open items' partial index, per batch of the key.
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM message_batches b JOIN message_batch_items i ON i.batch_id = b.id
         WHERE b.key_id = $1 AND i.state IN ('queued', 'running')",
    )
    .bind(key_id)
    .persistent(false)
    .fetch_one(&mut *tx)
    .await?;
    if from_db(open).saturating_add(queued) > caps.max_queued_items {
        return Ok(Err(CapReached::QueuedItems));
    }
    // One creation per account at a time too, so that two keys of one account cannot both
    // pass its storage quota.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 39))")
        .bind(account_id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let held = held_bytes(&mut *tx, account_id).await?;
    if held.saturating_add(queued_bytes) > caps.max_account_bytes {
        return Ok(Err(CapReached::AccountBytes));
    }
    Ok(Ok(()))
}

async fn insert_batch_row(
    tx: &mut sqlx::PgConnection,
    batch: &NewBatch,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO message_batches
             (id, account_id, key_id, key_hash, created_at, expires_at, format, details)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(&batch.id)
    .bind(&batch.account_id)
    .bind(&batch.key_id)
    .bind(batch.key_hash.as_bytes())
    .bind(batch.created_at)
    .bind(batch.expires_at)
    .bind(name_of(&batch.format))
    .bind(&batch.details)
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Item `first + n` of `items` as the arrays of one `UNNEST`: index, custom id, params (none
/// kept for a refused item, which never runs), result.
struct ItemColumns<'a> {
    idx: Vec<i32>,
    custom_ids: Vec<&'a str>,
    params: Vec<&'a str>,
    results: Vec<Option<&'a str>>,
    line_files: Vec<Option<&'a str>>,
    line_offsets: Vec<Option<i64>>,
    line_lens: Vec<Option<i64>>,
}

impl<'a> ItemColumns<'a> {
    fn of(first: usize, items: &'a [NewItem]) -> Self {
        Self {
            idx: (first..first + items.len())
                .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
                .collect(),
            custom_ids: items.iter().map(|i| i.custom_id.as_str()).collect(),
            params: items
                .iter()
                .map(|i| match i.refused {
                    Some(_) => "",
                    None => i.params.as_str(),
                })
                .collect(),
            results: items.iter().map(|i| i.refused.as_deref()).collect(),
            line_files: items
                .iter()
                .map(|i| i.line.as_ref().map(|l| l.file_id.as_str()))
                .collect(),
            line_offsets: items
                .iter()
                .map(|i| i.line.as_ref().map(|l| to_db(l.offset)))
                .collect(),
            line_lens: items
                .iter()
                .map(|i| i.line.as_ref().map(|l| to_db(l.len)))
                .collect(),
        }
    }
}

/// Whether every input file the batch's items read is an unexpired upload of its account,
/// each then held `FOR SHARE` until `tx` ends: a file delete or the expired files' sweep
/// takes the row `FOR UPDATE` before it looks for the items reading it
/// ([`lock_file_then_check`]), so it either waits for this batch's items and sees them, or
/// deletes first and this finds the row gone.
async fn input_files_kept(
    tx: &mut sqlx::PgConnection,
    batch: &NewBatch,
) -> Result<bool, sqlx::Error> {
    let mut files: Vec<&str> = batch
        .items
        .iter()
        .filter_map(|i| i.line.as_ref().map(|l| l.file_id.as_str()))
        .collect();
    files.sort_unstable();
    files.dedup();
    if files.is_empty() {
        return Ok(true);
    }
    let kept: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT id FROM files
         WHERE id = ANY($1) AND account_id = $2 AND batch_id IS NULL AND {UNEXPIRED}
         ORDER BY id FOR SHARE"
    ))
    .bind(&files)
    .bind(&batch.account_id)
    .persistent(false)
    .fetch_all(&mut *tx)
    .await?;
    Ok(kept.len() == files.len())
}

/// Open items of the file's account that read it (by the account's batches and the open
/// items' partial index); `$1` the file's id, `$2` its account.
const FILE_READ: &str = "EXISTS (
     SELECT 1 FROM message_batches b JOIN message_batch_items i ON i.batch_id = b.id
     WHERE b.account_id = $2 AND i.state IN ('queued', 'running') AND i.line_file_id = $1)";

/// Deletes the account's file unless an open item reads it: the row is locked first, then the
/// items are looked for by a statement that starts after the lock is held, so it sees every
/// create that held the row ([`input_files_kept`]) and no later create can take it.
async fn lock_file_then_check(
    db: &Database,
    account_id: &str,
    file_id: &str,
) -> Result<Deleted, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    sqlx::query("SELECT 1 FROM files WHERE id = $1 AND account_id = $2 FOR UPDATE")
        .bind(file_id)
        .bind(account_id)
        .persistent(false)
        .fetch_optional(&mut *tx)
        .await?;
    let read: bool = sqlx::query_scalar(&format!("SELECT {FILE_READ}"))
        .bind(file_id)
        .bind(account_id)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await?;
    if read {
        return Ok(Deleted::Processing);
    }
    let deleted = delete_file(&mut *tx, account_id, file_id).await?;
    tx.commit().await?;
    Ok(if deleted {
        Deleted::Deleted
    } else {
        Deleted::NotFound
    })
}

/// Deletes up to `limit` uploads expired at `now` that no open item reads, as a file delete
/// decides ([`lock_file_then_check`]): the candidates locked first (those a create holds are
/// skipped), then deleted by a statement that sees every item written before the locks.
async fn forget_expired_files(
    db: &Database,
    now: OffsetDateTime,
    limit: u32,
) -> Result<u64, sqlx::Error> {
    let unread = FILE_READ
        .replace("$1", "f.id")
        .replace("$2", "f.account_id");
    let mut tx = db.pool().begin().await?;
    let ids: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT f.id FROM files f
         WHERE f.expires_at <= $1 AND f.batch_id IS NULL AND NOT {unread}
         ORDER BY f.expires_at LIMIT $2 FOR UPDATE SKIP LOCKED"
    ))
    .bind(now)
    .bind(i64::from(limit))
    .persistent(false)
    .fetch_all(&mut *tx)
    .await?;
    let done = sqlx::query(&format!(
        "DELETE FROM files f WHERE f.id = ANY($1) AND NOT {unread}"
    ))
    .bind(&ids)
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

async fn insert_batch(
    db: &Database,
    batch: NewBatch,
    caps: KeyCaps,
) -> Result<Result<(), CapReached>, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    let (queued, queued_bytes) = (batch.queued(), batch.queued_bytes());
    let checked = check_caps(
        &mut tx,
        &batch.key_id,
        &batch.account_id,
        queued,
        queued_bytes,
        caps,
    )
    .await?;
    if let Err(cap) = checked {
        return Ok(Err(cap));
    }
    if !input_files_kept(&mut tx, &batch).await? {
        return Ok(Err(CapReached::InputFileGone));
    }
    insert_batch_row(&mut tx, &batch).await?;
    for (chunk_no, chunk) in batch.items.chunks(INSERT_CHUNK).enumerate() {
        let columns = ItemColumns::of(chunk_no * INSERT_CHUNK, chunk);
        sqlx::query(
            "INSERT INTO message_batch_items (batch_id, idx, custom_id, params, state, result, ended_at,
                                              line_file_id, line_offset, line_len)
             SELECT $1, t.idx, t.custom_id, t.params,
                    CASE WHEN t.result IS NULL THEN 'queued' ELSE 'errored' END, t.result,
                    CASE WHEN t.result IS NULL THEN NULL ELSE $2 END,
                    t.line_file_id, t.line_offset, t.line_len
             FROM UNNEST($3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[],
                         $9::bigint[])
                  AS t (idx, custom_id, params, result, line_file_id, line_offset, line_len)",
        )
        .bind(&batch.id)
        .bind(batch.created_at)
        .bind(&columns.idx)
        .bind(&columns.custom_ids)
        .bind(&columns.params)
        .bind(&columns.results)
        .bind(&columns.line_files)
        .bind(&columns.line_offsets)
        .bind(&columns.line_lens)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Ok(()))
}

/// Writes items `first..` of a draft to its rows of `message_batch_drafts`.
async fn stage_items(
    db: &Database,
    draft_id: &str,
    first: usize,
    items: &[NewItem],
) -> Result<(), sqlx::Error> {
    for (chunk_no, chunk) in items.chunks(INSERT_CHUNK).enumerate() {
        let columns = ItemColumns::of(first + chunk_no * INSERT_CHUNK, chunk);
        sqlx::query(
            "INSERT INTO message_batch_drafts (draft_id, idx, custom_id, params, result)
             SELECT $1, t.idx, t.custom_id, t.params, t.result
             FROM UNNEST($2::int[], $3::text[], $4::text[], $5::text[])
                  AS t (idx, custom_id, params, result)",
        )
        .bind(draft_id)
        .bind(&columns.idx)
        .bind(&columns.custom_ids)
        .bind(&columns.params)
        .bind(&columns.results)
        .persistent(false)
        .execute(db.pool())
        .await?;
    }
    Ok(())
}

/// Stores a draft's batch: its caps checked, its row written and its staged items moved to
/// `message_batch_items`, in one transaction.
async fn commit_draft(
    db: &Database,
    batch: &NewBatch,
    queued: u64,
    queued_bytes: u64,
    caps: KeyCaps,
) -> Result<Result<(), CapReached>, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    let checked = check_caps(
        &mut tx,
        &batch.key_id,
        &batch.account_id,
        queued,
        queued_bytes,
        caps,
    )
    .await?;
    if let Err(cap) = checked {
        return Ok(Err(cap));
    }
    insert_batch_row(&mut tx, batch).await?;
    sqlx::query(
        "INSERT INTO message_batch_items (batch_id, idx, custom_id, params, state, result, ended_at)
         SELECT $1, d.idx, d.custom_id, d.params,
                CASE WHEN d.result IS NULL THEN 'queued' ELSE 'errored' END, d.result,
                CASE WHEN d.result IS NULL THEN NULL ELSE $2 END
         FROM message_batch_drafts d WHERE d.draft_id = $1",
    )
    .bind(&batch.id)
    .bind(batch.created_at)
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM message_batch_drafts WHERE draft_id = $1")
        .bind(&batch.id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Ok(()))
}

/// A draft of cluster mode: its first items held until a push, then each push written to
/// `message_batch_drafts` under the batch's id; the commit moves them. Dropped uncommitted,
/// it deletes what it wrote (and the sweep, what a dead pod's draft wrote).
struct PostgresDraft<'a> {
    store: &'a PostgresBatchStore,
    /// The batch, with the items not written yet.
    batch: NewBatch,
    /// Items written to the drafts table.
    staged: usize,
    queued: u64,
    queued_bytes: u64,
    committed: bool,
}

impl PostgresDraft<'_> {
    fn count(&mut self, items: &[NewItem]) {
        for item in items.iter().filter(|i| i.refused.is_none()) {
            self.queued += 1;
            self.queued_bytes += item.params.len() as u64;
        }
    }
}

#[async_trait]
impl BatchDraft for PostgresDraft<'_> {
    async fn push(&mut self, mut items: Vec<NewItem>) -> Result<(), StoreError> {
        let mut pending = std::mem::take(&mut self.batch.items);
        pending.append(&mut items);
        self.count(&pending);
        let db = &self.store.db;
        // Counted as written before the write, so that a write that fails midway is deleted
        // too when the draft is dropped.
        let first = self.staged;
        self.staged += pending.len();
        db.bounded(stage_items(db, &self.batch.id, first, &pending))
            .await?;
        Ok(())
    }

    async fn commit(
        mut self: Box<Self>,
        caps: KeyCaps,
    ) -> Result<Result<Batch, CapReached>, StoreError> {
        let store = self.store;
        if self.staged == 0 {
            // Nothing written apart: the whole batch at once, as a create.
            let batch = std::mem::replace(&mut self.batch, empty_batch());
            self.committed = true;
            return store.create(batch, caps).await;
        }
        if !self.batch.items.is_empty() {
            let rest = std::mem::take(&mut self.batch.items);
            self.push(rest).await?;
        }
        let db = &store.db;
        let stored = db
            .bounded(commit_draft(
                db,
                &self.batch,
                self.queued,
                self.queued_bytes,
                caps,
            ))
            .await?;
        if let Err(cap) = stored {
            return Ok(Err(cap));
        }
        self.committed = true;
        let created = store.one(&self.batch.account_id, &self.batch.id).await?;
        Ok(Ok(created.ok_or_else(|| {
            StoreError::Unavailable(format!(
                "batch {} was not found once created",
                self.batch.id
            ))
        })?))
    }
}

impl Drop for PostgresDraft<'_> {
    fn drop(&mut self) {
        if self.committed || self.staged == 0 {
            return;
        }
        // Not awaited by the create that failed: its answer does not wait for the cleanup.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (db, id) = (self.store.db.clone(), self.batch.id.clone());
        runtime.spawn(async move {
            let deleted = db
                .bounded(
                    sqlx::query("DELETE FROM message_batch_drafts WHERE draft_id = $1")
                        .bind(&id)
                        .persistent(false)
                        .execute(db.pool()),
                )
                .await;
            if let Err(e) = deleted {
                tracing::warn!(batch = %id, error = %e, "a refused batch create's draft rows were not deleted; the sweep deletes them within a day");
            }
        });
    }
}

/// A batch with nothing in it, left in a draft whose batch was taken.
fn empty_batch() -> NewBatch {
    NewBatch {
        id: String::new(),
        account_id: String::new(),
        key_id: String::new(),
        key_hash: KeyHash::of(""),
        created_at: OffsetDateTime::UNIX_EPOCH,
        expires_at: OffsetDateTime::UNIX_EPOCH,
        format: RequestFormat::Messages,
        details: None,
        items: Vec::new(),
    }
}

/// The bytes of params the account's open items hold: its batches, their open items by the
/// partial index, and each one's length from its header (`octet_length` reads no TOASTed
/// value); and the expired uploads kept for them, which still count in the quota.
async fn held_bytes(db: impl sqlx::PgExecutor<'_>, account_id: &str) -> Result<u64, sqlx::Error> {
    let read = FILE_READ
        .replace("$1", "f.id")
        .replace("$2", "f.account_id");
    let held: i64 = sqlx::query_scalar(&format!(
        "SELECT (SELECT coalesce(sum(octet_length(i.params)), 0)::bigint
                 FROM message_batches b JOIN message_batch_items i ON i.batch_id = b.id
                 WHERE b.account_id = $1 AND i.state IN ('queued', 'running'))
              + (SELECT coalesce(sum(f.bytes + octet_length(f.filename)), 0)::bigint
                 FROM files f
                 WHERE f.account_id = $1 AND f.batch_id IS NULL AND f.expires_at <= now()
                   AND {read})"
    ))
    .bind(account_id)
    .persistent(false)
    .fetch_one(db)
    .await?;
    Ok(from_db(held))
}

async fn cancel_batch(
    db: &Database,
    account_id: &str,
    id: &str,
    now: OffsetDateTime,
) -> Result<bool, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    let found: Option<Option<OffsetDateTime>> = sqlx::query_scalar(
        "SELECT cancel_initiated_at FROM message_batches
         WHERE id = $1 AND account_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(account_id)
    .persistent(false)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(cancelled) = found else {
        return Ok(false);
    };
    if cancelled.is_none() {
        let queued = sqlx::query(
            "UPDATE message_batch_items SET state = 'canceled', result = $2, ended_at = $3, params = ''
             WHERE batch_id = $1 AND state = 'queued'",
        )
        .bind(id)
        .bind(result_of(ItemState::Canceled))
        .bind(now)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
        let running: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM message_batch_items WHERE batch_id = $1 AND state = 'running')",
        )
        .bind(id)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await?;
        // An ended batch is not cancelled: there is nothing left to stop.
        if queued.rows_affected() > 0 || running {
            sqlx::query("UPDATE message_batches SET cancel_initiated_at = $2 WHERE id = $1")
                .bind(id)
                .bind(now)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(true)
}

async fn delete_batch(db: &Database, account_id: &str, id: &str) -> Result<Deleted, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    let found: Option<String> = sqlx::query_scalar(
        "SELECT id FROM message_batches WHERE id = $1 AND account_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(account_id)
    .persistent(false)
    .fetch_optional(&mut *tx)
    .await?;
    if found.is_none() {
        return Ok(Deleted::NotFound);
    }
    let processing: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM message_batch_items
                        WHERE batch_id = $1 AND state IN ('queued', 'running'))",
    )
    .bind(id)
    .persistent(false)
    .fetch_one(&mut *tx)
    .await?;
    if processing {
        return Ok(Deleted::Processing);
    }
    sqlx::query("DELETE FROM message_batches WHERE id = $1")
        .bind(id)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Deleted::Deleted)
}

#[async_trait]
impl BatchStore for PostgresBatchStore {
    fn draft(&self, batch: NewBatch) -> Box<dyn BatchDraft + '_> {
        Box::new(PostgresDraft {
            store: self,
            batch,
            staged: 0,
            queued: 0,
            queued_bytes: 0,
            committed: false,
        })
    }

    async fn create(
        &self,
        batch: NewBatch,
        caps: KeyCaps,
    ) -> Result<Result<Batch, CapReached>, StoreError> {
        let (account_id, id) = (batch.account_id.clone(), batch.id.clone());
        if let Err(cap) = self.db.bounded(insert_batch(&self.db, batch, caps)).await? {
            return Ok(Err(cap));
        }
        let created = self.one(&account_id, &id).await?;
        Ok(Ok(created.ok_or_else(|| {
            StoreError::Unavailable(format!("batch {id} was not found once created"))
        })?))
    }

    async fn held_bytes(&self, account_id: &str) -> Result<u64, StoreError> {
        Ok(self
            .db
            .bounded(held_bytes(self.db.pool(), account_id))
            .await?)
    }

    async fn delete_file(&self, account_id: &str, file_id: &str) -> Result<Deleted, StoreError> {
        Ok(self
            .db
            .bounded(lock_file_then_check(&self.db, account_id, file_id))
            .await?)
    }

    async fn forget_expired_files(
        &self,
        now: OffsetDateTime,
        limit: u32,
    ) -> Result<u64, StoreError> {
        Ok(self
            .db
            .bounded(forget_expired_files(&self.db, now, limit))
            .await?)
    }

    async fn batch(&self, account_id: &str, id: &str) -> Result<Option<Batch>, StoreError> {
        self.one(account_id, id).await
    }

    async fn list(
        &self,
        account_id: &str,
        formats: &[RequestFormat],
        cursor: Cursor,
        limit: u32,
    ) -> Result<BatchPage, StoreError> {
        let (condition, order, at) = match &cursor {
            Cursor::Newest => ("TRUE", "DESC", None),
            Cursor::After(id) => (
                "(created_at, id) < (SELECT created_at, id FROM message_batches WHERE id = $3)",
                "DESC",
                Some(id),
            ),
            Cursor::Before(id) => (
                "(created_at, id) > (SELECT created_at, id FROM message_batches WHERE id = $3)",
                "ASC",
                Some(id),
            ),
        };
        let rows = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "SELECT {BATCH_COLUMNS} FROM message_batches
                     WHERE account_id = $1 AND format = ANY($4) AND {condition}
                     ORDER BY created_at {order}, id {order} LIMIT $2"
                ))
                .bind(account_id)
                .bind(i64::from(limit) + 1)
                .bind(at)
                .bind(formats.iter().map(name_of).collect::<Vec<_>>())
                .persistent(false)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let has_more = rows.len() > limit as usize;
        let mut batches = self
            .with_counts(rows.into_iter().take(limit as usize).collect())
            .await?;
        if matches!(cursor, Cursor::Before(_)) {
            batches.reverse();
        }
        Ok(BatchPage { batches, has_more })
    }

    async fn cancel(
        &self,
        account_id: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<Batch>, StoreError> {
        if !self
            .db
            .bounded(cancel_batch(&self.db, account_id, id, now))
            .await?
        {
            return Ok(None);
        }
        self.one(account_id, id).await
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<Deleted, StoreError> {
        Ok(self
            .db
            .bounded(delete_batch(&self.db, account_id, id))
            .await?)
    }

    async fn claim(
        &self,
        worker: &str,
        limit: u32,
        now: OffsetDateTime,
        lease_until: OffsetDateTime,
    ) -> Result<Vec<ClaimedItem>, StoreError> {
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "WITH picked AS (
                         SELECT i.batch_id, i.idx FROM message_batch_items i
                         JOIN message_batches b ON b.id = i.batch_id
                         WHERE (i.state = 'queued' OR (i.state = 'running' AND i.lease_until < $2))
                           AND b.expires_at > $2 AND b.cancel_initiated_at IS NULL
                         ORDER BY b.created_at, i.batch_id, i.idx
                         LIMIT $4
                         FOR UPDATE OF i SKIP LOCKED)
                     UPDATE message_batch_items i
                     SET state = 'running', claimed_by = $1, lease_until = $3
                     FROM picked, message_batches b
                     WHERE i.batch_id = picked.batch_id AND i.idx = picked.idx AND b.id = i.batch_id
                     RETURNING i.batch_id, i.idx, i.custom_id, i.params, i.line_file_id, i.line_offset,
                               i.line_len, b.format, b.account_id, b.key_hash",
                )
                .bind(worker)
                .bind(now)
                .bind(lease_until)
                .bind(i64::from(limit))
                .persistent(false)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let claimed = rows
            .iter()
            .map(|row| {
                let hash: Vec<u8> = row.try_get("key_hash")?;
                let line_file: Option<String> = row.try_get("line_file_id")?;
                let offset: Option<i64> = row.try_get("line_offset")?;
                let len: Option<i64> = row.try_get("line_len")?;
                let line = line_file.map(|file_id| InputLine {
                    file_id,
                    offset: from_db(offset.unwrap_or(0)),
                    len: from_db(len.unwrap_or(0)),
                });
                Ok(ClaimedItem {
                    line,
                    batch_id: row.try_get("batch_id")?,
                    index: index_of(row)?,
                    custom_id: row.try_get("custom_id")?,
                    params: row.try_get("params")?,
                    format: format_of(row)?,
                    account_id: row.try_get("account_id")?,
                    key_hash: KeyHash::from_bytes(&hash)
                        .ok_or_else(|| sqlx::Error::Decode("key_hash is not 32 bytes".into()))?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(DbError::Sql)?;
        Ok(claimed)
    }

    async fn finish(
        &self,
        worker: &str,
        batch_id: &str,
        index: u32,
        outcome: Outcome,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let done = self
            .db
            .bounded(
                sqlx::query(
                    "UPDATE message_batch_items
                     SET state = $4, result = $5, message_id = $6, ended_at = $7,
                         claimed_by = NULL, lease_until = NULL, params = ''
                     WHERE batch_id = $1 AND idx = $2 AND state = 'running' AND claimed_by = $3",
                )
                .bind(batch_id)
                .bind(i32::try_from(index).unwrap_or(i32::MAX))
                .bind(worker)
                .bind(name_of(&outcome.state))
                .bind(&outcome.result)
                .bind(&outcome.message_id)
                .bind(now)
                .persistent(false)
                .execute(self.db.pool()),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn put_back(
        &self,
        worker: &str,
        batch_id: &str,
        index: u32,
        until: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        // Running with no holder and a lease that runs out at `until`: claimable from then.
        let done = self
            .db
            .bounded(
                sqlx::query(
                    "UPDATE message_batch_items SET claimed_by = NULL, lease_until = $4
                     WHERE batch_id = $1 AND idx = $2 AND state = 'running' AND claimed_by = $3",
                )
                .bind(batch_id)
                .bind(i32::try_from(index).unwrap_or(i32::MAX))
                .bind(worker)
                .bind(until)
                .persistent(false)
                .execute(self.db.pool()),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn processing(&self, batch_id: &str) -> Result<bool, StoreError> {
        // The open items' partial index answers from its first entry.
        Ok(self
            .db
            .bounded(
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM message_batch_items
                                    WHERE batch_id = $1 AND state IN ('queued', 'running'))",
                )
                .bind(batch_id)
                .persistent(false)
                .fetch_one(self.db.pool()),
            )
            .await?)
    }

    async fn sweep(&self, now: OffsetDateTime) -> Result<u64, StoreError> {
        let mut ended = 0;
        for (state, condition) in [
            (ItemState::Canceled, "b.cancel_initiated_at IS NOT NULL"),
            (ItemState::Expired, "b.expires_at <= $1"),
        ] {
            let done = self
                .db
                .bounded(
                    sqlx::query(&format!(
                        "UPDATE message_batch_items i
                         SET state = $2, result = $3, ended_at = $1, claimed_by = NULL, lease_until = NULL,
                             params = ''
                         FROM message_batches b
                         WHERE b.id = i.batch_id AND {condition}
                           AND (i.state = 'queued' OR (i.state = 'running' AND i.lease_until < $1))"
                    ))
                    .bind(now)
                    .bind(name_of(&state))
                    .bind(result_of(state))
                    .persistent(false)
                    .execute(self.db.pool()),
                )
                .await?;
            ended += done.rows_affected();
        }
        // The rows of drafts whose pod died before their create ended.
        self.db
            .bounded(
                sqlx::query("DELETE FROM message_batch_drafts WHERE staged_at < $1")
                    .bind(now - DRAFTS_KEPT)
                    .persistent(false)
                    .execute(self.db.pool()),
            )
            .await?;
        Ok(ended)
    }

    async fn ended_before(
        &self,
        cutoff: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        // The open items' partial index answers each batch's `NOT EXISTS`.
        Ok(self
            .db
            .bounded(
                sqlx::query_scalar(
                    "SELECT b.id FROM message_batches b
                     WHERE b.created_at < $1 AND NOT EXISTS (
                         SELECT 1 FROM message_batch_items i
                         WHERE i.batch_id = b.id AND i.state IN ('queued', 'running'))
                     ORDER BY b.created_at, b.id LIMIT $2",
                )
                .bind(cutoff)
                .bind(i64::from(limit))
                .persistent(false)
                .fetch_all(self.db.pool()),
            )
            .await?)
    }

    async fn forget(&self, batch_id: &str) -> Result<(), StoreError> {
        // Items in chunks (a batch may hold 100,000), each chunk's rows locked by one pod
        // (`SKIP LOCKED`); the batch's row last, whose cascade then finds at most the chunks
        // other pods are deleting at that moment.
        loop {
            let done = self
                .db
                .bounded(
                    sqlx::query(
                        "DELETE FROM message_batch_items WHERE (batch_id, idx) IN (
                             SELECT batch_id, idx FROM message_batch_items WHERE batch_id = $1
                             LIMIT $2 FOR UPDATE SKIP LOCKED)",
                    )
                    .bind(batch_id)
                    .bind(FORGET_CHUNK)
                    .persistent(false)
                    .execute(self.db.pool()),
                )
                .await?;
            if done.rows_affected() == 0 {
                break;
            }
        }
        self.db
            .bounded(
                sqlx::query("DELETE FROM message_batches WHERE id = $1")
                    .bind(batch_id)
                    .persistent(false)
                    .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    async fn results(
        &self,
        batch_id: &str,
        after: Option<u32>,
        limit: u32,
    ) -> Result<Vec<ItemResult>, StoreError> {
        let after = after.map_or(-1, i64::from);
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT idx, custom_id, state, result FROM message_batch_items
                     WHERE batch_id = $1 AND idx > $2 AND result IS NOT NULL
                     ORDER BY idx LIMIT $3",
                )
                .bind(batch_id)
                .bind(after)
                .bind(i64::from(limit))
                .persistent(false)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let results = rows
            .iter()
            .map(|row| {
                let state: String = row.try_get("state")?;
                Ok(ItemResult {
                    index: index_of(row)?,
                    custom_id: row.try_get("custom_id")?,
                    state: parse_name(&ItemState::ALL, &state).ok_or_else(|| {
                        sqlx::Error::Decode(format!("unknown item state `{state}`").into())
                    })?,
                    result: row.try_get("result")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(DbError::Sql)?;
        Ok(results)
    }
}
