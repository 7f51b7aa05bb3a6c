//! The in-process file store of standalone mode.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{FileInfo, FilePage, FileStore, GeneratedFile, NewFile, Order};
use crate::accounts::StoreError;

/// An upload with its content, or a batch's generated file (`deleted` once it was).
enum Stored {
    Upload(NewFile),
    Generated { file: GeneratedFile, deleted: bool },
}

impl Stored {
    fn account_id(&self) -> &str {
        match self {
            Self::Upload(f) => &f.account_id,
            Self::Generated { file, .. } => &file.account_id,
        }
    }

    /// Its file object, unless it was deleted or has expired.
    fn live(&self) -> Option<FileInfo> {
        match self {
            Self::Upload(f) if f.expired(OffsetDateTime::now_utc()) => None,
            Self::Upload(f) => Some(f.info()),
            Self::Generated { deleted: true, .. } => None,
            Self::Generated { file, .. } => Some(file.info()),
        }
    }
}

#[derive(Default)]
pub struct MemoryFileStore {
    files: Mutex<HashMap<String, Stored>>,
}

impl MemoryFileStore {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Stored>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Up to `len` bytes of the account's upload from `offset`; of an expired one too when
    /// `expired_too` (a batch's input, kept while the batch reads it).
    fn range(
        &self,
        account_id: &str,
        id: &str,
        offset: u64,
        len: u32,
        expired_too: bool,
    ) -> Option<Vec<u8>> {
        match self.lock().get(id) {
            Some(Stored::Upload(f))
                if f.account_id == account_id
                    && (expired_too || !f.expired(OffsetDateTime::now_utc())) =>
            {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(f.content.len());
                let end = start.saturating_add(len as usize).min(f.content.len());
                Some(f.content[start..end].to_vec())
            }
            _ => None,
        }
    }

    /// Whether the account has this upload, unexpired: what a new batch's items may read.
    pub(crate) fn upload_live(&self, account_id: &str, id: &str) -> bool {
        matches!(
            self.lock().get(id),
            Some(Stored::Upload(f))
                if f.account_id == account_id && !f.expired(OffsetDateTime::now_utc())
        )
    }

    /// [`FileStore::delete`], at once: the batch store calls it under its own lock.
    pub(crate) fn delete_now(&self, account_id: &str, id: &str) -> bool {
        let mut files = self.lock();
        match files.get_mut(id) {
            // An expired upload is not found, as to the reads, and left to the sweep: see the
            // trait's `delete`.
            Some(Stored::Upload(f))
                if f.account_id == account_id && !f.expired(OffsetDateTime::now_utc()) =>
            {
                files.remove(id);
                true
            }
            Some(Stored::Generated { file, deleted }) if file.account_id == account_id => {
                !std::mem::replace(deleted, true)
            }
            _ => false,
        }
    }

    /// What the account's expired uploads among `read` hold ([`NewFile::kept_bytes`]): kept
    /// for the batches reading them, they still count in its quota.
    pub(crate) fn expired_bytes_among(&self, account_id: &str, read: &HashSet<&str>) -> u64 {
        let now = OffsetDateTime::now_utc();
        self.lock()
            .iter()
            .filter(|(id, _)| read.contains(id.as_str()))
            .filter_map(|(_, f)| match f {
                Stored::Upload(f) if f.account_id == account_id && f.expired(now) => {
                    Some(f.kept_bytes())
                }
                _ => None,
            })
            .sum()
    }

    /// Deletes up to `limit` uploads expired at `now` but those of `read` (their batch keeps
    /// them), oldest expiry first; how many.
    pub(crate) fn forget_expired_except(
        &self,
        now: OffsetDateTime,
        limit: u32,
        read: &HashSet<&str>,
    ) -> u64 {
        let mut files = self.lock();
        let mut expired: Vec<(OffsetDateTime, String)> = files
            .iter()
            .filter(|(id, _)| !read.contains(id.as_str()))
            .filter_map(|(id, f)| match f {
                Stored::Upload(f) if f.expired(now) => Some((f.expires_at?, id.clone())),
                _ => None,
            })
            .collect();
        expired.sort();
        expired.truncate(limit as usize);
        for (_, id) in &expired {
            files.remove(id);
        }
        expired.len() as u64
    }
}

