//! The Redis that cluster mode shares its limits and stream slots through.

use std::time::Duration;

use clap::Args;

use gateway_core::limits::RedisSettings;

#[derive(Debug, Args)]
pub struct RedisArgs {
    /// `redis://host:port[/db]`, or `redis-cluster://host:port` for Redis Cluster.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: String,
    /// Bound on every Redis call.
    #[arg(long, env = "GATEWAY_REDIS_TIMEOUT_MS", default_value_t = 250)]
    pub redis_timeout_ms: u64,
    /// How long a stream slot lives without renewal; renewed every third of it while the stream
    /// runs.
    #[arg(long, env = "GATEWAY_STREAM_LEASE_SECS", default_value_t = 10)]
    pub stream_lease_secs: u64,
}

impl RedisArgs {
    pub fn settings(&self) -> RedisSettings {
        RedisSettings {
            url: self.redis_url.clone(),
            timeout: Duration::from_millis(self.redis_timeout_ms),
            // A slot living zero seconds would expire before its first renewal.
            slot_ttl: Duration::from_secs(self.stream_lease_secs.max(1)),
        }
    }
}
