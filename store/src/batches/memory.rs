//! The in-process batch store of standalone mode: one lock over every batch, held only for
//! map updates. Built on the file store of its batches' input files
//! ([`MemoryBatchStore::reading`]): a create, a file delete and the expired files' sweep each
//! decide under this lock (then the file store's), so no item reads a file deleted meanwhile.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{
    Batch, BatchDraft, BatchPage, BatchStore, CapReached, ClaimedItem, Cursor, Deleted, InputLine,
    ItemResult, ItemState, KeyCaps, NewBatch, NewItem, Outcome, RequestCounts, RequestFormat,
};
use crate::accounts::{KeyHash, StoreError};
use crate::files::MemoryFileStore;

/// `Default`: with a file store of its own (for batches that read no input file).
#[derive(Default)]
pub struct MemoryBatchStore {
    batches: Mutex<BTreeMap<String, Stored>>,
    files: Arc<MemoryFileStore>,
}

struct Stored {
    account_id: String,
    key_id: String,
    key_hash: KeyHash,
    created_at: OffsetDateTime,
    expires_at: OffsetDateTime,
    cancel_initiated_at: Option<OffsetDateTime>,
    format: RequestFormat,
    details: Option<String>,
    items: Vec<Item>,
}

struct Item {
    custom_id: String,
    params: String,
    line: Option<InputLine>,
    state: ItemState,
    claimed_by: Option<String>,
    lease_until: Option<OffsetDateTime>,
    result: Option<String>,
    ended_at: Option<OffsetDateTime>,
}

impl Item {
    /// Queued, or running for a worker whose lease ran out.
    fn free(&self, now: OffsetDateTime) -> bool {
        match self.state {
            ItemState::Queued => true,
            ItemState::Running => self.lease_until.is_some_and(|at| at < now),
            _ => false,
        }
    }

    /// Ends the item: its params are dropped, only its result is kept (see
    /// [`super::BatchStore`]).
    fn end(&mut self, state: ItemState, result: String, now: OffsetDateTime) {
        self.params = String::new();
        self.state = state;
        self.result = Some(result);
        self.ended_at = Some(now);
        self.claimed_by = None;
        self.lease_until = None;
    }
}

impl Stored {
    fn view(&self, id: &str) -> Batch {
        let mut counts = RequestCounts::default();
        for item in &self.items {
            counts.add(item.state, 1);
        }
        let ended_at = (counts.processing == 0)
            .then(|| self.items.iter().filter_map(|i| i.ended_at).max())
            .flatten()
            .or((counts.processing == 0).then_some(self.created_at));
        Batch {
            id: id.to_owned(),
            account_id: self.account_id.clone(),
            key_id: self.key_id.clone(),
            counts,
            created_at: self.created_at,
            expires_at: self.expires_at,
            cancel_initiated_at: self.cancel_initiated_at,
            ended_at,
            format: self.format,
            details: self.details.clone(),
        }
    }

    fn processing(&self) -> bool {
        self.items.iter().any(|i| !i.state.ended())
    }
}

/// The bytes of params the account's open items hold.
fn params_held_by(batches: &BTreeMap<String, Stored>, account_id: &str) -> u64 {
    batches
        .values()
        .filter(|b| b.account_id == account_id)
        .flat_map(|b| b.items.iter())
        .map(|i| i.params.len() as u64)
        .sum()
}

/// The input files open items read.
fn files_read(batches: &BTreeMap<String, Stored>) -> HashSet<&str> {
    batches
        .values()
        .flat_map(|b| b.items.iter())
        .filter(|i| !i.state.ended())
        .filter_map(|i| i.line.as_ref().map(|l| l.file_id.as_str()))
        .collect()
}

impl MemoryBatchStore {
    /// A store whose batches read their input files from `files` (the API's file store).
    pub fn reading(files: Arc<MemoryFileStore>) -> Self {
        Self {
            batches: Mutex::default(),
            files,
        }
    }

    /// What the account's batches hold of its quota: their open items' params, and the
    /// expired input files kept for them.
    fn held_by(&self, batches: &BTreeMap<String, Stored>, account_id: &str) -> u64 {
        params_held_by(batches, account_id)
            + self
                .files
                .expired_bytes_among(account_id, &files_read(batches))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Stored>> {
        self.batches.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A draft of standalone mode: its items held apart until its commit puts them in the map.
struct MemoryDraft<'a> {
    store: &'a MemoryBatchStore,
    batch: NewBatch,
}

#[async_trait]
impl BatchDraft for MemoryDraft<'_> {
    async fn push(&mut self, items: Vec<NewItem>) -> Result<(), StoreError> {
        self.batch.items.extend(items);
        Ok(())
    }

    async fn commit(
        self: Box<Self>,
        caps: KeyCaps,
    ) -> Result<Result<Batch, CapReached>, StoreError> {
        self.store.create(self.batch, caps).await
    }
}

#[async_trait]
impl BatchStore for MemoryBatchStore {
    fn draft(&self, batch: NewBatch) -> Box<dyn BatchDraft + '_> {
        Box::new(MemoryDraft { store: self, batch })
    }

