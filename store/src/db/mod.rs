//! The Postgres connection of cluster mode: one pool shared by the accounts store and the
//! ledger (directly or through a transaction pooler, see [`pool`]), the migrations embedded in
//! the binary, and the bound on every call, so that an unreachable or stalled Postgres turns
//! into a quick `Unavailable` rather than a hang.

#[cfg(test)]
mod migration_rules;
mod pool;
mod tls;

use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use thiserror::Error;

use crate::metrics;

pub use pool::{DbPool, Pooler};
pub use tls::PgTlsFiles;

#[derive(Debug, Error)]
pub enum DbError {
    #[error("database call timed out after {0:?}")]
    Timeout(Duration),
    /// A refused handshake reads `postgres: TLS: …`, whichever call met it.
    #[error("{}", tls::describe(.0))]
    Sql(#[from] sqlx::Error),
    #[error("migrations failed: {}", tls::describe_migrate(.0))]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("postgres: TLS: {0}")]
    TlsSettings(String),
    #[error("database unreachable: a call failed {0:?} ago")]
    Failing(Duration),
    #[error("migrations need a direct connection: a transaction pooler cannot hold their lock; run `gateway migrate` against Postgres itself")]
    MigrateThroughPooler,
}

impl DbError {
    /// A unique or check constraint refused the write: the request's fault, not an outage.
    pub fn constraint(&self) -> Option<&str> {
        match self {
            DbError::Sql(sqlx::Error::Database(e)) => e.constraint(),
            _ => None,
        }
    }

    /// The TLS handshake with Postgres failed (a certificate refused, TLS required by one side
    /// and not the other): a setting to fix, not an outage that ends by itself.
    pub fn tls(&self) -> bool {
        match self {
            DbError::Sql(e) => tls::failure(e).is_some(),
            DbError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => tls::failure(e).is_some(),
            DbError::TlsSettings(_) => true,
            _ => false,
        }
    }

    /// Postgres could not be reached (or did not answer in time), as opposed to an answer
    /// refusing the call.
    fn unreachable(&self) -> bool {
        matches!(
            self,
            DbError::Timeout(_)
                | DbError::Failing(_)
                | DbError::Sql(
                    sqlx::Error::Io(_)
                        | sqlx::Error::PoolTimedOut
                        | sqlx::Error::PoolClosed
                        | sqlx::Error::Tls(_)
                )
        )
    }
}

/// What [`Database::connect_with`] connects to, and how. No `Debug`: the URL may hold a
/// password.
#[derive(Clone)]
pub struct DbSettings {
    /// `postgres://user:password@host:port/db` (also `?host=/socket/dir`).
    pub url: String,
    /// Connections per process.
    pub pool_size: u32,
    /// Bound on every call.
    pub timeout: Duration,
    /// What listens at `url`.
    pub pooler: Pooler,
    /// The CA and client certificate files, over what the URL says.
    pub tls: PgTlsFiles,
}

/// Calls in a row finding Postgres unreachable that mean it is down. Calls in flight when
/// Postgres goes away fail together, so an outage under traffic is seen at once; one slow call
/// on a busy node is not an outage and must not refuse the requests after it (the same rule as
/// Redis's, gateway-core's `limits::failover`).
const DOWN_AFTER: u32 = 3;

#[derive(Clone)]
pub struct Database {
    pool: DbPool,
    timeout: Duration,
    /// Since the last call that reached Postgres: how many calls found it unreachable, and
    /// when the last of them did.
    unreachable: Arc<Mutex<Unreachable>>,
}

#[derive(Default)]
struct Unreachable {
    calls: u32,
    last_at: Option<Instant>,
}

impl Database {
    /// A pool to `url` (`postgres://user:password@host:port/db`); connections are opened on
    /// demand, so a gateway starts (and recovers) while Postgres is away.
    pub fn connect(url: &str, pool_size: u32, timeout: Duration) -> Result<Self, DbError> {
        Self::connect_with(&DbSettings {
            url: url.to_owned(),
            pool_size,
            timeout,
            pooler: Pooler::None,
            tls: PgTlsFiles::default(),
        })
    }

