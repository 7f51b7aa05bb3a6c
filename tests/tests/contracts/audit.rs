//! The `AuditLog` contract, kept alike by the in-process log of standalone mode and the
//! Postgres one of cluster mode: every change a store makes leaves exactly one row naming its
//! actor, what it changed and how; a change that changes nothing (a replay, a second
//! revocation) or is refused leaves none; the rows are listed newest first, filtered and paged.

use std::sync::Arc;

use e2e::contract::actor;
use e2e::PostgresServer;
use serde_json::json;
use store::accounts::{AccountStatus, Accounts, KeyHash, MemoryAccounts, PostgresAccounts};
use store::audit::{Action, Actor, ActorKind, AuditLog, AuditQuery, AuditRecord, PostgresAuditLog};
use store::developers::{
    DeveloperStore, EmailVerification, MemoryDeveloperStore, PostgresDeveloperStore, Session,
    SignInMethod, User,
};
use store::ledger::{DisputeStage, Ledger, MemoryLedger, NewTopUp, PostgresLedger};
use time::Duration;

use super::{database, key_record as key, now, unique};

pub struct Store {
    audit: Arc<dyn AuditLog>,
    accounts: Arc<dyn Accounts>,
    ledger: Arc<dyn Ledger>,
    developers: Arc<dyn DeveloperStore>,
    _pg: Option<PostgresServer>,
}

async fn in_process() -> Store {
    let ledger = Arc::new(MemoryLedger::default());
    let audit = ledger.audit_log().clone();
    Store {
        developers: Arc::new(MemoryDeveloperStore::new(audit.clone())),
        audit,
        accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
        ledger,
        _pg: None,
    }
}

async fn postgres() -> Store {
    let (pg, db) = database().await;
    Store {
        audit: Arc::new(PostgresAuditLog::new(db.clone())),
        accounts: Arc::new(PostgresAccounts::new(db.clone())),
        ledger: Arc::new(PostgresLedger::new(db.clone())),
        developers: Arc::new(PostgresDeveloperStore::new(db)),
        _pg: Some(pg),
    }
}

/// The admin API's holder from a documentation address.
fn admin() -> Actor {
    Actor::new(ActorKind::AdminToken, "admin", Some("192.0.2.7".to_owned()))
}

impl Store {
    async fn account(&self) -> String {
        self.accounts
            .create_account(&unique("audited"))
            .await
            .expect("account")
            .id
    }

    /// The account's rows, newest first.
    async fn rows_of(&self, account_id: &str) -> Vec<AuditRecord> {
        self.list(AuditQuery {
            account_id: Some(account_id.to_owned()),
            limit: 100,
            ..AuditQuery::default()
        })
        .await
    }

    async fn list(&self, query: AuditQuery) -> Vec<AuditRecord> {
        self.audit.list(&query).await.expect("listed")
    }

    async fn top_up(&self, account_id: &str, reference: &str, payment_id: &str) {
        let by = Actor::new(ActorKind::StripeWebhook, "evt_1", None);
        self.ledger
            .top_up(NewTopUp {
                account_id,
                reference,
                usd_cents: 2_000,
                credits: 2_000_000,
                payment_id: Some(payment_id),
                by: &by,
            })
            .await
            .expect("top-up");
    }
}

/// (action, actor kind, target) of each row, oldest first.
fn summary(rows: &[AuditRecord]) -> Vec<(Action, ActorKind, String)> {
    rows.iter()
        .rev()
        .map(|r| (r.entry.action, r.entry.actor.kind, r.entry.target.clone()))
        .collect()
}

