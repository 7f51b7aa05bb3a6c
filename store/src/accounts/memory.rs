//! The in-process account store of standalone mode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dashmap::DashMap;
use serde_json::Value;
use time::OffsetDateTime;

use super::{
    audited, grants, Account, AccountStatus, Accounts, GrantChange, KeyRecord, Promotion,
    PromotionRules, StoreError, KEY_TAKEN, NAME_TAKEN,
};
use crate::accounts::KeyHash;
use crate::audit::Actor;
use crate::ids;
use crate::ledger::MemoryLedger;

pub struct MemoryAccounts {
    accounts: DashMap<String, Account>,
    names: DashMap<String, String>,
    keys: DashMap<String, KeyRecord>,
    by_hash: DashMap<KeyHash, String>,
    /// The ApiKey resources' grants as last recorded, by key id.
    grants: Mutex<BTreeMap<String, Value>>,
    /// Where the lifetime top-ups that drive promotions are kept, and the audit log.
    ledger: Arc<MemoryLedger>,
}

impl MemoryAccounts {
    pub fn new(ledger: Arc<MemoryLedger>) -> Self {
        Self {
            accounts: DashMap::new(),
            names: DashMap::new(),
            keys: DashMap::new(),
            by_hash: DashMap::new(),
            grants: Mutex::new(BTreeMap::new()),
            ledger,
        }
    }

    fn lookup(&self, hash: &KeyHash) -> Option<(KeyRecord, Account)> {
        let id = self.by_hash.get(hash).map(|id| id.clone())?;
        let key = self.keys.get(&id).map(|k| k.clone())?;
        self.accounts.get(&key.account_id).map(|a| (key, a.clone()))
    }
}

#[async_trait]
impl Accounts for MemoryAccounts {
    async fn create_account(&self, name: &str) -> Result<Account, StoreError> {
        let account = Account {
            id: ids::account(),
            name: name.to_owned(),
            status: AccountStatus::Active,
            created_at: OffsetDateTime::now_utc(),
        };
        match self.names.entry(name.to_owned()) {
            dashmap::Entry::Occupied(_) => {
                return Err(StoreError::Conflict(NAME_TAKEN.to_owned()));
            }
            dashmap::Entry::Vacant(slot) => {
                slot.insert(account.id.clone());
            }
        }
        self.accounts.insert(account.id.clone(), account.clone());
        Ok(account)
    }

    async fn account(&self, id: &str) -> Result<Option<Account>, StoreError> {
        Ok(self.accounts.get(id).map(|a| a.clone()))
    }

    async fn account_by_name(&self, name: &str) -> Result<Option<Account>, StoreError> {
        let Some(id) = self.names.get(name).map(|id| id.clone()) else {
            return Ok(None);
        };
        self.account(&id).await
    }

    async fn set_status(
        &self,
        id: &str,
        status: AccountStatus,
        by: &Actor,
    ) -> Result<Option<Account>, StoreError> {
        Ok(self.accounts.get_mut(id).map(|mut a| {
            let was = std::mem::replace(&mut a.status, status);
            if was != status {
                self.ledger
                    .audit_log()
                    .append(audited::status_set(&a, was, by));
            }
            a.clone()
        }))
    }

    async fn insert_key(&self, key: KeyRecord, by: &Actor) -> Result<(), StoreError> {
        // The hash's entry first, then the id's, in every caller: both are held together so
        // that a refused key changes neither.
        let dashmap::Entry::Vacant(by_hash) = self.by_hash.entry(key.hash) else {
            return Err(StoreError::Conflict(KEY_TAKEN.to_owned()));
        };
        let dashmap::Entry::Vacant(by_id) = self.keys.entry(key.id.clone()) else {
            return Err(StoreError::Conflict(KEY_TAKEN.to_owned()));
        };
        self.ledger
            .audit_log()
            .append(audited::key_created(&key, by));
        by_hash.insert(key.id.clone());
        by_id.insert(key);
        Ok(())
    }

    async fn key_by_hash(
        &self,
        hash: &KeyHash,
    ) -> Result<Option<(KeyRecord, Account)>, StoreError> {
        Ok(self.lookup(hash))
    }

    fn cached_key_by_hash(&self, hash: &KeyHash) -> Option<Option<(KeyRecord, Account)>> {
        Some(self.lookup(hash))
    }

    async fn revoke_key(&self, id: &str, by: &Actor) -> Result<Option<KeyRecord>, StoreError> {
        Ok(self.keys.get_mut(id).map(|mut k| {
            if !std::mem::replace(&mut k.revoked, true) {
                self.ledger.audit_log().append(audited::key_revoked(&k, by));
            }
            k.clone()
        }))
    }

    async fn keys_of(&self, account_id: &str) -> Result<Vec<KeyRecord>, StoreError> {
        let mut keys: Vec<KeyRecord> = self
            .keys
            .iter()
            .filter(|k| k.account_id == account_id)
            .map(|k| k.clone())
            .collect();
        keys.sort_by_key(|x| std::cmp::Reverse(x.created_at));
        Ok(keys)
    }

    async fn promote_tiers(
        &self,
        rules: &PromotionRules,
        by: &Actor,
    ) -> Result<Vec<Promotion>, StoreError> {
        let mut promotions = Vec::new();
        for mut key in self.keys.iter_mut() {
            if key.revoked {
                continue;
            }
            let lifetime = self.ledger.lifetime_top_up_cents(&key.account_id);
            if let Some(to) = rules.target(&key.tier, lifetime) {
                let promotion = Promotion {
                    key_id: key.id.clone(),
                    account_id: key.account_id.clone(),
                    from: std::mem::replace(&mut key.tier, to.to_owned()),
                    to: to.to_owned(),
                };
                self.ledger
                    .audit_log()
                    .append(audited::promoted(&promotion, by));
                promotions.push(promotion);
            }
        }
        Ok(promotions)
    }

    async fn record_key_grants(
        &self,
        grants: &BTreeMap<String, Value>,
        by: &Actor,
    ) -> Result<Vec<GrantChange>, StoreError> {
        let mut recorded = self
            .grants
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut changes = Vec::new();
        for (key_id, before, after) in grants::changed(&recorded, grants) {
            let Some(account_id) = self.keys.get(&key_id).map(|k| k.account_id.clone()) else {
                continue;
            };
            if after.is_null() {
                recorded.remove(&key_id);
            } else {
                recorded.insert(key_id.clone(), after.clone());
            }
            let change = GrantChange {
                key_id,
                account_id,
                before,
                after,
            };
            self.ledger
                .audit_log()
                .append(audited::grant_changed(&change, by));
            changes.push(change);
        }
        Ok(changes)
    }
}