    async fn create(
        &self,
        batch: NewBatch,
        caps: KeyCaps,
    ) -> Result<Result<Batch, CapReached>, StoreError> {
        let mut batches = self.lock();
        let mine = || batches.values().filter(|b| b.key_id == batch.key_id);
        let in_progress = mine().filter(|b| b.processing()).count();
        if in_progress >= caps.max_in_progress as usize {
            return Ok(Err(CapReached::InProgress));
        }
        let open: usize = mine()
            .map(|b| b.items.iter().filter(|i| !i.state.ended()).count())
            .sum();
        if open as u64 + batch.queued() > caps.max_queued_items {
            return Ok(Err(CapReached::QueuedItems));
        }
        if self.held_by(&batches, &batch.account_id) + batch.queued_bytes() > caps.max_account_bytes
        {
            return Ok(Err(CapReached::AccountBytes));
        }
        // Under this lock, as a file delete decides: the file is either gone now or kept
        // until these items end.
        let gone = batch
            .items
            .iter()
            .filter_map(|i| i.line.as_ref())
            .any(|l| !self.files.upload_live(&batch.account_id, &l.file_id));
        if gone {
            return Ok(Err(CapReached::InputFileGone));
        }
        let items = batch
            .items
            .into_iter()
            .map(|item| Item {
                custom_id: item.custom_id,
                // A refused item never runs: its params are not kept.
                params: if item.refused.is_some() {
                    String::new()
                } else {
                    item.params
                },
                state: if item.refused.is_some() {
                    ItemState::Errored
                } else {
                    ItemState::Queued
                },
                line: item.line,
                claimed_by: None,
                lease_until: None,
                ended_at: item.refused.is_some().then_some(batch.created_at),
                result: item.refused,
            })
            .collect();
        let stored = Stored {
            account_id: batch.account_id,
            key_id: batch.key_id,
            key_hash: batch.key_hash,
            created_at: batch.created_at,
            expires_at: batch.expires_at,
            cancel_initiated_at: None,
            format: batch.format,
            details: batch.details,
            items,
        };
        let view = stored.view(&batch.id);
        batches.insert(batch.id, stored);
        Ok(Ok(view))
    }

    async fn batch(&self, account_id: &str, id: &str) -> Result<Option<Batch>, StoreError> {
        Ok(self
            .lock()
            .get(id)
            .filter(|b| b.account_id == account_id)
            .map(|b| b.view(id)))
    }

    async fn list(
        &self,
        account_id: &str,
        formats: &[RequestFormat],
        cursor: Cursor,
        limit: u32,
    ) -> Result<BatchPage, StoreError> {
        let batches = self.lock();
        let mut mine: Vec<Batch> = batches
            .iter()
            .filter(|(_, b)| b.account_id == account_id && formats.contains(&b.format))
            .map(|(id, b)| b.view(id))
            .collect();
        // Newest first.
        mine.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        let position = |id: &str| mine.iter().position(|b| b.id == id);
        let limit = limit as usize;
        let (batches, has_more) = match cursor {
            Cursor::Newest => (
                mine.iter().take(limit).cloned().collect(),
                mine.len() > limit,
            ),
            Cursor::After(id) => {
                let from = position(&id).map_or(mine.len(), |p| p + 1);
                let rest = &mine[from..];
                (
                    rest.iter().take(limit).cloned().collect(),
                    rest.len() > limit,
                )
            }
            Cursor::Before(id) => {
                let to = position(&id).unwrap_or(0);
                let rest = &mine[..to];
                let start = rest.len().saturating_sub(limit);
                (rest[start..].to_vec(), start > 0)
            }
        };
        Ok(BatchPage { batches, has_more })
    }

    async fn held_bytes(&self, account_id: &str) -> Result<u64, StoreError> {
        Ok(self.held_by(&self.lock(), account_id))
    }

    async fn delete_file(&self, account_id: &str, file_id: &str) -> Result<Deleted, StoreError> {
        let batches = self.lock();
        let read = batches
            .values()
            .filter(|b| b.account_id == account_id)
            .flat_map(|b| b.items.iter())
            .any(|i| !i.state.ended() && i.line.as_ref().is_some_and(|l| l.file_id == file_id));
        if read {
            return Ok(Deleted::Processing);
        }
        // Still under the batches' lock: no create takes the file meanwhile.
        Ok(match self.files.delete_now(account_id, file_id) {
            true => Deleted::Deleted,
            false => Deleted::NotFound,
        })
    }

    async fn forget_expired_files(
        &self,
        now: OffsetDateTime,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let batches = self.lock();
        Ok(self
            .files
            .forget_expired_except(now, limit, &files_read(&batches)))
    }

