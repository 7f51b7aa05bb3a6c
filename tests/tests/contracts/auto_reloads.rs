//! The `AutoReloads` contract, kept alike by the in-process rules of standalone mode and the
//! Postgres ones every pod of a cluster sweeps: one reload per crossing of the threshold
//! whichever sweeps run, a retry under the same attempt, and declines that turn it off.

use std::sync::Arc;

use e2e::contract::actor;
use e2e::PostgresServer;
use futures::future::join_all;
use gateway_core::payments::reload::{
    AutoReloads, Due, MemoryAutoReloads, Outcome, PostgresAutoReloads, Rule, MAX_DECLINES,
};
use serde_json::json;
use store::accounts::{Accounts, MemoryAccounts, PostgresAccounts};
use store::audit::{Action, AuditLog, AuditQuery, PostgresAuditLog};
use store::ledger::fixtures::turn_record;
use store::ledger::{Ledger, MemoryLedger, NewReservation, PostgresLedger};

use super::{database, unique};

pub struct Store {
    reloads: Arc<dyn AutoReloads>,
    /// Where rule changes are audited.
    audit: Arc<dyn AuditLog>,
    ledger: Arc<dyn Ledger>,
    accounts: Arc<dyn Accounts>,
    _pg: Option<PostgresServer>,
}

async fn in_process() -> Store {
    let ledger = Arc::new(MemoryLedger::default());
    Store {
        reloads: Arc::new(MemoryAutoReloads::new(
            ledger.clone(),
            ledger.audit_log().clone(),
        )),
        audit: ledger.audit_log().clone(),
        accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
        ledger,
        _pg: None,
    }
}

async fn postgres() -> Store {
    let (pg, db) = database().await;
    let ledger = PostgresLedger::new(db.clone());
    ledger.heartbeat().await.expect("heartbeat");
    Store {
        reloads: Arc::new(PostgresAutoReloads::new(db.clone())),
        audit: Arc::new(PostgresAuditLog::new(db.clone())),
        accounts: Arc::new(PostgresAccounts::new(db)),
        ledger: Arc::new(ledger),
        _pg: Some(pg),
    }
}

const THRESHOLD: u64 = 1_000;
const RELOAD_CENTS: u64 = 500;
/// Auto-reload on, at the threshold, for the amount.
const RULE: Rule = Rule {
    enabled: true,
    threshold_credits: THRESHOLD,
    usd_cents: RELOAD_CENTS,
};

impl Store {
    /// An account holding `credits`, with a saved card and auto-reload on.
    async fn armed_account(&self, credits: u64) -> String {
        let account = self
            .accounts
            .create_account(&unique("reload"))
            .await
            .expect("account")
            .id;
        if credits > 0 {
            self.ledger
                .add_credits(&account, credits, &actor())
                .await
                .expect("add credits");
        }
        self.reloads
            .save_card(&account, "cus_contract", "pm_contract")
            .await
            .expect("card");
        assert!(self
            .reloads
            .configure(&account, RULE, &actor())
            .await
            .expect("configured"));
        account
    }

    /// The reloads this sweep started for `account_id` (other rules' accounts share the store).
    async fn due(&self, account_id: &str) -> Vec<Due> {
        self.reloads
            .due()
            .await
            .expect("sweep")
            .into_iter()
            .filter(|d| d.account_id == account_id)
            .collect()
    }

    /// Holds `credits` of the account's balance, as a running turn does.
    async fn hold(&self, account_id: &str, credits: u64) {
        let record = turn_record(&unique("msg"), account_id, &unique("key"));
        let held = self
            .ledger
            .reserve(NewReservation {
                record,
                spend_cap: None,
                min: credits,
                max: credits,
            })
            .await
            .expect("held");
        assert_eq!(held, credits);
    }
}

async fn a_rule_needs_a_saved_card(store: Store) {
    let account = store
        .accounts
        .create_account(&unique("reload"))
        .await
        .expect("account")
        .id;
    assert!(!store
        .reloads
        .configure(&account, RULE, &actor())
        .await
        .expect("answered"));
    let shown = store.reloads.settings(&account).await.expect("settings");
    assert!(!shown.card_saved && !shown.enabled);
    store
        .reloads
        .save_card(&account, "cus_contract", "pm_contract")
        .await
        .expect("card");
    assert!(store
        .reloads
        .configure(&account, RULE, &actor())
        .await
        .expect("configured"));
    let shown = store.reloads.settings(&account).await.expect("settings");
    assert!(shown.card_saved && shown.enabled);
    assert_eq!(
        (shown.threshold_credits, shown.usd_cents, shown.declines),
        (THRESHOLD, RELOAD_CENTS, 0)
    );
}

