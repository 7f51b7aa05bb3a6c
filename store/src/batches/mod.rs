//! Message Batches: a batch of Messages API requests run in the background by every gateway
//! process, each request (an item) claimed by one worker under a lease and its result written
//! once. A trait so that Postgres (cluster mode, shared by every pod) can take the in-process
//! store's place (standalone); the API is the gateway's `api/message_batches`.

mod memory;
mod postgres;

pub use memory::MemoryBatchStore;
pub use postgres::PostgresBatchStore;

use async_trait::async_trait;
use serde::Serialize;
use time::OffsetDateTime;

use crate::accounts::{KeyHash, StoreError};

/// Where an item is: waiting, claimed by a worker, or ended with one of the four results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    Queued,
    Running,
    Succeeded,
    Errored,
    Canceled,
    Expired,
}

impl ItemState {
    pub const ALL: [Self; 6] = [
        Self::Queued,
        Self::Running,
        Self::Succeeded,
        Self::Errored,
        Self::Canceled,
        Self::Expired,
    ];

    pub fn ended(self) -> bool {
        !matches!(self, Self::Queued | Self::Running)
    }
}

/// A request of a new batch: queued, or (a request that failed validation) ended already with
/// its `errored` result.
#[derive(Clone, Debug)]
pub struct NewItem {
    pub custom_id: String,
    /// The request's params, as JSON text: kept only while the item is queued or running
    /// (not at all for a refused one). An ended item keeps its result alone, so what a batch
    /// holds for its retention is what its turns were billed for, not what was sent.
    pub params: String,
    /// The result JSON (`{"type":"errored",...}`) of a request refused before it was queued.
    pub refused: Option<String>,
    /// Where its request is in its batch's input file, when it is read from there when it
    /// runs (`params` is then empty): not copied into each batch made from the file.
    pub line: Option<InputLine>,
}

/// Where an item's request is in its batch's input file (`/v1/batches`): the line whose `body`
/// the item runs, read from the file store when the item runs. One file feeds any number of
/// batches and counts once in its account's quota. A file with open items referring to it is
/// neither deleted ([`BatchStore::delete_file`]) nor swept when it expires
/// ([`BatchStore::forget_expired_files`]): the batch keeps its input until it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputLine {
    pub file_id: String,
    pub offset: u64,
    pub len: u64,
}

/// Whose requests a batch's items are: the worker runs each as that API's turn, and each API
/// lists only its own batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestFormat {
    /// `/v1/messages/batches`: Messages API params.
    Messages,
    /// `/v1/batches` of endpoint `/v1/chat/completions`: Chat Completions bodies.
    ChatCompletions,
    /// `/v1/batches` of endpoint `/v1/responses`: Responses API bodies.
    Responses,
}

impl RequestFormat {
    pub const ALL: [Self; 3] = [Self::Messages, Self::ChatCompletions, Self::Responses];
    /// The formats of OpenAI's `/v1/batches`, which lists them together.
    pub const OPENAI: [Self; 2] = [Self::ChatCompletions, Self::Responses];
}

#[derive(Clone, Debug)]
pub struct NewBatch {
    pub id: String,
    pub account_id: String,
    pub key_id: String,
    /// The hash of the key that created it: its items run as that key, checked again then.
    pub key_hash: KeyHash,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
    pub format: RequestFormat,
    /// What the batch's API echoes back of its create, as JSON text (OpenAI's input file,
    /// endpoint, metadata, and the errors of an input that failed validation).
    pub details: Option<String>,
    pub items: Vec<NewItem>,
}

/// Items by where they are; `processing` counts the queued and the running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    pub processing: u64,
    pub succeeded: u64,
    pub errored: u64,
    pub canceled: u64,
    pub expired: u64,
}

