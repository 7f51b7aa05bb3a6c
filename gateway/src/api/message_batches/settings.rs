//! What start-up chose for Message Batches (`flags/batches.rs`).

use std::time::Duration;

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
    /// Requests in one batch.
    pub max_requests: usize,
    /// How often an idle worker looks for items and sweeps.
    pub poll: Duration,
    /// Bytes of uploads one account may keep.
    pub files_account_max_bytes: u64,
}
