//! The Postgres account store of cluster mode. Key lookups, one per request, are cached for a
//! few seconds (so revocations and suspensions reach every pod within [`FRESH`]); while
//! Postgres is unreachable a key seen recently keeps working from the cache, so calls that
//! need no credits (count_tokens, models) survive an outage.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::Row;
use time::OffsetDateTime;

use super::{
    audited, grants, Account, AccountStatus, Accounts, GrantChange, KeyKind, KeyRecord, Promotion,
    PromotionRules, StoreError, KEY_TAKEN, NAME_TAKEN,
};
use crate::accounts::KeyHash;
use crate::audit::{append_in, Actor};
use crate::db::{from_db, name_of, parse_name, to_db, Database, DbError};
use crate::ids;

/// How long a cached key lookup is trusted while Postgres answers.
const FRESH: Duration = Duration::from_secs(5);
/// How long a cached key lookup may stand in for an unreachable Postgres.
const STALE: Duration = Duration::from_secs(600);
/// Past this many cached lookups, the misses and the stale ones are swept out: a flood of
/// made-up keys (each a miss worth caching against its repeats) cannot grow the cache for
/// ever, while the real keys, bounded by what the operators issued, stay.
const SWEEP_ABOVE: usize = 65_536;

type Lookup = Option<(KeyRecord, Account)>;

pub struct PostgresAccounts {
    db: Database,
    keys: DashMap<KeyHash, (Instant, Lookup)>,
}

impl PostgresAccounts {
    /// The account whose `column` (`id` or `name`, both unique) equals `value`.
    async fn account_where(
        &self,
        column: &'static str,
        value: &str,
    ) -> Result<Option<Account>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE {column} = $1"
                ))
                .bind(value)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(row
            .as_ref()
            .map(account_of)
            .transpose()
            .map_err(DbError::Sql)?)
    }

    pub fn new(db: Database) -> Self {
        Self {
            db,
            keys: DashMap::new(),
        }
    }

    async fn fetch_key(&self, hash: &KeyHash) -> Result<Lookup, DbError> {
        let row = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "SELECT {KEY_COLUMNS}, a.name AS account_name, a.status AS account_status,
                            a.created_at AS account_created_at
                     FROM api_keys k JOIN accounts a ON a.id = k.account_id
                     WHERE k.hash = $1"
                ))
                .bind(hash.as_bytes())
                .fetch_optional(self.db.pool()),
            )
            .await?;
        row.map(|row| {
            let key = key_of(&row)?;
            let account = Account {
                id: key.account_id.clone(),
                name: row.try_get("account_name")?,
                status: status_of(&row.try_get::<String, _>("account_status")?),
                created_at: row.try_get("account_created_at")?,
            };
            Ok((key, account))
        })
        .transpose()
        .map_err(DbError::Sql)
    }
}

const KEY_COLUMNS: &str =
    "k.id, k.account_id, k.name, k.prefix, k.hash, k.kind, k.scopes, k.tier, k.revoked_at, k.created_at,
     k.expires_at, k.spend_cap, k.created_by";

const ACCOUNT_COLUMNS: &str = "id, name, status, created_at";

fn status_of(name: &str) -> AccountStatus {
    parse_name(&[AccountStatus::Active, AccountStatus::Suspended], name)
        .unwrap_or(AccountStatus::Suspended)
}

fn key_of(row: &PgRow) -> Result<KeyRecord, sqlx::Error> {
    let hash: Vec<u8> = row.try_get("hash")?;
    let kind: String = row.try_get("kind")?;
    Ok(KeyRecord {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        // Unknown kinds are treated as CLI keys, which /v1 refuses.
        kind: parse_name(&[KeyKind::Api, KeyKind::Cli], &kind).unwrap_or(KeyKind::Cli),
        scopes: row.try_get("scopes")?,
        tier: row.try_get("tier")?,
        revoked: row
            .try_get::<Option<OffsetDateTime>, _>("revoked_at")?
            .is_some(),
        hash: KeyHash::from_bytes(&hash)
            .ok_or_else(|| sqlx::Error::Decode("api_keys.hash is not a SHA-256 digest".into()))?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        spend_cap: row.try_get::<Option<i64>, _>("spend_cap")?.map(from_db),
        created_by: row.try_get("created_by")?,
    })
}

fn account_of(row: &PgRow) -> Result<Account, sqlx::Error> {
    Ok(Account {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        status: status_of(&row.try_get::<String, _>("status")?),
        created_at: row.try_get("created_at")?,
    })
}

fn conflict_or_unavailable(e: DbError, what: &str) -> StoreError {
    match e.constraint() {
        Some(_) => StoreError::Conflict(what.to_owned()),
        None => e.into(),
    }
}