    /// [`Database::connect`] with every setting, a pooler among them.
    pub fn connect_with(settings: &DbSettings) -> Result<Self, DbError> {
        let DbSettings {
            url,
            pool_size,
            timeout,
            pooler,
            tls,
        } = settings;
        let (pool_size, timeout, pooler) = (*pool_size, *timeout, *pooler);
        let options = tls.apply(url, PgConnectOptions::from_str(url)?)?;
        let options = options.application_name("gateway");
        let options = match pooler {
            Pooler::None => options.options([(
                "statement_timeout",
                format!("{}ms", timeout.as_millis().max(1)),
            )]),
            // PgBouncer refuses startup parameters it does not track; the timeout is set per
            // transaction instead (see `pool`).
            Pooler::Transaction => options.extra_float_digits(None),
        };
        let pool = PgPoolOptions::new()
            .max_connections(pool_size.max(1))
            .acquire_timeout(timeout)
            .connect_lazy_with(options);
        Ok(Self {
            pool: DbPool::new(pool, pooler, timeout),
            timeout,
            unreachable: Arc::default(),
        })
    }

    /// Applies the embedded migrations; refused through a transaction pooler, since the
    /// migrator holds a session lock across transactions.
    pub async fn migrate(&self) -> Result<(), DbError> {
        if self.pool.through_transaction_pooler() {
            return Err(DbError::MigrateThroughPooler);
        }
        let mut migrator = sqlx::migrate!("./migrations");
        // A binary older than the database (a rolled-back release, the old pods of a rolling
        // upgrade) applies the migrations it knows and tolerates those a newer release
        // applied: every migration keeps the previous release working (migration_rules.rs).
        migrator.set_ignore_missing(true);
        // On a connection of its own without the calls' `statement_timeout`: a migration may
        // take longer than a request's bound, and so may waiting for the migration lock while
        // another pod migrates (pods starting together, each with --migrate). Closed after,
        // so no pooled connection keeps the unbounded setting.
        let mut connection = self.pool.raw().acquire().await?.detach();
        sqlx::query("SET statement_timeout = 0")
            .execute(&mut connection)
            .await?;
        migrator.run(&mut connection).await?;
        Ok(())
    }

    /// One connection made now, for a process to refuse to start on a TLS setting Postgres
    /// refuses (a wrong CA, a host the certificate does not name) rather than serve without its
    /// stores. Any other failure is an outage, which the bounded calls ride out.
    pub async fn refused_tls(&self) -> Option<DbError> {
        let error = match self.pool.raw().acquire().await {
            Ok(_) => return None,
            Err(e) => DbError::from(e),
        };
        error.tls().then_some(error)
    }

    pub fn pool(&self) -> &DbPool {
        &self.pool
    }

    /// The bound on every call; also the server's `statement_timeout`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long ago the last call found Postgres unreachable, when it is down: at least
    /// [`DOWN_AFTER`] calls in a row found it so and none reached it since.
    fn down_for(&self) -> Option<Duration> {
        let unreachable = self.unreachable.lock().unwrap_or_else(|e| e.into_inner());
        if unreachable.calls < DOWN_AFTER {
            return None;
        }
        unreachable.last_at.map(|at| at.elapsed())
    }

    /// Runs one database call within the timeout, recording its latency and outcome in the
    /// store metrics (every call passes here, so they are all counted as `op="query"`).
    ///
    /// Once [`DOWN_AFTER`] calls in a row found Postgres unreachable, calls fail at once for
    /// one timeout after the last of them instead of each waiting out a timeout of its own: a
    /// request making two calls (a key lookup, then a reservation) answers within one timeout
    /// during an outage, not two. The first call after that window tries again, so recovery is
    /// noticed within a timeout. A single call timing out fails only itself.
    pub async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, DbError> {
        self.bounded_by(self.timeout, call).await
    }

    /// [`Database::bounded`] with a bound of its own, for the statements of a job (not of a
    /// request) that may take longer; the job sets the server's `statement_timeout` to match.
    pub async fn bounded_by<T>(
        &self,
        limit: Duration,
        call: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, DbError> {
        if let Some(ago) = self.down_for().filter(|ago| *ago < self.timeout) {
            return Err(DbError::Failing(ago));
        }
        let started = Instant::now();
        let result = match tokio::time::timeout(limit, call).await {
            Ok(result) => result.map_err(DbError::from),
            Err(_) => Err(DbError::Timeout(limit)),
        };
        // A refused constraint is an answer, not a failed call.
        let ok = match &result {
            Ok(_) => true,
            Err(e) => e.constraint().is_some(),
        };
        metrics::store_call("postgres", "query", started.elapsed(), ok);
        let mut unreachable = self.unreachable.lock().unwrap_or_else(|e| e.into_inner());
        match &result {
            Err(e) if e.unreachable() => {
                unreachable.calls = unreachable.calls.saturating_add(1);
                unreachable.last_at = Some(Instant::now());
            }
            Err(_) => {}
            Ok(_) => *unreachable = Unreachable::default(),
        }
        result
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