    async fn cancel(
        &self,
        account_id: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<Batch>, StoreError> {
        let mut batches = self.lock();
        let Some(batch) = batches.get_mut(id).filter(|b| b.account_id == account_id) else {
            return Ok(None);
        };
        if batch.processing() && batch.cancel_initiated_at.is_none() {
            batch.cancel_initiated_at = Some(now);
            for item in batch.items.iter_mut() {
                if item.state == ItemState::Queued {
                    item.end(
                        ItemState::Canceled,
                        super::result_of(ItemState::Canceled),
                        now,
                    );
                }
            }
        }
        Ok(Some(batch.view(id)))
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<Deleted, StoreError> {
        let mut batches = self.lock();
        match batches.get(id).filter(|b| b.account_id == account_id) {
            None => Ok(Deleted::NotFound),
            Some(b) if b.processing() => Ok(Deleted::Processing),
            Some(_) => {
                batches.remove(id);
                Ok(Deleted::Deleted)
            }
        }
    }

    async fn claim(
        &self,
        worker: &str,
        limit: u32,
        now: OffsetDateTime,
        lease_until: OffsetDateTime,
    ) -> Result<Vec<ClaimedItem>, StoreError> {
        let mut batches = self.lock();
        let mut claimed = Vec::new();
        let open = batches
            .iter_mut()
            .filter(|(_, b)| b.expires_at > now && b.cancel_initiated_at.is_none());
        for (id, batch) in open {
            for (index, item) in batch.items.iter_mut().enumerate() {
                if claimed.len() >= limit as usize {
                    return Ok(claimed);
                }
                if !item.free(now) {
                    continue;
                }
                item.state = ItemState::Running;
                item.claimed_by = Some(worker.to_owned());
                item.lease_until = Some(lease_until);
                claimed.push(ClaimedItem {
                    batch_id: id.clone(),
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    custom_id: item.custom_id.clone(),
                    params: item.params.clone(),
                    line: item.line.clone(),
                    format: batch.format,
                    account_id: batch.account_id.clone(),
                    key_hash: batch.key_hash,
                });
            }
        }
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
        let mut batches = self.lock();
        let Some(item) = held(&mut batches, worker, batch_id, index) else {
            return Ok(false);
        };
        item.end(outcome.state, outcome.result, now);
        Ok(true)
    }

    async fn put_back(
        &self,
        worker: &str,
        batch_id: &str,
        index: u32,
        until: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let mut batches = self.lock();
        let Some(item) = held(&mut batches, worker, batch_id, index) else {
            return Ok(false);
        };
        // Running with no holder and a lease that runs out at `until`: claimable from then.
        item.claimed_by = None;
        item.lease_until = Some(until);
        Ok(true)
    }

    async fn processing(&self, batch_id: &str) -> Result<bool, StoreError> {
        Ok(self
            .lock()
            .get(batch_id)
            .is_some_and(|b| b.items.iter().any(|i| !i.state.ended())))
    }

    async fn sweep(&self, now: OffsetDateTime) -> Result<u64, StoreError> {
        let mut batches = self.lock();
        let mut ended = 0;
        for batch in batches.values_mut() {
            let state = if batch.cancel_initiated_at.is_some() {
                ItemState::Canceled
            } else if batch.expires_at <= now {
                ItemState::Expired
            } else {
                continue;
            };
            for item in batch.items.iter_mut().filter(|i| i.free(now)) {
                item.end(state, super::result_of(state), now);
                ended += 1;
            }
        }
        Ok(ended)
    }

    async fn ended_before(
        &self,
        cutoff: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        let batches = self.lock();
        let mut past: Vec<(OffsetDateTime, &String)> = batches
            .iter()
            .filter(|(_, b)| b.created_at < cutoff && !b.processing())
            .map(|(id, b)| (b.created_at, id))
            .collect();
        past.sort();
        Ok(past
            .into_iter()
            .take(limit as usize)
            .map(|(_, id)| id.clone())
            .collect())
    }

    async fn forget(&self, batch_id: &str) -> Result<(), StoreError> {
        self.lock().remove(batch_id);
        Ok(())
    }

    async fn results(
        &self,
        batch_id: &str,
        after: Option<u32>,
        limit: u32,
    ) -> Result<Vec<ItemResult>, StoreError> {
        let batches = self.lock();
        let Some(batch) = batches.get(batch_id) else {
            return Ok(Vec::new());
        };
        let from = after.map_or(0, |a| a as usize + 1);
        Ok(batch
            .items
            .iter()
            .enumerate()
            .skip(from)
            .filter_map(|(index, item)| {
                Some(ItemResult {
                    index: u32::try_from(index).ok()?,
                    custom_id: item.custom_id.clone(),
                    state: item.state,
                    result: item.result.clone()?,
                })
            })
            .take(limit as usize)
            .collect())
    }
}

/// Item `index` of the batch, if `worker` holds it (running, claimed by it).
fn held<'a>(
    batches: &'a mut BTreeMap<String, Stored>,
    worker: &str,
    batch_id: &str,
    index: u32,
) -> Option<&'a mut Item> {
    batches
        .get_mut(batch_id)
        .and_then(|b| b.items.get_mut(index as usize))
        .filter(|i| i.state == ItemState::Running && i.claimed_by.as_deref() == Some(worker))
}
