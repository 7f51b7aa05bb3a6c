//! The `Accounts` contract, kept alike by the in-process store of standalone mode and the
//! Postgres one of cluster mode: accounts by id and by name, keys by the hash of their secret,
//! revocation, and the promotion sweep.

use e2e::contract::actor;
use std::sync::Arc;

use e2e::PostgresServer;
use store::accounts::{
    Account, AccountStatus, Accounts, KeyHash, KeyRecord, MemoryAccounts, PostgresAccounts,
    PromotionRules, StoreError,
};
use store::ledger::{Ledger, MemoryLedger, NewTopUp};

use super::{database, key_record as key, unique};

pub struct Store {
    accounts: Arc<dyn Accounts>,
    /// Where top-ups land, which the promotion sweep reads.
    ledger: Arc<dyn Ledger>,
    _pg: Option<PostgresServer>,
}

impl Store {
    /// A new account of its own.
    async fn account(&self) -> Account {
        self.accounts
            .create_account(&unique("acme"))
            .await
            .expect("created")
    }

    // Lookups the rules expect to answer; `None` is "not found".
    async fn account_by_id(&self, id: &str) -> Option<Account> {
        self.accounts.account(id).await.expect("lookup")
    }

    async fn account_named(&self, name: &str) -> Option<Account> {
        self.accounts.account_by_name(name).await.expect("lookup")
    }

    async fn key_by_hash(&self, hash: &KeyHash) -> Option<(KeyRecord, Account)> {
        self.accounts.key_by_hash(hash).await.expect("lookup")
    }
}

async fn in_process() -> Store {
    let ledger = Arc::new(MemoryLedger::default());
    Store {
        accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
        ledger,
        _pg: None,
    }
}

async fn postgres() -> Store {
    let (pg, db) = database().await;
    Store {
        accounts: Arc::new(PostgresAccounts::new(db.clone())),
        ledger: Arc::new(store::ledger::PostgresLedger::new(db)),
        _pg: Some(pg),
    }
}

fn rules() -> PromotionRules {
    PromotionRules::new([
        ("free".to_owned(), 0),
        ("tier1".to_owned(), 500),
        ("tier2".to_owned(), 5_000),
    ])
}

async fn top_up(store: &Store, account_id: &str, usd_cents: u64) {
    store
        .ledger
        .top_up(NewTopUp {
            by: &actor(),
            account_id,
            reference: &unique("pay"),
            usd_cents,
            credits: usd_cents * 1_000,
            payment_id: None,
        })
        .await
        .expect("top-up");
}

async fn an_account_is_found_by_id_and_by_name_and_a_taken_name_is_refused(store: Store) {
    let name = unique("acme");
    let account = store.accounts.create_account(&name).await.expect("created");
    assert_eq!(
        (account.name.as_str(), account.status),
        (name.as_str(), AccountStatus::Active)
    );
    let by_id = store.account_by_id(&account.id).await.expect("found by id");
    assert_eq!(by_id.name, name);
    let by_name = store.account_named(&name).await.expect("found by name");
    assert_eq!(by_name.id, account.id);
    assert!(matches!(
        store.accounts.create_account(&name).await,
        Err(StoreError::Conflict(_))
    ));
    let still = store.account_named(&name).await.expect("found by name");
    assert_eq!(
        still.id, account.id,
        "the refused account took nothing over"
    );
    assert!(store.account_by_id(&unique("acct")).await.is_none());
    assert!(store.account_named(&unique("nobody")).await.is_none());
}

async fn a_suspended_account_is_suspended_on_its_keys_lookups(store: Store) {
    let account = store.account().await;
    let (record, secret) = key(&account.id, "free", 0);
    store
        .accounts
        .insert_key(record, &actor())
        .await
        .expect("key");
    let hash = KeyHash::of(&secret);
    let (_, owner) = store.key_by_hash(&hash).await.expect("found");
    assert_eq!(owner.status, AccountStatus::Active);
    let suspended = store
        .accounts
        .set_status(&account.id, AccountStatus::Suspended, &actor())
        .await
        .expect("set")
        .expect("the account");
    assert_eq!(suspended.status, AccountStatus::Suspended);
    let (_, owner) = store.key_by_hash(&hash).await.expect("found");
    assert_eq!(owner.status, AccountStatus::Suspended);
    assert!(store
        .accounts
        .set_status(&unique("acct"), AccountStatus::Suspended, &actor())
        .await
        .expect("set")
        .is_none());
}

