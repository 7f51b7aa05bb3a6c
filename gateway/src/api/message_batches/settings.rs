//! What start-up chose for Message Batches (`flags/batches.rs`).

use std::time::Duration;

use store::batches::Batch;
use time::OffsetDateTime;

#[derive(Clone, Debug)]
pub struct BatchSettings {
    /// Items one process runs at once.
    pub concurrency: usize,
    /// How long a claimed item stays its worker's.
    pub lease: Duration,
    /// How long after creation a batch's items may still run.
    pub expiry: Duration,
    /// An item's price, in percent of the interactive one.
    pub price_percent: u32,
    /// Batches one key may have processing at once.
    pub max_in_progress: u32,
    /// Items one key may have queued or running over all its batches.
    pub max_queued_items: u64,
    /// How long after its creation an ended batch and its results are kept.
    pub results_kept: Duration,
    /// Requests in one batch.
    pub max_requests: usize,
    /// How often an idle worker looks for items and sweeps.
    pub poll: Duration,
    /// Bytes of uploads one account may keep.
    pub files_account_max_bytes: u64,
    /// How long an upload that sets no `expires_after` is kept.
    pub files_expiry: Duration,
}

impl BatchSettings {
    /// Whether the batch is past its results' retention at `now`: gone to its API from then,
    /// and deleted by the next retention sweep.
    pub fn forgotten(&self, batch: &Batch, now: OffsetDateTime) -> bool {
        batch.ended_at.is_some() && batch.created_at + self.results_kept <= now
    }
}
