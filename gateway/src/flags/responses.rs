//! The Responses API: the secret its sealed reasoning is keyed by, and how long and how many
//! stored responses are kept.

use std::time::Duration;

use clap::Args;

use super::secrets::LONG_SECRET;
use gateway_core::responses_store::{MemoryLimits, Quota, Retention};
use gateway_core::seal::Sealer;

#[derive(Clone, Debug, Args)]
pub struct ResponsesArgs {
    /// Secret that seals the reasoning `/v1/responses` hands to stateless clients
    /// (`include: ["reasoning.encrypted_content"]`). Give every pod the same one; without it
    /// each process picks a random one, and sealed reasoning only comes back to that process.
    #[arg(
        long,
        env = "GATEWAY_RESPONSES_SECRET",
        hide_env_values = true,
        value_parser = LONG_SECRET
    )]
    pub responses_secret: Option<String>,
    /// How long a stored response (`store: true`) can be retrieved or continued; older ones
    /// are purged. 30 days by default, as OpenAI keeps them.
    #[arg(long, env = "GATEWAY_RESPONSES_RETENTION_SECS", default_value_t = Retention::DEFAULT_HOURS * 3600)]
    pub responses_retention_secs: u64,
    /// In-process store (no `--database-url`): the most responses one account keeps; its
    /// oldest go first.
    #[arg(long, env = "GATEWAY_RESPONSES_CAPACITY", default_value_t = 10_000)]
    pub responses_capacity: usize,
    /// In-process store: the most bytes all accounts' responses take together; past it an
    /// account evicts its own oldest, and one with none is refused.
    #[arg(long, env = "GATEWAY_RESPONSES_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub responses_max_bytes: usize,
    /// Either store: the most bytes one account's stored responses take (their compact JSON
    /// and a small overhead each); past it the account's oldest go first, and one response
    /// larger than this is refused with 413.
    #[arg(long, env = "GATEWAY_RESPONSES_ACCOUNT_MAX_BYTES", default_value_t = Quota::default().account_max_bytes)]
    pub responses_account_max_bytes: usize,
}

impl ResponsesArgs {
    pub fn sealer(&self) -> Sealer {
        Sealer::new(self.responses_secret.as_deref())
    }

    pub fn retention(&self) -> Retention {
        Retention(Duration::from_secs(self.responses_retention_secs))
    }

    pub fn quota(&self) -> Quota {
        Quota {
            account_max_bytes: self.responses_account_max_bytes,
        }
    }

    /// The bounds of the in-process store.
    pub fn memory_limits(&self) -> MemoryLimits {
        MemoryLimits {
            max_responses: self.responses_capacity,
            max_bytes: self.responses_max_bytes,
            quota: self.quota(),
            retention: self.retention(),
        }
    }
}
