//! The ledger's background work: cluster mode's allotments and reaper, standalone's promotion
//! sweep.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use gateway_core::ledger_export::retention::Retention;
use gateway_core::ledger_export::Destination;
use gateway_core::reaper::Reaping;

/// `serve` with a database only.
#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// A process silent this long is dead: the reaper releases its reservations (heartbeat
    /// every third of it).
    #[arg(long, env = "GATEWAY_REAPER_STALE_SECS", default_value_t = 30)]
    pub reaper_stale_secs: u64,
    /// No turn runs longer: older reservations are released even if their process lives (its
    /// settle failed, e.g. during a database outage).
    #[arg(long, env = "GATEWAY_REAPER_MAX_TURN_SECS", default_value_t = 3_600)]
    pub reaper_max_turn_secs: u64,
    /// Credits each process holds ahead for an account, in turns like the one asking (0: off,
    /// every turn is reserved in Postgres on the request path). With it on, an account's
    /// turns reserve in memory and their ledger rows are written just after the turn; see
    /// docs/ledger.md, "Allotments".
    #[arg(long, env = "GATEWAY_ALLOTMENT_TURNS", default_value_t = 32)]
    pub allotment_turns: u64,
    /// Boxed: the serve command's flags would outgrow the others' (clippy's
    /// `large_enum_variant`).
    #[command(flatten)]
    pub retention: Box<RetentionArgs>,
}

/// How long the ledger's rows stay in Postgres, and where older days go
/// (docs/capacity.md, "Partitions and retention").
#[derive(Debug, Args)]
pub struct RetentionArgs {
    /// Days of ledger rows kept in Postgres (the usage rollups are kept forever); an older
    /// day is exported to the archive, verified, then dropped whole.
    #[arg(long, env = "GATEWAY_LEDGER_RETENTION_DAYS", default_value_t = 396,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub ledger_retention_days: u32,
    /// The archive: a folder (without an archive, no day is ever dropped).
    #[arg(
        long,
        env = "GATEWAY_LEDGER_ARCHIVE_DIR",
        conflicts_with = "ledger_archive_s3"
    )]
    pub ledger_archive_dir: Option<PathBuf>,
    /// The archive: a bucket and prefix, `s3://bucket/prefix`; credentials and region from the
    /// usual AWS_* variables.
    #[arg(long, env = "GATEWAY_LEDGER_ARCHIVE_S3")]
    pub ledger_archive_s3: Option<String>,
    /// The archive's S3-compatible server (default: AWS_ENDPOINT, else AWS itself).
    #[arg(long, env = "GATEWAY_S3_ENDPOINT")]
    pub ledger_archive_s3_endpoint: Option<String>,
}

impl RetentionArgs {
    /// The retention, with `longest_turn` the reaper's longest turn.
    pub fn retention(&self, longest_turn: Duration) -> Retention {
        let archive = match (&self.ledger_archive_dir, &self.ledger_archive_s3) {
            (Some(dir), _) => Some(Destination::Dir(dir.clone())),
            (None, Some(url)) => Some(Destination::S3 {
                url: url.clone(),
                endpoint: self.ledger_archive_s3_endpoint.clone(),
            }),
            (None, None) => None,
        };
        Retention {
            keep_days: self.ledger_retention_days,
            archive,
            longest_turn,
        }
    }
}

impl LedgerArgs {
    /// The reaper's timings; `draining` is how long this process may still write once it
    /// stops, which the shutdown flags decide.
    pub fn reaping(&self, draining: Duration) -> Reaping {
        Reaping {
            stale: Duration::from_secs(self.reaper_stale_secs.max(1)),
            max_turn: Duration::from_secs(self.reaper_max_turn_secs.max(1)),
            draining,
        }
    }
}

/// `standalone` only: in cluster mode the operator runs the sweep.
#[derive(Debug, Args)]
pub struct PromotionArgs {
    /// Seconds between promotion sweeps (tiers follow confirmed lifetime top-ups).
    #[arg(long, env = "GATEWAY_PROMOTION_INTERVAL_SECS", default_value_t = 300)]
    pub promotion_interval_secs: u64,
}

impl PromotionArgs {
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.promotion_interval_secs)
    }
}
