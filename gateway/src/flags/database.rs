//! The Postgres flags, declared once: `serve` takes them with the URL optional (without it the
//! stores stay in process) and `--migrate` beside them, the database commands with the URL
//! required.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use store::db::{DbSettings, PgTlsFiles, Pooler};

/// The id clap gives `--database-url`, for the commands that make it required.
pub const URL: &str = "database_url";

#[derive(Clone, Debug, Args)]
pub struct DatabaseArgs {
    /// Accounts, keys and the ledger in Postgres: `postgres://user:password@host:port/db`
    /// (also `?host=/socket/dir`); over TLS with `?sslmode=verify-full` (and
    /// `&sslrootcert=/path/ca.pem`, or --database-ca-file).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Bound on every database call; past it a request needing credits gets 503.
    #[arg(long, env = "GATEWAY_DATABASE_TIMEOUT_MS", default_value_t = 2_000)]
    pub database_timeout_ms: u64,
    /// Database connections per process.
    #[arg(long, env = "GATEWAY_DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: u32,
    /// What listens at the database URL: `none` (Postgres itself, or a pooler in session
    /// mode) or `transaction` (PgBouncer with `pool_mode = transaction`: each statement runs
    /// in a transaction of its own, unnamed; migrations are refused, run them directly).
    #[arg(long, env = "GATEWAY_DATABASE_POOLER", value_enum, default_value_t = Pooler::None)]
    pub database_pooler: Pooler,
    /// PEM bundle of the CA that signed Postgres' certificate (a managed service's CA);
    /// turns `sslmode` to `verify-full` unless the URL says `verify-ca`.
    #[arg(long, env = "GATEWAY_DATABASE_CA_FILE")]
    pub database_ca_file: Option<PathBuf>,
    /// PEM certificate this process shows Postgres (`cert` authentication); with its key.
    #[arg(
        long,
        env = "GATEWAY_DATABASE_CLIENT_CERT_FILE",
        requires = "database_client_key_file"
    )]
    pub database_client_cert_file: Option<PathBuf>,
    /// PEM private key of `--database-client-cert-file`.
    #[arg(
        long,
        env = "GATEWAY_DATABASE_CLIENT_KEY_FILE",
        requires = "database_client_cert_file"
    )]
    pub database_client_key_file: Option<PathBuf>,
}

impl DatabaseArgs {
    /// The database to connect to; `None` without a URL.
    pub fn settings(&self) -> Option<DbSettings> {
        Some(DbSettings {
            url: self.database_url.clone()?,
            pool_size: self.database_pool_size,
            timeout: Duration::from_millis(self.database_timeout_ms),
            pooler: self.database_pooler,
            tls: PgTlsFiles {
                ca_file: self.database_ca_file.clone(),
                client_cert_file: self.database_client_cert_file.clone(),
                client_key_file: self.database_client_key_file.clone(),
            },
        })
    }
}

/// `serve`'s database section: the connection, and whether to migrate at start.
#[derive(Debug, Args)]
pub struct ServeDatabaseArgs {
    #[command(flatten)]
    pub connection: DatabaseArgs,
    /// Apply the database migrations at start.
    #[arg(long, env = "GATEWAY_MIGRATE")]
    pub migrate: bool,
}
