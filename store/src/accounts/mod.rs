//! Accounts and their API keys. The store is a trait: in process for standalone, Postgres in
//! cluster mode; handlers never know which.

mod grants;
mod memory;
mod postgres;
pub mod promotion;

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use thiserror::Error;
use time::OffsetDateTime;

use crate::audit::Actor;

pub use grants::GrantChange;
pub use memory::MemoryAccounts;
pub use postgres::PostgresAccounts;
pub use promotion::{Promotion, PromotionRules};

/// The SHA-256 of a key's secret: what is stored and looked up instead of the secret. Keys
/// are 238-bit random secrets, so a fast hash is the right tool (a password hash would only
/// slow every request); compared in constant time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    pub fn of(secret: &str) -> Self {
        Self(Sha256::digest(secret.as_bytes()).into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// A stored hash; `None` when it is not 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

impl ConstantTimeEq for KeyHash {
    fn ct_eq(&self, other: &Self) -> subtle::Choice {
        self.0.ct_eq(&other.0)
    }
}

/// Why an account or a key was refused as [`StoreError::Conflict`], the same from both stores.
pub const NAME_TAKEN: &str = "name: an account with this name exists";
pub const KEY_TAKEN: &str = "key: a key with this id or secret exists";

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("account store unavailable: {0}")]
    Unavailable(String),
    /// A unique name or key is already taken.
    #[error("{0}")]
    Conflict(String),
}

impl From<crate::audit::AuditError> for StoreError {
    fn from(e: crate::audit::AuditError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<crate::db::DbError> for StoreError {
    fn from(e: crate::db::DbError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountStatus {
    Active,
    Suspended,
}

#[derive(Clone, Debug, Serialize)]
pub struct Account {
    pub id: String,
    pub name: String,
    pub status: AccountStatus,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// For the /v1 API.
    Api,
    /// For the service's command-line tool; refused on /v1.
    Cli,
}

#[derive(Clone, Debug, Serialize)]
pub struct KeyRecord {
    pub id: String,
    pub account_id: String,
    pub name: String,
    /// The first characters of the secret, safe to show.
    pub prefix: String,
    pub kind: KeyKind,
    /// Empty: every surface.
    pub scopes: Vec<String>,
    pub tier: String,
    pub revoked: bool,
    #[serde(skip)]
    pub hash: KeyHash,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// From then on the key is refused (401).
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// Credits the key may spend per UTC month.
    pub spend_cap: Option<u64>,
    /// The dashboard user who created it; `None` for keys of the admin API, the CLI, the
    /// manifests, and of before organizations. A developer sees only their own.
    pub created_by: Option<String>,
}

impl KeyRecord {
    pub fn expired(&self, now: OffsetDateTime) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

#[async_trait]
pub trait Accounts: Send + Sync {
    async fn create_account(&self, name: &str) -> Result<Account, StoreError>;
    async fn account(&self, id: &str) -> Result<Option<Account>, StoreError>;
    async fn account_by_name(&self, name: &str) -> Result<Option<Account>, StoreError>;
    /// Sets the account's status; a change is audited as `by`'s.
    async fn set_status(
        &self,
        id: &str,
        status: AccountStatus,
        by: &Actor,
    ) -> Result<Option<Account>, StoreError>;
    /// Stores a new key, audited as `by`'s.
    async fn insert_key(&self, key: KeyRecord, by: &Actor) -> Result<(), StoreError>;
    /// The key with this hash and its account, revoked keys included.
    async fn key_by_hash(&self, hash: &KeyHash)
        -> Result<Option<(KeyRecord, Account)>, StoreError>;
    /// What [`key_by_hash`](Self::key_by_hash) would answer, when this process knows it without
    /// asking the database (a lookup still fresh in its cache, or an in-process store); `None`
    /// when only the database can tell. Costs a map lookup: the key-guessing brake answers a
    /// braked address with it.
    fn cached_key_by_hash(&self, hash: &KeyHash) -> Option<Option<(KeyRecord, Account)>>;
    /// Revokes the key; the first revocation is audited as `by`'s.
    async fn revoke_key(&self, id: &str, by: &Actor) -> Result<Option<KeyRecord>, StoreError>;
    /// The account's keys, revoked ones included, newest first.
    async fn keys_of(&self, account_id: &str) -> Result<Vec<KeyRecord>, StoreError>;
    /// Moves keys up to the tier their account's confirmed lifetime top-up reaches, never
    /// down, never out of a tier the rules do not list; a second run changes nothing. Each
    /// move is audited as `by`'s (the sweep).
    async fn promote_tiers(
        &self,
        rules: &PromotionRules,
        by: &Actor,
    ) -> Result<Vec<Promotion>, StoreError>;
    /// Records what the ApiKey resources grant (key id to its grant, never a secret): each
    /// grant that differs from the one last recorded for its key (new, changed, or withdrawn:
    /// absent from `grants`) is kept and audited as `by`'s, in one transaction. A key the store
    /// does not know is left for a later call (its grant takes effect once it is minted, and
    /// is audited then). A second call with the same grants changes nothing.
    async fn record_key_grants(
        &self,
        grants: &BTreeMap<String, Value>,
        by: &Actor,
    ) -> Result<Vec<GrantChange>, StoreError>;
}

/// The audit rows of the account store's changes, the same from both stores.
mod audited {
    use serde_json::{json, Value};

    use super::{Account, AccountStatus, GrantChange, KeyRecord, Promotion};
    use crate::audit::{Action, Actor, AuditEntry};

    fn entry(by: &Actor, account_id: &str, action: Action, target: &str) -> AuditEntry {
        AuditEntry {
            actor: by.clone(),
            account_id: account_id.to_owned(),
            action,
            target: target.to_owned(),
            before: Value::Null,
            after: Value::Null,
        }
    }

    pub fn key_created(key: &KeyRecord, by: &Actor) -> AuditEntry {
        AuditEntry {
            after: json!({
                "name": key.name,
                "kind": key.kind,
                "scopes": key.scopes,
                "tier": key.tier,
                "expires_at": key.expires_at.map(|at| at.unix_timestamp()),
                "spend_cap": key.spend_cap,
            }),
            ..entry(by, &key.account_id, Action::KeyCreated, &key.id)
        }
    }

    pub fn key_revoked(key: &KeyRecord, by: &Actor) -> AuditEntry {
        AuditEntry {
            before: json!({ "revoked": false }),
            after: json!({ "revoked": true }),
            ..entry(by, &key.account_id, Action::KeyRevoked, &key.id)
        }
    }

    pub fn status_set(account: &Account, was: AccountStatus, by: &Actor) -> AuditEntry {
        let action = match account.status {
            AccountStatus::Suspended => Action::AccountSuspended,
            AccountStatus::Active => Action::AccountResumed,
        };
        AuditEntry {
            before: json!({ "status": was }),
            after: json!({ "status": account.status }),
            ..entry(by, &account.id, action, &account.id)
        }
    }

    pub fn grant_changed(change: &GrantChange, by: &Actor) -> AuditEntry {
        AuditEntry {
            before: change.before.clone(),
            after: change.after.clone(),
            ..entry(
                by,
                &change.account_id,
                Action::KeyGrantChanged,
                &change.key_id,
            )
        }
    }

    pub fn promoted(promotion: &Promotion, by: &Actor) -> AuditEntry {
        AuditEntry {
            before: json!({ "tier": promotion.from }),
            after: json!({ "tier": promotion.to }),
            ..entry(
                by,
                &promotion.account_id,
                Action::TierPromoted,
                &promotion.key_id,
            )
        }
    }
}
