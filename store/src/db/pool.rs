//! The connection pool every store runs its statements on, directly or through a transaction
//! pooler (PgBouncer with `pool_mode = transaction`).
//!
//! A transaction pooler lends a server connection for one transaction only, and sqlx runs a
//! statement with arguments in two exchanges (parse and describe, then bind and execute),
//! each closed by a Sync: between them the pooler may hand the client's next exchange to
//! another server, where the statement does not exist; and a named statement that sqlx
//! caches lives on one server only (or collides with another client's of the same name).
//! So through a pooler each statement runs inside a transaction of its own (one server from
//! `BEGIN` to `COMMIT`), unnamed (nothing outlives it on the server), and the statement
//! timeout is set per transaction, since a pooler refuses the `options` startup parameter.
//! That costs three round trips per statement more than a direct connection with its
//! statement cache (docs/capacity.md has the figures).

use std::borrow::Cow;
use std::time::Duration;

use clap::ValueEnum;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgPool, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Describe, Either, Execute, Executor, Postgres, Transaction};

/// What sits between the gateway and Postgres (`--database-pooler`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Pooler {
    /// Postgres itself, or a pooler in session mode: statements are prepared once per
    /// connection and cached.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`).
    Transaction,
}

#[derive(Clone, Debug)]
pub struct DbPool {
    pool: PgPool,
    /// Through a transaction pooler: how each transaction begins (with its statement timeout).
    begin: Option<Cow<'static, str>>,
}

impl DbPool {
    pub(super) fn new(pool: PgPool, pooler: Pooler, timeout: Duration) -> Self {
        let begin = (pooler == Pooler::Transaction).then(|| {
            Cow::Owned(format!(
                "BEGIN; SET LOCAL statement_timeout = {}",
                timeout.as_millis().max(1)
            ))
        });
        Self { pool, begin }
    }

    /// The sqlx pool itself, for what takes a whole connection (migrations).
    pub(super) fn raw(&self) -> &PgPool {
        &self.pool
    }

    pub(super) fn through_transaction_pooler(&self) -> bool {
        self.begin.is_some()
    }

    /// Runs `sql`, a maintenance command that cannot run in a transaction (`VACUUM`, `REINDEX
    /// … CONCURRENTLY`), on a connection of its own, given up to `timeout` on the server where
    /// the connection allows it. The connection is closed afterwards rather than returned to
    /// the pool, so its longer `statement_timeout` never reaches another statement. Through a
    /// transaction pooler the command goes alone, with no `SET` (a session setting would stay
    /// on a server other clients are lent); the caller's bound is the only one.
    pub async fn maintain(&self, sql: &str, timeout: Duration) -> Result<(), sqlx::Error> {
        let mut conn = self.pool.acquire().await?.detach();
        if self.begin.is_none() {
            let set = format!("SET statement_timeout = {}", timeout.as_millis().max(1));
            conn.execute(set.as_str()).await?;
        }
        let done = conn.execute(sql).await.map(drop);
        // Closing politely is best effort: the connection is dropped either way.
        let _ = sqlx::Connection::close(conn).await;
        done
    }

    /// A transaction. Through a transaction pooler its statements must be unnamed
    /// (`.persistent(false)`): a named one would be cached for a server the next transaction
    /// may not get.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        match &self.begin {
            None => self.pool.begin().await,
            Some(begin) => self.pool.begin_with(begin.clone()).await,
        }
    }
}

/// A statement run unnamed: prepared, executed and forgotten within one transaction.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(&self) -> &'q str {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

impl<'p> Executor<'p> for &'p DbPool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let Some(begin) = self.begin.clone() else {
            return self.pool.fetch_many(query);
        };
        let pool = self.pool.clone();
        // Collected before COMMIT, so a caller never sees rows of a transaction that failed.
        futures::stream::once(async move {
            let mut tx = pool.begin_with(begin).await?;
            let results: Vec<_> = (&mut *tx).fetch_many(Unnamed(query)).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures::stream::iter(results.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let Some(begin) = self.begin.clone() else {
            return self.pool.fetch_optional(query);
        };
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut tx = pool.begin_with(begin).await?;
            let row = (&mut *tx).fetch_optional(Unnamed(query)).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'p: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        self.pool.describe(sql)
    }
}