impl RequestCounts {
    fn add(&mut self, state: ItemState, n: u64) {
        match state {
            ItemState::Queued | ItemState::Running => self.processing += n,
            ItemState::Succeeded => self.succeeded += n,
            ItemState::Errored => self.errored += n,
            ItemState::Canceled => self.canceled += n,
            ItemState::Expired => self.expired += n,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessingStatus {
    InProgress,
    Canceling,
    Ended,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub id: String,
    pub account_id: String,
    pub key_id: String,
    pub counts: RequestCounts,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
    pub cancel_initiated_at: Option<OffsetDateTime>,
    /// When its last item ended; `None` while any is processing.
    pub ended_at: Option<OffsetDateTime>,
    pub format: RequestFormat,
    pub details: Option<String>,
}

impl Batch {
    pub fn status(&self) -> ProcessingStatus {
        match (self.counts.processing, self.cancel_initiated_at) {
            (0, _) => ProcessingStatus::Ended,
            (_, Some(_)) => ProcessingStatus::Canceling,
            (_, None) => ProcessingStatus::InProgress,
        }
    }
}

/// An item a worker claimed: it runs it, then writes its result with [`BatchStore::finish`].
#[derive(Clone, Debug)]
pub struct ClaimedItem {
    pub batch_id: String,
    pub index: u32,
    pub custom_id: String,
    /// Its request; empty when it is read from its input file's `line`.
    pub params: String,
    pub line: Option<InputLine>,
    pub format: RequestFormat,
    pub account_id: String,
    pub key_hash: KeyHash,
}

/// An item's ended result, for the results file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemResult {
    pub index: u32,
    pub custom_id: String,
    pub state: ItemState,
    /// `{"type":"succeeded","message":...}` and the like, as JSON text.
    pub result: String,
}

/// How an item ended: its state and result JSON, and the ledger row of its turn, if any.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub state: ItemState,
    pub result: String,
    pub message_id: Option<String>,
}

/// A page of an account's batches, newest first.
#[derive(Clone, Debug)]
pub struct BatchPage {
    pub batches: Vec<Batch>,
    pub has_more: bool,
}

/// Where a page starts: the batches just older (`After`) or just newer (`Before`) than one.
#[derive(Clone, Debug)]
pub enum Cursor {
    Newest,
    After(String),
    Before(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    /// A batch: its items are not all ended, and only an ended batch may be deleted. A file:
    /// a queued or running item reads its request from it.
    Processing,
    NotFound,
}

/// A key's caps on its batches, checked when it creates one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyCaps {
    /// Batches with items processing at once.
    pub max_in_progress: u32,
    /// Items queued or running over all its batches, the new batch's queued ones included.
    pub max_queued_items: u64,
    /// Bytes of queued or running requests' params the key's account may hold over all its
    /// batches, the new batch's included: what is left of its storage quota once its files
    /// are counted ([`BatchStore::held_bytes`]). Ended items hold none (their params are gone).
    pub max_account_bytes: u64,
}

/// Which of the key's caps a new batch would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapReached {
    InProgress,
    QueuedItems,
    /// The account's storage quota.
    AccountBytes,
    /// Not a cap: an input file its items read ([`InputLine`]) is no longer there (deleted, or
    /// expired, while the batch was being created). Nothing of the batch is stored.
    InputFileGone,
}

impl NewBatch {
    /// Its items that are queued (not refused at the create).
    pub fn queued(&self) -> u64 {
        self.items.iter().filter(|i| i.refused.is_none()).count() as u64
    }

    /// The bytes of its queued items' params: what it holds of its account's quota.
    pub fn queued_bytes(&self) -> u64 {
        self.items
            .iter()
            .filter(|i| i.refused.is_none())
            .map(|i| i.params.len() as u64)
            .sum()
    }
}

/// A batch written as its requests are read ([`BatchStore::draft`]): its items are kept
/// apart as they come, seen by no read, claim or quota, until [`BatchDraft::commit`] stores
/// them all at once; a draft dropped uncommitted (a create refused on its 5,000th request, or
/// cut by its client) leaves nothing behind. So a Message Batch create never holds its whole
/// body, and stays all-or-nothing.
#[async_trait]
pub trait BatchDraft: Send {
    /// Writes the next items, in request order.
    async fn push(&mut self, items: Vec<NewItem>) -> Result<(), StoreError>;
    /// Stores the batch with every item pushed, as [`BatchStore::create`] stores one: unless
    /// that would pass one of the key's caps (then nothing of it stays).
    async fn commit(
        self: Box<Self>,
        caps: KeyCaps,
    ) -> Result<Result<Batch, CapReached>, StoreError>;
}

