//! The Redis that cluster mode shares its limits and stream slots through.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use gateway_core::limits::{RedisSettings, RedisTlsFiles};

#[derive(Debug, Args)]
pub struct RedisArgs {
    /// `redis://[user:password@]host:port[/db]`, or `redis-cluster://host:port` for Redis
    /// Cluster; `rediss://` and `rediss-cluster://` over TLS.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: String,
    /// Bound on every Redis call.
    #[arg(long, env = "GATEWAY_REDIS_TIMEOUT_MS", default_value_t = 250)]
    pub redis_timeout_ms: u64,
    /// How long a stream slot lives without renewal; renewed every third of it while the stream
    /// runs.
    #[arg(long, env = "GATEWAY_STREAM_LEASE_SECS", default_value_t = 10)]
    pub stream_lease_secs: u64,
    /// PEM bundle of the CA that signed Redis' certificate (`rediss://`); the only roots
    /// trusted when given, the public ones otherwise.
    #[arg(long, env = "GATEWAY_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM certificate this process shows Redis (`tls-auth-clients yes`); with its key.
    #[arg(
        long,
        env = "GATEWAY_REDIS_CLIENT_CERT_FILE",
        requires = "redis_client_key_file"
    )]
    pub redis_client_cert_file: Option<PathBuf>,
    /// PEM private key of `--redis-client-cert-file`.
    #[arg(
        long,
        env = "GATEWAY_REDIS_CLIENT_KEY_FILE",
        requires = "redis_client_cert_file"
    )]
    pub redis_client_key_file: Option<PathBuf>,
}

impl RedisArgs {
    pub fn settings(&self) -> RedisSettings {
        RedisSettings {
            url: self.redis_url.clone(),
            tls: RedisTlsFiles {
                ca_file: self.redis_ca_file.clone(),
                client_cert_file: self.redis_client_cert_file.clone(),
                client_key_file: self.redis_client_key_file.clone(),
            },
            timeout: Duration::from_millis(self.redis_timeout_ms),
            // A slot living zero seconds would expire before its first renewal.
            slot_ttl: Duration::from_secs(self.stream_lease_secs.max(1)),
        }
    }
}