async fn each_key_and_status_change_leaves_one_row_and_a_repeat_none(store: Store) {
    let account = store.account().await;
    let (record, _) = key(&account, "free", 0);
    let key_id = record.id.clone();
    store
        .accounts
        .insert_key(record, &admin())
        .await
        .expect("key");
    for _ in 0..2 {
        store
            .accounts
            .revoke_key(&key_id, &admin())
            .await
            .expect("revoked")
            .expect("the key");
        store
            .accounts
            .set_status(&account, AccountStatus::Suspended, &admin())
            .await
            .expect("suspended");
    }
    let rows = store.rows_of(&account).await;
    assert_eq!(
        summary(&rows),
        [
            (Action::KeyCreated, ActorKind::AdminToken, key_id.clone()),
            (Action::KeyRevoked, ActorKind::AdminToken, key_id.clone()),
            (
                Action::AccountSuspended,
                ActorKind::AdminToken,
                account.clone()
            ),
        ]
    );
    let [suspended, revoked, created] = &rows[..] else {
        panic!("three rows: {rows:?}");
    };
    assert_eq!(created.entry.actor, admin());
    assert_eq!(created.entry.before, json!(null));
    assert_eq!(created.entry.after["tier"], "free");
    assert_eq!(created.entry.after["spend_cap"], 5_000);
    assert_eq!(
        (&revoked.entry.before, &revoked.entry.after),
        (&json!({ "revoked": false }), &json!({ "revoked": true }))
    );
    assert_eq!(
        (&suspended.entry.before, &suspended.entry.after),
        (
            &json!({ "status": "active" }),
            &json!({ "status": "suspended" })
        )
    );
    assert!(suspended.id > revoked.id && revoked.id > created.id);
}

async fn a_refused_change_leaves_no_row(store: Store) {
    let account = store.account().await;
    let (record, _) = key(&account, "free", 0);
    store
        .accounts
        .insert_key(record.clone(), &admin())
        .await
        .expect("key");
    let taken = store::accounts::KeyRecord {
        hash: KeyHash::of(&unique("another-secret")),
        ..record
    };
    assert!(store.accounts.insert_key(taken, &admin()).await.is_err());
    assert_eq!(store.rows_of(&account).await.len(), 1, "only the first key");
}

async fn a_top_up_its_refunds_and_its_dispute_leave_one_row_per_movement(store: Store) {
    let account = store.account().await;
    let payment = unique("pi");
    let reference = unique("pay");
    // Replays of each event change nothing, and leave nothing.
    for _ in 0..2 {
        store.top_up(&account, &reference, &payment).await;
        store
            .ledger
            .refund(&payment, 500, &actor())
            .await
            .expect("refunded");
        store
            .ledger
            .dispute("dp_audit", &payment, 1_000, DisputeStage::Opened, &actor())
            .await
            .expect("disputed");
    }
    let rows = store.rows_of(&account).await;
    assert_eq!(
        summary(&rows),
        [
            (Action::TopUp, ActorKind::StripeWebhook, reference.clone()),
            (Action::Refund, ActorKind::Cli, payment.clone()),
            (Action::Dispute, ActorKind::Cli, "dp_audit".to_owned()),
        ]
    );
    let [dispute, refund, top_up] = &rows[..] else {
        panic!("three rows: {rows:?}");
    };
    assert_eq!(top_up.entry.actor.id, "evt_1");
    assert_eq!(top_up.entry.after["usd_cents"], 2_000);
    assert_eq!(top_up.entry.after["payment_id"], payment.as_str());
    assert_eq!(refund.entry.before, json!({ "refunded_cents": 0 }));
    assert_eq!(refund.entry.after["refunded_cents"], 500);
    assert_eq!(refund.entry.after["credits"], 500_000);
    assert_eq!(dispute.entry.before, json!({ "status": null }));
    assert_eq!(dispute.entry.after["status"], "open");
    assert_eq!(dispute.entry.after["usd_cents"], 1_000);
}