#[async_trait]
impl Accounts for PostgresAccounts {
    async fn create_account(&self, name: &str) -> Result<Account, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "INSERT INTO accounts (id, name) VALUES ($1, $2) RETURNING {ACCOUNT_COLUMNS}"
                ))
                .bind(ids::account())
                .bind(name)
                .fetch_one(self.db.pool()),
            )
            .await
            .map_err(|e| conflict_or_unavailable(e, NAME_TAKEN))?;
        Ok(account_of(&row).map_err(DbError::Sql)?)
    }

    async fn account(&self, id: &str) -> Result<Option<Account>, StoreError> {
        self.account_where("id", id).await
    }

    async fn account_by_name(&self, name: &str) -> Result<Option<Account>, StoreError> {
        self.account_where("name", name).await
    }

    async fn set_status(
        &self,
        id: &str,
        status: AccountStatus,
        by: &Actor,
    ) -> Result<Option<Account>, StoreError> {
        let row = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let was: Option<String> =
                    sqlx::query_scalar("SELECT status FROM accounts WHERE id = $1 FOR UPDATE")
                        .bind(id)
                        .persistent(false)
                        .fetch_optional(&mut *tx)
                        .await?;
                let Some(was) = was else {
                    return Ok(None);
                };
                let row = sqlx::query(&format!(
                    "UPDATE accounts SET status = $2 WHERE id = $1 RETURNING {ACCOUNT_COLUMNS}"
                ))
                .bind(id)
                .bind(name_of(&status))
                .persistent(false)
                .fetch_one(&mut *tx)
                .await?;
                let account = account_of(&row)?;
                let was = status_of(&was);
                if was != account.status {
                    append_in(&mut tx, &audited::status_set(&account, was, by)).await?;
                }
                tx.commit().await?;
                Ok(Some(account))
            })
            .await?;
        self.keys
            .retain(|_, (_, found)| found.as_ref().is_none_or(|(key, _)| key.account_id != id));
        Ok(row)
    }

    async fn insert_key(&self, key: KeyRecord, by: &Actor) -> Result<(), StoreError> {
        self.db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                sqlx::query(
                    "INSERT INTO api_keys (id, account_id, name, prefix, hash, kind, scopes, tier,
                         created_at, expires_at, spend_cap, created_by)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                )
                .bind(&key.id)
                .bind(&key.account_id)
                .bind(&key.name)
                .bind(&key.prefix)
                .bind(key.hash.as_bytes())
                .bind(name_of(&key.kind))
                .bind(&key.scopes)
                .bind(&key.tier)
                .bind(key.created_at)
                .bind(key.expires_at)
                .bind(key.spend_cap.map(to_db))
                .bind(&key.created_by)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &audited::key_created(&key, by)).await?;
                tx.commit().await
            })
            .await
            .map_err(|e| conflict_or_unavailable(e, KEY_TAKEN))?;
        self.keys.remove(&key.hash);
        Ok(())
    }

    async fn key_by_hash(
        &self,
        hash: &KeyHash,
    ) -> Result<Option<(KeyRecord, Account)>, StoreError> {
        let cached = self.keys.get(hash).map(|e| e.clone());
        if let Some((at, found)) = &cached {
            if at.elapsed() < FRESH {
                return Ok(found.clone());
            }
        }
        match self.fetch_key(hash).await {
            Ok(found) => {
                remember(&self.keys, *hash, found.clone(), SWEEP_ABOVE);
                Ok(found)
            }
            Err(e) => match cached {
                Some((at, found)) if at.elapsed() < STALE => {
                    tracing::debug!(error = %e, "key lookup served from the cache while Postgres is away");
                    Ok(found)
                }
                _ => Err(e.into()),
            },
        }
    }

    fn cached_key_by_hash(&self, hash: &KeyHash) -> Option<Option<(KeyRecord, Account)>> {
        let cached = self.keys.get(hash)?;
        let (at, found) = cached.value();
        (at.elapsed() < FRESH).then(|| found.clone())
    }

    async fn revoke_key(&self, id: &str, by: &Actor) -> Result<Option<KeyRecord>, StoreError> {
        let key = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let was_revoked: Option<bool> = sqlx::query_scalar(
                    "SELECT revoked_at IS NOT NULL FROM api_keys WHERE id = $1 FOR UPDATE",
                )
                .bind(id)
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(was_revoked) = was_revoked else {
                    return Ok(None);
                };
                let row = sqlx::query(&format!(
                    "UPDATE api_keys k SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1
                     RETURNING {KEY_COLUMNS}"
                ))
                .bind(id)
                .persistent(false)
                .fetch_one(&mut *tx)
                .await?;
                let key = key_of(&row)?;
                if !was_revoked {
                    append_in(&mut tx, &audited::key_revoked(&key, by)).await?;
                }
                tx.commit().await?;
                Ok(Some(key))
            })
            .await?;
        if let Some(key) = &key {
            self.keys.remove(&key.hash);
        }
        Ok(key)
    }

    async fn keys_of(&self, account_id: &str) -> Result<Vec<KeyRecord>, StoreError> {
        let rows = self
            .db
            .bounded(
                sqlx::query(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys k WHERE k.account_id = $1
                     ORDER BY k.created_at DESC"
                ))
                .bind(account_id)
                .fetch_all(self.db.pool()),
            )
            .await?;
        Ok(rows
            .iter()
            .map(key_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DbError::Sql)?)
    }

    async fn promote_tiers(
        &self,
        rules: &PromotionRules,
        by: &Actor,
    ) -> Result<Vec<Promotion>, StoreError> {
        let (tiers, cents): (Vec<String>, Vec<i64>) = rules
            .tiers()
            .iter()
            .map(|(tier, cents)| (tier.clone(), to_db(*cents)))
            .unzip();
        // One statement: each key's target is the highest listed tier whose threshold its
        // account's lifetime top-up reaches, applied only when it ranks above the key's tier;
        // the moves' audit rows in the same transaction.
        let promotions = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let rows = sqlx::query(
                    "WITH rules AS (
                         SELECT tier, cents, rank
                         FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS r (tier, cents, rank)
                     ), moves AS (
                         SELECT k.id, k.tier AS from_tier, best.tier AS to_tier
                         FROM api_keys k
                         JOIN accounts a ON a.id = k.account_id
                         JOIN rules cur ON cur.tier = k.tier
                         CROSS JOIN LATERAL (
                             SELECT r.tier, r.rank FROM rules r
                             WHERE r.cents <= a.lifetime_top_up_cents
                             ORDER BY r.rank DESC LIMIT 1
                         ) best
                         WHERE best.rank > cur.rank AND k.revoked_at IS NULL
                     )
                     UPDATE api_keys k SET tier = m.to_tier
                     FROM moves m WHERE k.id = m.id AND k.tier = m.from_tier
                     RETURNING k.id, k.account_id, m.from_tier, m.to_tier",
                )
                .bind(&tiers)
                .bind(&cents)
                .persistent(false)
                .fetch_all(&mut *tx)
                .await?;
                let promotions = rows
                    .iter()
                    .map(|row| {
                        Ok(Promotion {
                            key_id: row.try_get("id")?,
                            account_id: row.try_get("account_id")?,
                            from: row.try_get("from_tier")?,
                            to: row.try_get("to_tier")?,
                        })
                    })
                    .collect::<Result<Vec<_>, sqlx::Error>>()?;
                for promotion in &promotions {
                    append_in(&mut tx, &audited::promoted(promotion, by)).await?;
                }
                tx.commit().await?;
                Ok(promotions)
            })
            .await?;
        if !promotions.is_empty() {
            self.keys.clear();
        }
        Ok(promotions)
    }

    async fn record_key_grants(
        &self,
        grants: &BTreeMap<String, Value>,
        by: &Actor,
    ) -> Result<Vec<GrantChange>, StoreError> {
        let changes = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                // Two operators leading at once (a lease handed over) compare in turn, so a
                // change is audited once.
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext('key_grants'))")
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?;
                let recorded: BTreeMap<String, Value> =
                    sqlx::query_as::<_, (String, Value)>("SELECT key_id, granted FROM key_grants")
                        .persistent(false)
                        .fetch_all(&mut *tx)
                        .await?
                        .into_iter()
                        .collect();
                let candidates = grants::changed(&recorded, grants);
                let ids: Vec<&str> = candidates.iter().map(|(id, _, _)| id.as_str()).collect();
                let accounts: BTreeMap<String, String> = sqlx::query_as::<_, (String, String)>(
                    "SELECT id, account_id FROM api_keys WHERE id = ANY($1)",
                )
                .bind(&ids)
                .persistent(false)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
                let mut changes = Vec::new();
                for (key_id, before, after) in candidates {
                    let Some(account_id) = accounts.get(&key_id) else {
                        continue;
                    };
                    if after.is_null() {
                        sqlx::query("DELETE FROM key_grants WHERE key_id = $1")
                            .bind(&key_id)
                            .persistent(false)
                            .execute(&mut *tx)
                            .await?;
                    } else {
                        sqlx::query(
                            "INSERT INTO key_grants (key_id, granted, recorded_at)
                             VALUES ($1, $2, now())
                             ON CONFLICT (key_id)
                             DO UPDATE SET granted = excluded.granted, recorded_at = now()",
                        )
                        .bind(&key_id)
                        .bind(&after)
                        .persistent(false)
                        .execute(&mut *tx)
                        .await?;
                    }
                    let change = GrantChange {
                        key_id,
                        account_id: account_id.clone(),
                        before,
                        after,
                    };
                    append_in(&mut tx, &audited::grant_changed(&change, by)).await?;
                    changes.push(change);
                }
                tx.commit().await?;
                Ok(changes)
            })
            .await?;
        Ok(changes)
    }
}

/// Caches a lookup, first sweeping out the misses and the stale lookups once the cache holds
/// `sweep_above` of them.
fn remember(
    keys: &DashMap<KeyHash, (Instant, Lookup)>,
    hash: KeyHash,
    found: Lookup,
    sweep_above: usize,
) {
    if keys.len() >= sweep_above {
        keys.retain(|_, (at, found)| found.is_some() && at.elapsed() < STALE);
    }
    keys.insert(hash, (Instant::now(), found));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_unknown_keys_cannot_grow_the_lookup_cache_past_its_sweep_size() {
        let keys = DashMap::new();
        for i in 0..10_000u32 {
            remember(&keys, KeyHash::of(&i.to_string()), None, 100);
            assert!(keys.len() <= 100, "{} cached after {i}", keys.len());
        }
    }
}
