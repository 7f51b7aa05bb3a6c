//! The promotion sweep, on both account stores (Postgres and in-process): a key's tier moves
//! up to the highest tier its account's confirmed lifetime top-up reaches (free -> pay_as_you_go
//! from the first cent, -> high_volume from $500), never down, never out of enterprise; a
//! second sweep changes nothing.

use e2e::contract::actor;
use std::sync::Arc;
use std::time::Duration;

use e2e::PostgresServer;
use gateway_core::auth::{mint, KeySpec};
use store::accounts::{
    Accounts, KeyKind, MemoryAccounts, PostgresAccounts, Promotion, PromotionRules,
};
use store::db::Database;
use store::ledger::{Ledger, MemoryLedger, NewTopUp, PostgresLedger};

fn rules() -> PromotionRules {
    PromotionRules::new([
        ("free".to_owned(), 0),
        ("pay_as_you_go".to_owned(), 1),
        ("high_volume".to_owned(), 50_000),
    ])
}

async fn key(accounts: &dyn Accounts, account_id: &str, name: &str, tier: &str) -> String {
    let minted = mint(KeySpec {
        id: None,
        account_id: account_id.to_owned(),
        name: name.to_owned(),
        kind: KeyKind::Api,
        scopes: Vec::new(),
        tier: tier.to_owned(),
        secret: None,
        expires_at: None,
        spend_cap: None,
    });
    let id = minted.record.id.clone();
    accounts
        .insert_key(minted.record, &actor())
        .await
        .expect("insert key");
    id
}

/// Accounts with lifetime top-ups of $0, $10 and $600, keys on several tiers; two sweeps.
async fn sweep_twice(accounts: &dyn Accounts, ledger: &dyn Ledger) {
    let none = accounts
        .create_account("promo-none")
        .await
        .expect("account");
    let some = accounts
        .create_account("promo-some")
        .await
        .expect("account");
    let lots = accounts
        .create_account("promo-lots")
        .await
        .expect("account");
    for (account, cents, reference) in [(&some, 1_000, "promo-1"), (&lots, 60_000, "promo-2")] {
        ledger
            .top_up(NewTopUp {
                by: &actor(),
                account_id: &account.id,
                reference,
                usd_cents: cents,
                credits: cents * 1_000,
                payment_id: None,
            })
            .await
            .expect("top-up");
    }
    let unpaid = key(accounts, &none.id, "unpaid", "free").await;
    let first_top_up = key(accounts, &some.id, "first", "free").await;
    let already_higher = key(accounts, &some.id, "higher", "high_volume").await;
    let big_spender = key(accounts, &lots.id, "big", "free").await;
    let payg = key(accounts, &lots.id, "payg", "pay_as_you_go").await;
    let enterprise = key(accounts, &lots.id, "ent", "enterprise").await;

    let mut promoted = accounts
        .promote_tiers(&rules(), &actor())
        .await
        .expect("sweep");
    promoted.sort_by(|a, b| a.key_id.cmp(&b.key_id));
    let mut expected = vec![
        Promotion {
            key_id: first_top_up,
            account_id: some.id.clone(),
            from: "free".into(),
            to: "pay_as_you_go".into(),
        },
        Promotion {
            key_id: big_spender,
            account_id: lots.id.clone(),
            from: "free".into(),
            to: "high_volume".into(),
        },
        Promotion {
            key_id: payg,
            account_id: lots.id.clone(),
            from: "pay_as_you_go".into(),
            to: "high_volume".into(),
        },
    ];
    expected.sort_by(|a, b| a.key_id.cmp(&b.key_id));
    assert_eq!(promoted, expected);
    for untouched in [&unpaid, &already_higher, &enterprise] {
        assert!(promoted.iter().all(|p| &p.key_id != untouched));
    }
    let again = accounts
        .promote_tiers(&rules(), &actor())
        .await
        .expect("second sweep");
    assert_eq!(again, Vec::new(), "a second sweep changed something");
}

#[tokio::test]
async fn the_postgres_sweep_promotes_by_lifetime_top_up_only_upwards_and_once() {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 2, Duration::from_secs(5)).expect("url");
    db.migrate().await.expect("migrate");
    let accounts = PostgresAccounts::new(db.clone());
    let ledger = PostgresLedger::new(db);
    sweep_twice(&accounts, &ledger).await;
    let tiers = pg
        .query("SELECT string_agg(name || '=' || tier, ',' ORDER BY name) FROM api_keys")
        .await;
    assert_eq!(
        tiers,
        "big=high_volume,ent=enterprise,first=pay_as_you_go,higher=high_volume,payg=high_volume,unpaid=free"
    );
}

#[tokio::test]
async fn the_in_process_sweep_follows_the_same_rules() {
    let ledger = Arc::new(MemoryLedger::default());
    let accounts = MemoryAccounts::new(ledger.clone());
    sweep_twice(&accounts, ledger.as_ref()).await;
}