async fn a_users_sign_up_verification_sign_ins_and_sign_outs_are_rows_of_its_account_once_each(
    store: Store,
) {
    let account = store.account().await;
    let user = User {
        id: unique("user"),
        email: format!("{}@example.com", unique("audited")),
        password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".to_owned(),
        account_id: account.clone(),
        created_at: now(),
        email_verified_at: None,
        role: store::developers::Role::Owner,
    };
    let client = Some("198.51.100.4".to_owned());
    let from = Actor::new(ActorKind::DashboardUser, &user.email, client.clone());
    let developers = &store.developers;
    assert!(developers
        .insert_user(user.clone(), &from)
        .await
        .expect("user"));
    let again = User {
        id: unique("user"),
        ..user.clone()
    };
    assert!(
        !developers
            .insert_user(again, &from)
            .await
            .expect("answered"),
        "the email is taken"
    );
    let token = unique("link");
    developers
        .insert_email_verification(EmailVerification {
            token_hash: KeyHash::of(&token),
            user_id: user.id.clone(),
            password_hash: user.password_hash.clone(),
            expires_at: now() + Duration::hours(1),
        })
        .await
        .expect("link");
    for _ in 0..2 {
        developers
            .verify_email(&KeyHash::of(&token), client.clone())
            .await
            .expect("answered");
    }
    developers
        .audit_refused_sign_in(&user, &from)
        .await
        .expect("audited");
    let session = |token: &str| Session {
        token_hash: KeyHash::of(token),
        user_id: user.id.clone(),
        email: user.email.clone(),
        account_id: account.clone(),
        role: user.role,
        email_verified: true,
        csrf: unique("csrf"),
        expires_at: now() + Duration::hours(1),
        last_used_at: now(),
    };
    let first = session(&unique("token"));
    developers
        .insert_session(first.clone(), SignInMethod::Password, &from)
        .await
        .expect("session");
    for _ in 0..2 {
        developers
            .sign_out(&first, &from)
            .await
            .expect("signed out");
    }
    let second = session(&unique("token"));
    developers
        .insert_session(second.clone(), SignInMethod::Password, &from)
        .await
        .expect("session");
    developers
        .end_all_sessions(&second, &from)
        .await
        .expect("signed out everywhere");
    let rows = store.rows_of(&account).await;
    let by_user = |action| (action, ActorKind::DashboardUser, user.email.clone());
    assert_eq!(
        summary(&rows),
        [
            by_user(Action::SignedUp),
            by_user(Action::EmailVerified),
            by_user(Action::SignInFailed),
            by_user(Action::SignIn),
            by_user(Action::SignedOut),
            by_user(Action::SignIn),
            by_user(Action::SignedOutEverywhere),
        ],
        "one row each; the taken email, the used link and the second sign-out none"
    );
    assert!(rows.iter().all(|r| r.entry.actor == from));
}

async fn rows_are_listed_newest_first_by_filter_and_page(store: Store) {
    let (one, two) = (store.account().await, store.account().await);
    let mut keys = Vec::new();
    for account in [&one, &two, &one] {
        let (record, _) = key(account, "free", 0);
        keys.push(record.id.clone());
        store
            .accounts
            .insert_key(record, &admin())
            .await
            .expect("key");
    }
    store
        .accounts
        .revoke_key(&keys[0], &actor())
        .await
        .expect("revoked");
    let of_one = store.rows_of(&one).await;
    assert_eq!(
        summary(&of_one),
        [
            (Action::KeyCreated, ActorKind::AdminToken, keys[0].clone()),
            (Action::KeyCreated, ActorKind::AdminToken, keys[2].clone()),
            (Action::KeyRevoked, ActorKind::Cli, keys[0].clone()),
        ]
    );
    let only = |query: AuditQuery| AuditQuery {
        account_id: Some(one.clone()),
        limit: 100,
        ..query
    };
    let created = store
        .list(only(AuditQuery {
            action: Some(Action::KeyCreated),
            ..AuditQuery::default()
        }))
        .await;
    assert_eq!(created.len(), 2);
    let by_cli = store
        .list(only(AuditQuery {
            actor_kind: Some(ActorKind::Cli),
            ..AuditQuery::default()
        }))
        .await;
    assert_eq!(
        summary(&by_cli),
        [(Action::KeyRevoked, ActorKind::Cli, keys[0].clone())]
    );
    // Two pages of one row, then the rest after the cursor.
    let first = store
        .list(AuditQuery {
            limit: 1,
            ..only(AuditQuery::default())
        })
        .await;
    let next = store
        .list(AuditQuery {
            before_id: Some(first[0].id),
            ..only(AuditQuery::default())
        })
        .await;
    assert_eq!([first, next].concat(), of_one);
    let newest = of_one[0].at;
    let until_now = store
        .list(only(AuditQuery {
            from: Some(newest - Duration::minutes(1)),
            to: Some(newest + Duration::minutes(1)),
            ..AuditQuery::default()
        }))
        .await;
    assert_eq!(until_now.len(), 3);
    let later = store
        .list(only(AuditQuery {
            from: Some(newest + Duration::minutes(1)),
            ..AuditQuery::default()
        }))
        .await;
    assert!(later.is_empty());
}