#[async_trait]
pub trait BatchStore: Send + Sync {
    /// Stores a new batch and its items unless that would pass one of the key's caps (which
    /// one it would pass), or an input file its items read is gone (an unexpired upload of
    /// the account is needed), checked and written at once.
    async fn create(
        &self,
        batch: NewBatch,
        caps: KeyCaps,
    ) -> Result<Result<Batch, CapReached>, StoreError>;
    /// A draft of `batch` (its `items` are the first ones, usually none), to which the rest
    /// are pushed as they are read.
    fn draft(&self, batch: NewBatch) -> Box<dyn BatchDraft + '_>;
    /// The bytes of params the account's queued and running items hold, over all its
    /// batches (what counts in its storage quota).
    async fn held_bytes(&self, account_id: &str) -> Result<u64, StoreError>;
    /// Deletes the account's file as [`crate::files::FileStore::delete`] does, unless a queued
    /// or running item of its batches reads its request from it ([`InputLine`]): then
    /// `Processing` and nothing changes. One decision with every [`BatchStore::create`]: a
    /// create that would read the file after it is deleted stores nothing
    /// ([`CapReached::InputFileGone`]), so no item ever reads a deleted file.
    async fn delete_file(&self, account_id: &str, file_id: &str) -> Result<Deleted, StoreError>;
    /// Deletes up to `limit` uploads that expired at or before `now` and that no queued or
    /// running item reads, oldest expiry first; how many. An expired upload is gone to every
    /// read of its account at once, but a batch in progress reading it keeps it (and reads it,
    /// [`crate::files::FileStore::input_range`]) until the batch's last item reading it ends.
    /// Idempotent: pods sweeping at once never conflict.
    async fn forget_expired_files(
        &self,
        now: OffsetDateTime,
        limit: u32,
    ) -> Result<u64, StoreError>;
    /// The account's batch of this id.
    async fn batch(&self, account_id: &str, id: &str) -> Result<Option<Batch>, StoreError>;
    /// The account's batches of any of `formats`.
    async fn list(
        &self,
        account_id: &str,
        formats: &[RequestFormat],
        cursor: Cursor,
        limit: u32,
    ) -> Result<BatchPage, StoreError>;
    /// Starts cancelling: its queued items end `canceled`; running ones finish. `None` when
    /// the account has no such batch.
    async fn cancel(
        &self,
        account_id: &str,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<Batch>, StoreError>;
    async fn delete(&self, account_id: &str, id: &str) -> Result<Deleted, StoreError>;
    /// Claims up to `limit` items for `worker` until `lease_until`: queued ones, and running
    /// ones whose lease ran out (their worker died), of batches neither expired nor cancelled;
    /// no item is claimed by two workers at once.
    async fn claim(
        &self,
        worker: &str,
        limit: u32,
        now: OffsetDateTime,
        lease_until: OffsetDateTime,
    ) -> Result<Vec<ClaimedItem>, StoreError>;
    /// Writes a claimed item's result, if `worker` still holds it: `false` when it does not
    /// (its lease ran out and it was claimed again, or it ended), and nothing is written.
    async fn finish(
        &self,
        worker: &str,
        batch_id: &str,
        index: u32,
        outcome: Outcome,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Gives a claimed item back, if `worker` still holds it (`false` when not): unclaimed
    /// but still processing, claimed again once `until` has passed. Its upstream was
    /// overloaded before any output, so it did not run.
    async fn put_back(
        &self,
        worker: &str,
        batch_id: &str,
        index: u32,
        until: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Whether any of the batch's items is queued or running (`false` once it has ended, or
    /// when there is no such batch): a worker that ended an item asks it to know whether that
    /// was the batch's last.
    async fn processing(&self, batch_id: &str) -> Result<bool, StoreError>;
    /// Ends the items no worker holds (queued, or their lease ran out) of batches past their
    /// expiry (`expired`) or cancelled (`canceled`); returns how many ended.
    async fn sweep(&self, now: OffsetDateTime) -> Result<u64, StoreError>;
    /// Up to `limit` batches created before `cutoff` whose items have all ended, oldest first:
    /// those past their results' retention, for [`BatchStore::forget`].
    async fn ended_before(
        &self,
        cutoff: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<String>, StoreError>;
    /// Deletes the batch and its items, a bounded chunk of items per statement; nothing when
    /// there is no such batch, so pods forgetting the same batch at once do no harm.
    async fn forget(&self, batch_id: &str) -> Result<(), StoreError>;
    /// Ended items' results, by index after `after` (all from the first when `None`).
    async fn results(
        &self,
        batch_id: &str,
        after: Option<u32>,
        limit: u32,
    ) -> Result<Vec<ItemResult>, StoreError>;
}

/// The result JSON of an item that ended without running.
pub fn result_of(state: ItemState) -> String {
    format!(r#"{{"type":"{}"}}"#, crate::db::name_of(&state))
}