async fn a_balance_below_the_threshold_starts_one_reload_per_crossing(store: Store) {
    let account = store.armed_account(200).await;
    let due = store.due(&account).await;
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(
        (
            due[0].attempt,
            due[0].usd_cents,
            due[0].customer_id.as_str(),
            due[0].payment_method_id.as_str()
        ),
        (1, RELOAD_CENTS, "cus_contract", "pm_contract")
    );
    assert!(
        store.due(&account).await.is_empty(),
        "the crossing's reload has started"
    );
    store
        .reloads
        .finish(&due[0], &Outcome::Charged)
        .await
        .expect("finished");
    assert!(
        store.due(&account).await.is_empty(),
        "still below the threshold: the same crossing"
    );
    store
        .ledger
        .add_credits(&account, 2_000, &actor())
        .await
        .expect("credited");
    assert!(store.due(&account).await.is_empty(), "back above: re-armed");
    store.hold(&account, 1_500).await;
    let next = store.due(&account).await;
    assert_eq!(next.len(), 1, "credits held count: a new crossing");
    assert_eq!(next[0].attempt, 2);
    assert_ne!(next[0].reference(), due[0].reference());
}

async fn an_unreachable_charge_is_retried_under_the_same_attempt(store: Store) {
    let account = store.armed_account(0).await;
    let first = store.due(&account).await;
    assert_eq!(first.len(), 1);
    store
        .reloads
        .finish(&first[0], &Outcome::Unreachable("timed out".to_owned()))
        .await
        .expect("finished");
    let retry = store.due(&account).await;
    assert_eq!(retry.len(), 1, "retried at the next sweep");
    assert_eq!(
        retry[0].reference(),
        first[0].reference(),
        "the same charge"
    );
    let shown = store.reloads.settings(&account).await.expect("settings");
    assert_eq!(shown.last_failure.as_deref(), Some("timed out"));
    assert_eq!(shown.declines, 0);
}

async fn declines_in_a_row_turn_it_off_and_turning_it_on_again_clears_them(store: Store) {
    let account = store.armed_account(0).await;
    for n in 1..=MAX_DECLINES {
        let due = store.due(&account).await;
        assert_eq!(due.len(), 1, "attempt {n}");
        store
            .reloads
            .finish(&due[0], &Outcome::Declined("card declined".to_owned()))
            .await
            .expect("finished");
        let shown = store.reloads.settings(&account).await.expect("settings");
        assert_eq!(shown.declines, n);
        assert_eq!(shown.enabled, n < MAX_DECLINES);
    }
    assert!(store.due(&account).await.is_empty(), "turned off");
    assert!(store
        .reloads
        .configure(&account, RULE, &actor())
        .await
        .expect("configured"));
    let shown = store.reloads.settings(&account).await.expect("settings");
    assert_eq!(
        (shown.enabled, shown.declines, shown.last_failure),
        (true, 0, None)
    );
    assert_eq!(store.due(&account).await.len(), 1);
}

async fn sweeps_running_at_once_start_one_reload(store: Store) {
    let account = store.armed_account(0).await;
    let store = Arc::new(store);
    let sweeps = join_all((0..8).map(|_| {
        let (store, account) = (store.clone(), account.clone());
        async move { store.due(&account).await }
    }))
    .await;
    let started: usize = sweeps.iter().map(Vec::len).sum();
    assert_eq!(started, 1);
}

async fn a_rule_changed_is_audited_once_with_before_and_after_and_a_same_save_not(store: Store) {
    let account = store.armed_account(5_000).await;
    let off = Rule {
        enabled: false,
        ..RULE
    };
    for rule in [RULE, off, off] {
        assert!(store
            .reloads
            .configure(&account, rule, &actor())
            .await
            .expect("configured"));
    }
    let rows = store
        .audit
        .list(&AuditQuery {
            account_id: Some(account.clone()),
            action: Some(Action::AutoReloadChanged),
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .expect("listed");
    let changes: Vec<_> = rows
        .iter()
        .rev()
        .map(|r| {
            (
                r.entry.before["enabled"].clone(),
                r.entry.after["enabled"].clone(),
            )
        })
        .collect();
    // Off to on when armed, then on to off; saving the same rule again changed nothing.
    assert_eq!(
        changes,
        [(json!(false), json!(true)), (json!(true), json!(false))]
    );
    assert_eq!(rows[0].entry.after["threshold_credits"], THRESHOLD);
    assert_eq!(rows[0].entry.actor, actor());
}

e2e::contract! {
    fixtures { in_process, postgres }
    rules {
        a_rule_changed_is_audited_once_with_before_and_after_and_a_same_save_not,
        a_rule_needs_a_saved_card,
        a_balance_below_the_threshold_starts_one_reload_per_crossing,
        an_unreachable_charge_is_retried_under_the_same_attempt,
        declines_in_a_row_turn_it_off_and_turning_it_on_again_clears_them,
        sweeps_running_at_once_start_one_reload,
    }
}
