//! The ledger's background work: cluster mode's allotments and reaper, standalone's promotion
//! sweep.

use std::time::Duration;

use clap::Args;

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