async fn a_key_is_found_by_the_hash_of_its_secret_revoked_or_not(store: Store) {
    let account = store.account().await;
    let (record, secret) = key(&account.id, "tier1", 0);
    store
        .accounts
        .insert_key(record.clone(), &actor())
        .await
        .expect("inserted");
    let (found, owner) = store
        .key_by_hash(&KeyHash::of(&secret))
        .await
        .expect("found");
    assert_eq!(owner.id, account.id);
    assert_eq!(
        (
            &found.id,
            &found.name,
            &found.prefix,
            found.kind,
            &found.scopes,
            &found.tier,
            found.revoked,
            found.created_at,
            found.expires_at,
            found.spend_cap
        ),
        (
            &record.id,
            &record.name,
            &record.prefix,
            record.kind,
            &record.scopes,
            &record.tier,
            false,
            record.created_at,
            record.expires_at,
            record.spend_cap
        )
    );
    assert!(found.hash == record.hash);
    let revoked = store
        .accounts
        .revoke_key(&record.id, &actor())
        .await
        .expect("revoke")
        .expect("the key");
    assert!(revoked.revoked);
    let (found, _) = store
        .key_by_hash(&KeyHash::of(&secret))
        .await
        .expect("a revoked key is still found, to be refused by name");
    assert!(found.revoked);
    assert!(store
        .key_by_hash(&KeyHash::of("sk-svc-never-issued"))
        .await
        .is_none());
    assert!(store
        .accounts
        .revoke_key(&unique("key"), &actor())
        .await
        .expect("revoke")
        .is_none());
}

/// What the key-guessing brake relies on: the cached lookup answers what the lookup answered
/// (a fresh lookup, found or not, is cached), or nothing; never a stale revocation.
async fn a_cached_key_lookup_answers_as_the_lookup_did_or_not_at_all(store: Store) {
    let account = store.account().await;
    let (record, secret) = key(&account.id, "tier1", 0);
    store
        .accounts
        .insert_key(record.clone(), &actor())
        .await
        .expect("inserted");
    let hash = KeyHash::of(&secret);
    let unknown = KeyHash::of(&unique("sk-svc-never-issued"));
    let ids = |found: Option<(KeyRecord, Account)>| found.map(|(k, a)| (k.id, a.id));
    let expected = Some((record.id.clone(), account.id.clone()));
    if let Some(found) = store.accounts.cached_key_by_hash(&hash) {
        assert_eq!(ids(found), expected, "answered before any lookup");
    }
    store.key_by_hash(&hash).await.expect("found");
    assert!(store.key_by_hash(&unknown).await.is_none());
    let cached = store
        .accounts
        .cached_key_by_hash(&hash)
        .expect("a fresh lookup is cached");
    assert_eq!(ids(cached), expected);
    assert!(store
        .accounts
        .cached_key_by_hash(&unknown)
        .expect("a fresh miss is cached")
        .is_none());
    store
        .accounts
        .revoke_key(&record.id, &actor())
        .await
        .expect("revoke");
    if let Some(found) = store.accounts.cached_key_by_hash(&hash) {
        assert!(found.expect("still found").0.revoked, "revoked here");
    }
}

async fn a_key_whose_id_or_secret_is_taken_is_refused(store: Store) {
    let account = store.account().await;
    let (first, secret) = key(&account.id, "free", 0);
    store
        .accounts
        .insert_key(first.clone(), &actor())
        .await
        .expect("inserted");
    let (mut same_id, _) = key(&account.id, "tier2", 0);
    same_id.id.clone_from(&first.id);
    assert!(matches!(
        store.accounts.insert_key(same_id, &actor()).await,
        Err(StoreError::Conflict(_))
    ));
    let (mut same_secret, _) = key(&account.id, "tier2", 0);
    same_secret.hash = first.hash;
    assert!(matches!(
        store.accounts.insert_key(same_secret, &actor()).await,
        Err(StoreError::Conflict(_))
    ));
    let (found, _) = store
        .key_by_hash(&KeyHash::of(&secret))
        .await
        .expect("found");
    assert_eq!(
        (found.id, found.tier),
        (first.id, first.tier),
        "the refused keys changed nothing"
    );
    let keys = store.accounts.keys_of(&account.id).await.expect("keys");
    assert_eq!(keys.len(), 1);
}

