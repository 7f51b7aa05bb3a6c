//! The small keys a message row names its route and its upstream by (migration 0025): a row
//! keeps two `integer`s where it kept six names. A key is made the first time its names are
//! written (by any process) and never changes or goes, so each process keeps the keys it has
//! seen: once its routes have been seen, a turn's statement binds keys it already holds.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use sqlx::Row;

use crate::db::{Database, DbError};

/// The most keys a table's cache holds; past it the cache starts again empty (the names come
/// from the operator's routes, so a process sees a few dozen; the bound is for a fleet whose
/// routes churn for months).
const MAX_CACHED: usize = 4_096;

/// Names of one kind, as the table keys them.
type Names = [String; 3];

/// One table of keyed names: its name, its three name columns, and the keys seen.
struct KeyTable {
    upsert: &'static str,
    seen: Mutex<HashMap<Names, i32>>,
}

impl KeyTable {
    fn seen(&self) -> MutexGuard<'_, HashMap<Names, i32>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each name triple's key, in their order; the ones not seen yet are made (or read, when
    /// another process made them) in one statement.
    async fn keys(&self, db: &Database, wanted: &[[&str; 3]]) -> Result<Vec<i32>, DbError> {
        // Each distinct triple looked up (and owned) once: a batch's turns share a few routes.
        let mut distinct: Vec<Names> = Vec::new();
        let mut index: HashMap<[&str; 3], usize> = HashMap::new();
        for names in wanted {
            index.entry(*names).or_insert_with(|| {
                distinct.push(names.map(str::to_owned));
                distinct.len() - 1
            });
        }
        let mut keys: Vec<Option<i32>> = {
            let seen = self.seen();
            distinct
                .iter()
                .map(|names| seen.get(names).copied())
                .collect()
        };
        if keys.iter().any(Option::is_none) {
            let made = self.make(db, &distinct, &keys).await?;
            for (key, names) in keys.iter_mut().zip(&distinct) {
                *key = key.or_else(|| made.get(names).copied());
            }
        }
        // The upsert returns a row for each triple it was given.
        wanted
            .iter()
            .map(|names| {
                index
                    .get(names)
                    .and_then(|&i| keys.get(i).copied().flatten())
                    .ok_or(DbError::Sql(sqlx::Error::RowNotFound))
            })
            .collect()
    }

    /// Makes (or reads) the keys of the triples without one, and remembers them.
    async fn make(
        &self,
        db: &Database,
        wanted: &[Names],
        keys: &[Option<i32>],
    ) -> Result<HashMap<Names, i32>, DbError> {
        // Sorted (and distinct, as `keys` gives them): an upsert may not touch a row twice,
        // and two processes making the same keys take their row locks in the same order.
        let mut missing: Vec<&Names> = wanted
            .iter()
            .zip(keys)
            .filter(|(_, key)| key.is_none())
            .map(|(names, _)| names)
            .collect();
        missing.sort();
        let column = |i: usize| missing.iter().map(|n| n[i].as_str()).collect::<Vec<_>>();
        let rows = db
            .bounded(
                sqlx::query(self.upsert)
                    .bind(column(0))
                    .bind(column(1))
                    .bind(column(2))
                    .fetch_all(db.pool()),
            )
            .await?;
        let made = rows
            .iter()
            .map(|row| {
                let names: Names = [row.try_get(1)?, row.try_get(2)?, row.try_get(3)?];
                Ok((names, row.try_get(0)?))
            })
            .collect::<Result<HashMap<Names, i32>, sqlx::Error>>()?;
        let mut seen = self.seen();
        if seen.len() + made.len() > MAX_CACHED {
            seen.clear();
        }
        seen.extend(made.iter().map(|(names, &key)| (names.clone(), key)));
        Ok(made)
    }
}

/// The keys of routes (`model`, `served_model`, `endpoint`) and of upstreams (`provider`,
/// `upstream`, `upstream_model`) this process has seen.
pub struct NameKeys {
    routes: KeyTable,
    upstreams: KeyTable,
}

impl Default for NameKeys {
    fn default() -> Self {
        Self {
            // `DO UPDATE` (of nothing) rather than `DO NOTHING`: it returns the row another
            // process made, which this statement's snapshot would not see.
            routes: KeyTable {
                upsert: "INSERT INTO message_routes (model, served_model, endpoint)
                         SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
                         ON CONFLICT (model, served_model, endpoint)
                             DO UPDATE SET model = EXCLUDED.model
                         RETURNING id, model, served_model, endpoint",
                seen: Mutex::default(),
            },
            upstreams: KeyTable {
                upsert: "INSERT INTO message_upstreams (provider, upstream, upstream_model)
                         SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
                         ON CONFLICT (provider, upstream, upstream_model)
                             DO UPDATE SET provider = EXCLUDED.provider
                         RETURNING id, provider, upstream, upstream_model",
                seen: Mutex::default(),
            },
        }
    }
}

impl NameKeys {
    /// The key of each `[model, served_model, endpoint]`.
    pub async fn routes(&self, db: &Database, names: &[[&str; 3]]) -> Result<Vec<i32>, DbError> {
        self.routes.keys(db, names).await
    }

    /// The key of each `[provider, upstream, upstream_model]`.
    pub async fn upstreams(&self, db: &Database, names: &[[&str; 3]]) -> Result<Vec<i32>, DbError> {
        self.upstreams.keys(db, names).await
    }
}
