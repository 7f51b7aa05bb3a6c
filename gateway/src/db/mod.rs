//! The Postgres connection of cluster mode: one pool shared by the accounts store and the
//! ledger, the migrations embedded in the binary, and the bound on every call, so that an
//! unreachable or stalled Postgres turns into a quick `Unavailable` rather than a hang.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DbError {
    #[error("database call timed out after {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error("migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl DbError {
    /// A unique or check constraint refused the write: the request's fault, not an outage.
    pub fn constraint(&self) -> Option<&str> {
        match self {
            DbError::Sql(sqlx::Error::Database(e)) => e.constraint(),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct Database {
    pool: PgPool,
    timeout: Duration,
}

impl Database {
    /// A pool to `url` (`postgres://user:password@host:port/db`); connections are opened on
    /// demand, so a gateway starts (and recovers) while Postgres is away.
    pub fn connect(url: &str, pool_size: u32, timeout: Duration) -> Result<Self, DbError> {
        let options = PgConnectOptions::from_str(url)?
            .application_name("gateway")
            .options([(
                "statement_timeout",
                format!("{}ms", timeout.as_millis().max(1)),
            )]);
        let pool = PgPoolOptions::new()
            .max_connections(pool_size.max(1))
            .acquire_timeout(timeout)
            .connect_lazy_with(options);
        Ok(Self { pool, timeout })
    }

    pub async fn migrate(&self) -> Result<(), DbError> {
        sqlx::migrate!("./migrations").run(&self.pool).await?;
        Ok(())
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs one database call within the timeout.
    pub async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, DbError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(DbError::Timeout(self.timeout)),
        }
    }
}

/// Credits and token counts are u64 in the gateway and bigint in Postgres.
pub fn to_db(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub fn from_db(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The text an enum is stored as: its serde name.
pub fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// The variant of `all` stored as `name`.
pub fn parse_name<T: Serialize + Copy>(all: &[T], name: &str) -> Option<T> {
    all.iter().copied().find(|v| name_of(v) == name)
}
