//! Files (`/v1/files`): what an account uploaded, such as the JSONL input of an OpenAI batch,
//! kept whole until it is deleted or expires (an expired upload is gone to every read and to a
//! delete at once, and deleted by the next sweep once no batch in progress reads it:
//! `BatchStore::forget_expired_files` in `store::batches`). A trait so
//! that Postgres (cluster mode, shared by every pod) can take the in-process store's place
//! (standalone); the API is the gateway's `api/files`.

mod memory;
pub(crate) mod postgres;

pub use memory::MemoryFileStore;
pub use postgres::PostgresFileStore;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::accounts::StoreError;

#[derive(Clone, Debug)]
pub struct NewFile {
    pub id: String,
    pub account_id: String,
    pub filename: String,
    pub purpose: String,
    pub content: Vec<u8>,
    pub created_at: OffsetDateTime,
    /// When it is gone by itself; `None`: kept until deleted.
    pub expires_at: Option<OffsetDateTime>,
}

/// A batch's output or error file: only its size is kept here, its content is read from the
/// batch's results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedFile {
    pub id: String,
    pub account_id: String,
    pub batch_id: String,
    pub filename: String,
    pub purpose: String,
    pub bytes: u64,
    pub created_at: OffsetDateTime,
}

/// A file without its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub id: String,
    pub account_id: String,
    pub filename: String,
    pub purpose: String,
    pub bytes: u64,
    pub created_at: OffsetDateTime,
    pub expires_at: Option<OffsetDateTime>,
}

/// A page of an account's files, newest first.
#[derive(Clone, Debug)]
pub struct FilePage {
    pub files: Vec<FileInfo>,
    pub has_more: bool,
}

/// Which end of the account's files a list starts from (OpenAI's `order`: `desc`, the
/// default, or `asc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    #[default]
    NewestFirst,
    OldestFirst,
}

#[async_trait]
pub trait FileStore: Send + Sync {
    /// Stores the file unless the account's files would then hold more than `max_account_bytes`
    /// (`None`), counting each upload's content and name ([`NewFile::kept_bytes`]), checked and
    /// written at once.
    async fn create(
        &self,
        file: NewFile,
        max_account_bytes: u64,
    ) -> Result<Option<FileInfo>, StoreError>;
    /// The bytes the account's unexpired uploads hold of its quota ([`NewFile::kept_bytes`]).
    async fn held_bytes(&self, account_id: &str) -> Result<u64, StoreError>;
    /// The account's file of this id.
    async fn file(&self, account_id: &str, id: &str) -> Result<Option<FileInfo>, StoreError>;
    /// Up to `len` bytes of the account's upload from byte `offset`, as
    /// [`FileStore::content_range`] reads them but also once the upload has expired, as long as
    /// it is kept: a batch item reads its request here, and the sweep keeps a file that a
    /// queued or running item reads (`BatchStore::forget_expired_files` in `store::batches`).
    async fn input_range(
        &self,
        account_id: &str,
        id: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError>;
    /// The account's file's content.
    async fn content(&self, account_id: &str, id: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Up to `len` bytes of the account's upload from byte `offset` (fewer at its end): a
    /// download reads it a range at a time, never whole. `None` once the upload is gone.
    async fn content_range(
        &self,
        account_id: &str,
        id: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError>;
    /// Up to `limit` of the account's files of `purpose` (any when `None`) in `order`, those
    /// after the file `after` in that order when given.
    async fn list(
        &self,
        account_id: &str,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: u32,
        order: Order,
    ) -> Result<FilePage, StoreError>;
    /// `false` when the account has no such file. A generated file stays deleted: it is not
    /// recorded again. An expired upload is no such file (OpenAI's 404, as to every read), and
    /// this leaves it be: the sweep (`BatchStore::forget_expired_files`) alone deletes expired
    /// uploads, so a delete that finds nothing changes nothing and the sweep's count is every
    /// expired upload. Deleting it here would free nothing a client could see either: its
    /// bytes already left the quota when it expired (or count as its batches' while they read
    /// it). The API deletes through
    /// `BatchStore::delete_file` (`store::batches`), which also keeps an input file that a
    /// batch in progress reads.
    async fn delete(&self, account_id: &str, id: &str) -> Result<bool, StoreError>;
    /// Records a batch's generated file, listed and deleted as an upload is and counted in no
    /// quota, unless it was recorded before: the file as it now stands, `None` once deleted.
    async fn record_generated(&self, file: GeneratedFile) -> Result<Option<FileInfo>, StoreError>;
    /// Forgets the generated files of these ids, deleted or not (their batch is past its
    /// retention): they are then neither listed nor marked deleted. Uploads are left alone.
    async fn forget_generated(&self, ids: &[String]) -> Result<(), StoreError>;
}

impl GeneratedFile {
    fn info(&self) -> FileInfo {
        FileInfo {
            id: self.id.clone(),
            account_id: self.account_id.clone(),
            filename: self.filename.clone(),
            purpose: self.purpose.clone(),
            bytes: self.bytes,
            created_at: self.created_at,
            expires_at: None,
        }
    }
}

impl NewFile {
    fn info(&self) -> FileInfo {
        FileInfo {
            id: self.id.clone(),
            account_id: self.account_id.clone(),
            filename: self.filename.clone(),
            purpose: self.purpose.clone(),
            bytes: self.content.len() as u64,
            created_at: self.created_at,
            expires_at: self.expires_at,
        }
    }

    /// What it takes of its account's quota: its content and its name (a name is kept as
    /// content is, so a long one must not be free).
    pub fn kept_bytes(&self) -> u64 {
        (self.content.len() + self.filename.len()) as u64
    }

    /// Whether it has expired at `now`.
    fn expired(&self, now: OffsetDateTime) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}
