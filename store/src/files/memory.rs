//! The in-process file store of standalone mode.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use super::{FileInfo, FilePage, FileStore, NewFile, Order};
use crate::accounts::StoreError;

#[derive(Default)]
pub struct MemoryFileStore {
    files: Mutex<HashMap<String, NewFile>>,
}

impl MemoryFileStore {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, NewFile>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
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
        let held: u64 = files
            .values()
            .filter(|f| f.account_id == file.account_id)
            .map(|f| f.content.len() as u64)
            .sum();
        if held + info.bytes > max_account_bytes {
            return Ok(None);
        }
        files.insert(file.id.clone(), file);
        Ok(Some(info))
    }

    async fn file(&self, account_id: &str, id: &str) -> Result<Option<FileInfo>, StoreError> {
        Ok(self
            .lock()
            .get(id)
            .filter(|f| f.account_id == account_id)
            .map(NewFile::info))
    }

    async fn content(&self, account_id: &str, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .lock()
            .get(id)
            .filter(|f| f.account_id == account_id)
            .map(|f| f.content.clone()))
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
            .filter(|f| f.account_id == account_id)
            .filter(|f| purpose.is_none_or(|p| f.purpose == p))
            .map(NewFile::info)
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
        let mut files = self.lock();
        if files.get(id).is_some_and(|f| f.account_id == account_id) {
            files.remove(id);
            return Ok(true);
        }
        Ok(false)
    }
}