async fn credits_given_are_a_row_once_and_none_given_none(store: Store) {
    let account = store.account().await;
    store
        .ledger
        .add_credits(&account, 0, &admin())
        .await
        .expect("nothing added");
    store
        .ledger
        .add_credits(&account, 700, &admin())
        .await
        .expect("added");
    let reference = unique("signup");
    for _ in 0..2 {
        store
            .ledger
            .add_credits_once(&account, 300, &reference, &actor())
            .await
            .expect("added once");
    }
    let rows = store.rows_of(&account).await;
    assert_eq!(
        summary(&rows),
        [
            (Action::CreditsAdded, ActorKind::AdminToken, account.clone()),
            (Action::CreditsAdded, ActorKind::Cli, reference.clone()),
        ]
    );
    assert_eq!(rows[1].entry.after, json!({ "credits": 700 }));
    assert_eq!(rows[0].entry.after, json!({ "credits": 300 }));
}

/// Who ApiKey resources' grants are audited as (the operator's `grants` module).
fn grantor() -> Actor {
    Actor::new(ActorKind::Operator, "ApiKey", None)
}

async fn an_api_key_resources_grant_is_a_row_per_change_and_a_republish_none(store: Store) {
    let account = store.account().await;
    let (record, _) = key(&account, "free", 0);
    store
        .accounts
        .insert_key(record.clone(), &admin())
        .await
        .expect("key");
    let (unminted, _) = key(&account, "free", 0);
    let enterprise = json!({ "tier": "enterprise", "suspended": false, "spendCap": 500 });
    let raised = json!({ "tier": "enterprise", "suspended": false, "spendCap": 900 });
    let record_grants = |grants: Vec<(&str, serde_json::Value)>| {
        let grants = grants
            .into_iter()
            .map(|(id, grant)| (id.to_owned(), grant))
            .collect();
        let accounts = store.accounts.clone();
        async move {
            accounts
                .record_key_grants(&grants, &grantor())
                .await
                .expect("recorded")
                .into_iter()
                .map(|c| (c.key_id, c.before, c.after))
                .collect::<Vec<_>>()
        }
    };
    let granted = (record.id.as_str(), enterprise.clone());
    let waiting = (unminted.id.as_str(), enterprise.clone());
    assert_eq!(
        record_grants(vec![granted.clone(), waiting.clone()]).await,
        [(record.id.clone(), json!(null), enterprise.clone())],
        "a new grant; the grant of a key not minted yet waits"
    );
    assert_eq!(
        record_grants(vec![granted.clone(), waiting.clone()]).await,
        [],
        "the same grants published again"
    );
    store
        .accounts
        .insert_key(unminted.clone(), &admin())
        .await
        .expect("key");
    // Changes come in key id order.
    let mut expected = vec![
        (record.id.clone(), enterprise.clone(), raised.clone()),
        (unminted.id.clone(), json!(null), enterprise.clone()),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        record_grants(vec![(record.id.as_str(), raised.clone()), waiting]).await,
        expected,
        "a raised cap, and the waiting key's grant once it exists"
    );
    assert_eq!(
        record_grants(vec![(unminted.id.as_str(), enterprise.clone())]).await,
        [(record.id.clone(), raised.clone(), json!(null))],
        "a withdrawn grant (its ApiKey resource deleted)"
    );
    let rows: Vec<_> = store
        .rows_of(&account)
        .await
        .into_iter()
        .filter(|r| r.entry.action == Action::KeyGrantChanged)
        .collect();
    assert_eq!(rows.len(), 4, "one row per change: {rows:?}");
    assert!(rows.iter().all(|r| r.entry.actor == grantor()));
    assert_eq!(
        (
            &rows[0].entry.target,
            &rows[0].entry.before,
            &rows[0].entry.after
        ),
        (&record.id, &raised, &json!(null)),
        "newest first"
    );
}

e2e::contract! {
    fixtures { in_process, postgres }
    rules {
        an_api_key_resources_grant_is_a_row_per_change_and_a_republish_none,
        each_key_and_status_change_leaves_one_row_and_a_repeat_none,
        a_refused_change_leaves_no_row,
        a_top_up_its_refunds_and_its_dispute_leave_one_row_per_movement,
        a_users_sign_up_verification_sign_ins_and_sign_outs_are_rows_of_its_account_once_each,
        rows_are_listed_newest_first_by_filter_and_page,
        credits_given_are_a_row_once_and_none_given_none,
    }
}