#[async_trait]
impl FileStore for MemoryFileStore {
    async fn create(
        &self,
        file: NewFile,
        max_account_bytes: u64,
    ) -> Result<Option<FileInfo>, StoreError> {
        let info = file.info();
        let mut files = self.lock();
        let held = held_by(&files, &file.account_id);
        if held + file.kept_bytes() > max_account_bytes {
            return Ok(None);
        }
        files.insert(file.id.clone(), Stored::Upload(file));
        Ok(Some(info))
    }

    async fn held_bytes(&self, account_id: &str) -> Result<u64, StoreError> {
        Ok(held_by(&self.lock(), account_id))
    }

    async fn file(&self, account_id: &str, id: &str) -> Result<Option<FileInfo>, StoreError> {
        Ok(self
            .lock()
            .get(id)
            .filter(|f| f.account_id() == account_id)
            .and_then(Stored::live))
    }

    async fn content_range(
        &self,
        account_id: &str,
        id: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.range(account_id, id, offset, len, false))
    }

    async fn input_range(
        &self,
        account_id: &str,
        id: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.range(account_id, id, offset, len, true))
    }

    async fn content(&self, account_id: &str, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(match self.lock().get(id) {
            Some(Stored::Upload(f))
                if f.account_id == account_id && !f.expired(OffsetDateTime::now_utc()) =>
            {
                Some(f.content.clone())
            }
            _ => None,
        })
    }

    async fn list(
        &self,
        account_id: &str,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: u32,
        order: Order,
    ) -> Result<FilePage, StoreError> {
        let files = self.lock();
        let mut mine: Vec<FileInfo> = files
            .values()
            .filter(|f| f.account_id() == account_id)
            .filter_map(Stored::live)
            .filter(|f| purpose.is_none_or(|p| f.purpose == p))
            .collect();
        drop(files);
        mine.sort_by(|a, b| match order {
            Order::NewestFirst => (b.created_at, &b.id).cmp(&(a.created_at, &a.id)),
            Order::OldestFirst => (a.created_at, &a.id).cmp(&(b.created_at, &b.id)),
        });
        let from = match after {
            Some(after) => mine
                .iter()
                .position(|f| f.id == after)
                .map_or(mine.len(), |p| p + 1),
            None => 0,
        };
        let rest = &mine[from..];
        let limit = limit as usize;
        Ok(FilePage {
            files: rest.iter().take(limit).cloned().collect(),
            has_more: rest.len() > limit,
        })
    }

    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, StoreError> {
        Ok(self.delete_now(account_id, id))
    }

    async fn record_generated(&self, file: GeneratedFile) -> Result<Option<FileInfo>, StoreError> {
        let mut files = self.lock();
        let stored = files
            .entry(file.id.clone())
            .or_insert_with(|| Stored::Generated {
                file,
                deleted: false,
            });
        Ok(stored.live())
    }

    async fn forget_generated(&self, ids: &[String]) -> Result<(), StoreError> {
        let mut files = self.lock();
        for id in ids {
            if matches!(files.get(id), Some(Stored::Generated { .. })) {
                files.remove(id);
            }
        }
        Ok(())
    }
}

/// What the account's unexpired uploads hold of its quota.
fn held_by(files: &HashMap<String, Stored>, account_id: &str) -> u64 {
    let now = OffsetDateTime::now_utc();
    files
        .values()
        .filter_map(|f| match f {
            Stored::Upload(f) if f.account_id == account_id && !f.expired(now) => {
                Some(f.kept_bytes())
            }
            _ => None,
        })
        .sum()
}