async fn an_accounts_keys_are_listed_newest_first_revoked_ones_included(store: Store) {
    let account = store.account().await;
    let other = store.account().await;
    let mut ids = Vec::new();
    for minutes_ago in [30, 10, 20] {
        let (record, _) = key(&account.id, "free", minutes_ago);
        ids.push((minutes_ago, record.id.clone()));
        store
            .accounts
            .insert_key(record, &actor())
            .await
            .expect("inserted");
    }
    let (theirs, _) = key(&other.id, "free", 0);
    store
        .accounts
        .insert_key(theirs, &actor())
        .await
        .expect("inserted");
    store
        .accounts
        .revoke_key(&ids[0].1, &actor())
        .await
        .expect("revoke")
        .expect("the key");
    ids.sort();
    let expected: Vec<String> = ids.into_iter().map(|(_, id)| id).collect();
    let listed: Vec<String> = store
        .accounts
        .keys_of(&account.id)
        .await
        .expect("keys")
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(listed, expected);
}

async fn promotion_moves_live_keys_up_to_the_tier_their_lifetime_top_up_reaches_once(store: Store) {
    let account = store.account().await;
    let (free, _) = key(&account.id, "free", 0);
    let (revoked, _) = key(&account.id, "free", 0);
    let (enterprise, _) = key(&account.id, "enterprise", 0);
    let (higher, _) = key(&account.id, "tier2", 0);
    for k in [&free, &revoked, &enterprise, &higher] {
        store
            .accounts
            .insert_key(k.clone(), &actor())
            .await
            .expect("inserted");
    }
    store
        .accounts
        .revoke_key(&revoked.id, &actor())
        .await
        .expect("revoke")
        .expect("the key");
    let untouched = store.account().await;
    let (poor, _) = key(&untouched.id, "free", 0);
    store
        .accounts
        .insert_key(poor.clone(), &actor())
        .await
        .expect("inserted");

    assert!(
        store
            .accounts
            .promote_tiers(&rules(), &actor())
            .await
            .expect("sweep")
            .is_empty(),
        "no top-up, no move"
    );
    top_up(&store, &account.id, 600).await;
    let promotions = store
        .accounts
        .promote_tiers(&rules(), &actor())
        .await
        .expect("sweep");
    assert_eq!(promotions.len(), 1, "{promotions:?}");
    assert_eq!(
        (
            promotions[0].key_id.as_str(),
            promotions[0].account_id.as_str(),
            promotions[0].from.as_str(),
            promotions[0].to.as_str()
        ),
        (free.id.as_str(), account.id.as_str(), "free", "tier1")
    );
    assert!(
        store
            .accounts
            .promote_tiers(&rules(), &actor())
            .await
            .expect("sweep")
            .is_empty(),
        "a second sweep changes nothing"
    );
    let tiers: Vec<(String, String)> = store
        .accounts
        .keys_of(&account.id)
        .await
        .expect("keys")
        .into_iter()
        .map(|k| (k.id, k.tier))
        .collect();
    for (id, tier) in [
        (&free.id, "tier1"),
        (&revoked.id, "free"),
        (&enterprise.id, "enterprise"),
        (&higher.id, "tier2"),
    ] {
        assert!(
            tiers.contains(&(id.clone(), tier.to_owned())),
            "{id} should be in {tier}: {tiers:?}"
        );
    }
    let poor_now = store.accounts.keys_of(&untouched.id).await.expect("keys");
    assert_eq!(poor_now[0].tier, "free");
}

e2e::contract! {
    fixtures { in_process, postgres }
    rules {
        an_account_is_found_by_id_and_by_name_and_a_taken_name_is_refused,
        a_suspended_account_is_suspended_on_its_keys_lookups,
        a_key_is_found_by_the_hash_of_its_secret_revoked_or_not,
        a_cached_key_lookup_answers_as_the_lookup_did_or_not_at_all,
        a_key_whose_id_or_secret_is_taken_is_refused,
        an_accounts_keys_are_listed_newest_first_revoked_ones_included,
        promotion_moves_live_keys_up_to_the_tier_their_lifetime_top_up_reaches_once,
    }
}
