//! When an upstream is taken out of rotation, and for how long.

use std::time::Duration;

use clap::Args;

use gateway_core::routing::breaker::BreakerPolicy;

#[derive(Debug, Args)]
pub struct BreakerArgs {
    /// Consecutive failed attempts that take an upstream out of rotation.
    #[arg(long, env = "GATEWAY_BREAKER_FAILURES", default_value_t = 5)]
    pub breaker_failures: u32,
    /// How long an upstream stays out before one turn probes it.
    #[arg(long, env = "GATEWAY_BREAKER_COOLDOWN_MS", default_value_t = 30_000)]
    pub breaker_cooldown_ms: u64,
}

impl From<&BreakerArgs> for BreakerPolicy {
    fn from(args: &BreakerArgs) -> Self {
        Self {
            // Zero failures would keep every upstream out.
            failures: args.breaker_failures.max(1),
            cooldown: Duration::from_millis(args.breaker_cooldown_ms),
        }
    }
}
