//! Message Batches: how many items each process runs at once, their lease, a batch's expiry,
//! its results' retention, the batch price, and the per-key and per-batch caps.

use std::time::Duration;

use clap::Args;

use crate::api::message_batches::settings::BatchSettings;

#[derive(Clone, Debug, Args)]
pub struct BatchesArgs {
    /// Batch items each process runs at once. They take none of the keys' interactive limits,
    /// so this (times the pods) is what batches take of the upstreams.
    #[arg(long, env = "GATEWAY_BATCH_CONCURRENCY", default_value_t = 4)]
    pub batch_concurrency: usize,
    /// How long a claimed item is its worker's: an item of a killed pod runs again after it.
    /// Longer than the slowest turn.
    #[arg(long, env = "GATEWAY_BATCH_LEASE_SECS", default_value_t = 600)]
    pub batch_lease_secs: u64,
    /// How long after its creation a batch's items may run; those not run by then end
    /// `expired`.
    #[arg(long, env = "GATEWAY_BATCH_EXPIRY_SECS", default_value_t = 24 * 3600)]
    pub batch_expiry_secs: u64,
    /// What a batch item costs, in percent of the same turn sent alone, on the routes that set
    /// no `batchPriceRatio` of their own.
    #[arg(long, env = "GATEWAY_BATCH_PRICE_PERCENT", default_value_t = 50)]
    pub batch_price_percent: u32,
    /// Batches one key may have processing at once; one more is refused (429).
    #[arg(long, env = "GATEWAY_BATCH_MAX_IN_PROGRESS", default_value_t = 10)]
    pub batch_max_in_progress: u32,
    /// Days an ended batch and its results (its output and error files) are kept after its
    /// creation, then deleted; its ledger rows stay. A fraction of a day is taken.
    #[arg(long, env = "GATEWAY_BATCH_RESULTS_DAYS", default_value_t = 29.0, value_parser = days)]
    pub batch_results_days: f64,
    /// Requests one key may have queued or running over all its batches; a batch whose
    /// requests would pass it is refused (429).
    #[arg(
        long,
        env = "GATEWAY_BATCH_MAX_QUEUED_ITEMS",
        default_value_t = 500_000
    )]
    pub batch_max_queued_items: u64,
    /// Requests in one batch (Anthropic's limit). A Message Batch's body cap (256 MiB) and the
    /// memory budget apply too.
    #[arg(long, env = "GATEWAY_BATCH_MAX_REQUESTS", default_value_t = 100_000)]
    pub batch_max_requests: usize,
    /// How often an idle worker looks for items, and sweeps expired and cancelled ones.
    #[arg(long, env = "GATEWAY_BATCH_POLL_MS", default_value_t = 1_000)]
    pub batch_poll_ms: u64,
    /// Bytes of uploads (`/v1/files`) one account may keep; an upload past it is refused (400)
    /// until files are deleted. Standalone keeps them in memory.
    #[arg(long, env = "GATEWAY_FILES_ACCOUNT_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub files_account_max_bytes: u64,
    /// Days an upload is kept when it sets no `expires_after` (OpenAI's default for purpose
    /// `batch`: 30), then it is gone and deleted. A fraction of a day is taken.
    #[arg(long, env = "GATEWAY_FILES_EXPIRY_DAYS", default_value_t = 30.0, value_parser = days)]
    pub files_expiry_days: f64,
}

impl From<&BatchesArgs> for BatchSettings {
    fn from(args: &BatchesArgs) -> Self {
        Self {
            concurrency: args.batch_concurrency.max(1),
            lease: Duration::from_secs(args.batch_lease_secs),
            expiry: Duration::from_secs(args.batch_expiry_secs),
            price_percent: args.batch_price_percent,
            max_in_progress: args.batch_max_in_progress,
            max_queued_items: args.batch_max_queued_items,
            results_kept: Duration::from_secs_f64(args.batch_results_days * 86_400.0),
            max_requests: args.batch_max_requests,
            poll: Duration::from_millis(args.batch_poll_ms.max(10)),
            files_account_max_bytes: args.files_account_max_bytes,
            files_expiry: Duration::from_secs_f64(args.files_expiry_days * 86_400.0),
        }
    }
}

/// A number of days, more than 0 and at most 10 years.
fn days(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(days) if days > 0.0 && days <= 3_650.0 => Ok(days),
        _ => Err(format!(
            "`{value}` is not a number of days above 0, at most 3650"
        )),
    }
}
