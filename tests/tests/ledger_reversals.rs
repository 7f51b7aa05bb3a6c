//! The ledger's refunds and disputes, the same contract on both ledgers (in process, and
//! Postgres with two ledgers standing for two pods): a reversal never takes a balance below
//! zero (what it cannot take is owed, and the next top-up pays it first), a refund total or a
//! dispute stage moves money once however often and wherever it is applied, and lifetime
//! top-up counts net of what was taken back. The Postgres ledgers also run through PgBouncer in
//! transaction pooling mode (`--database-pooler transaction`), whose reversals are explicit
//! transactions of unnamed statements.

use e2e::contract::actor;
use std::sync::Arc;
use std::time::Duration;

use e2e::{PgBouncer, PostgresServer};
use store::accounts::{Accounts, PostgresAccounts};
use store::db::{Database, DbSettings, Pooler};
use store::ledger::fixtures::turn_record;
use store::ledger::{
    DisputeStage, Ledger, LedgerError, MemoryLedger, MessageStatus, NewReservation, NewTopUp,
    PostgresLedger, ReversalKind, Settlement,
};
use store::usage::TokenUsage;

/// Credits per cent, as at the default rate.
const PER_CENT: u64 = 1_000;

/// Ledgers sharing one store (two for Postgres: two pods), and an account on it.
struct Books {
    ledgers: Vec<Arc<dyn Ledger>>,
    account_id: String,
    _pg: Option<(PostgresServer, Option<PgBouncer>)>,
}

async fn postgres() -> Books {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(5)).expect("url");
    db.migrate().await.expect("migrate");
    on_postgres(db, pg, None).await
}

async fn postgres_through_pgbouncer() -> Books {
    let pg = PostgresServer::start().await;
    let bouncer = PgBouncer::start(&pg).await;
    let db = Database::connect_with(&DbSettings {
        url: bouncer.url(),
        pool_size: 4,
        timeout: Duration::from_secs(5),
        pooler: Pooler::Transaction,
        tls: Default::default(),
    })
    .expect("url");
    on_postgres(db, pg, Some(bouncer)).await
}

async fn on_postgres(db: Database, pg: PostgresServer, bouncer: Option<PgBouncer>) -> Books {
    let account = PostgresAccounts::new(db.clone())
        .create_account("reversals")
        .await
        .expect("account");
    let mut ledgers: Vec<Arc<dyn Ledger>> = Vec::new();
    for _ in 0..2 {
        let ledger = PostgresLedger::new(db.clone());
        ledger.heartbeat().await.expect("heartbeat");
        ledgers.push(Arc::new(ledger));
    }
    Books {
        ledgers,
        account_id: account.id,
        _pg: Some((pg, bouncer)),
    }
}

async fn in_process() -> Books {
    Books {
        ledgers: vec![Arc::new(MemoryLedger::default())],
        account_id: "acct_reversals".to_owned(),
        _pg: None,
    }
}

impl Books {
    fn ledger(&self, i: usize) -> &dyn Ledger {
        self.ledgers[i % self.ledgers.len()].as_ref()
    }

    async fn top_up(&self, reference: &str, payment_id: &str, usd_cents: u64) {
        let top_up = NewTopUp {
            by: &actor(),
            account_id: &self.account_id,
            reference,
            usd_cents,
            credits: usd_cents * PER_CENT,
            payment_id: Some(payment_id),
        };
        assert!(self.ledger(0).top_up(top_up).await.expect("top-up").first);
    }

    /// Bills a turn of `credits`.
    async fn spend(&self, message_id: &str, credits: u64) {
        let record = turn_record(message_id, &self.account_id, "key_reversals");
        let ledger = self.ledger(0);
        let held = ledger
            .reserve(NewReservation {
                record,
                min: credits,
                max: credits,
                spend_cap: None,
            })
            .await
            .expect("reserve");
        assert_eq!(held, credits);
        let settlement = Settlement {
            message_id: message_id.to_owned(),
            served_by: None,
            status: MessageStatus::Completed,
            cost: credits,
            usage: TokenUsage::default(),
            stop_reason: None,
            latency_ms: 1,
        };
        assert_eq!(ledger.settle(settlement).await.expect("settle"), credits);
    }

    /// (balance, lifetime top-up in cents, owed credits).
    async fn money(&self) -> (u64, u64, u64) {
        let b = self
            .ledger(0)
            .balance(&self.account_id)
            .await
            .expect("balance");
        (b.balance, b.lifetime_top_up_cents, b.owed)
    }
}

async fn a_refund_never_takes_the_balance_below_zero_and_the_next_top_up_pays_what_is_owed(
    books: Books,
) {
    books.top_up("pay_rev_1", "pi_rev_1", 2_500).await;
    books.spend("msg_rev_1", 2_000_000).await;

    let refund = books
        .ledger(0)
        .refund("pi_rev_1", 1_000, &actor())
        .await
        .expect("refund")
        .expect("a reversal");
    assert_eq!(refund.kind, ReversalKind::Refund);
    assert_eq!((refund.credits, refund.owed), (500_000, 500_000));
    assert_eq!(books.money().await, (0, 1_500, 500_000));

    for total in [1_000, 400] {
        let again = books
            .ledger(1)
            .refund("pi_rev_1", total, &actor())
            .await
            .expect("refund");
        assert!(
            again.is_none(),
            "a refund total already reached moves nothing"
        );
    }
    books.top_up("pay_rev_2", "pi_rev_2", 1_000).await;
    assert_eq!(books.money().await, (500_000, 2_500, 0));

    let unknown = books
        .ledger(0)
        .refund("pi_never_paid", 1_000, &actor())
        .await;
    assert!(matches!(unknown, Err(LedgerError::UnknownPayment(_))));
    let history = books
        .ledger(1)
        .reversals(&books.account_id)
        .await
        .expect("reversals");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].reference, "pay_rev_1");
}

async fn a_dispute_won_returns_what_it_took_clearing_what_is_owed_first(books: Books) {
    books.top_up("pay_rev_3", "pi_rev_3", 2_000).await;
    books.spend("msg_rev_3", 1_500_000).await;
    let opened = books
        .ledger(0)
        .dispute("dp_rev", "pi_rev_3", 2_000, DisputeStage::Opened, &actor())
        .await
        .expect("dispute")
        .expect("taken back");
    assert_eq!((opened.credits, opened.owed), (500_000, 1_500_000));
    assert_eq!(books.money().await, (0, 0, 1_500_000));

    let won = books
        .ledger(1)
        .dispute("dp_rev", "pi_rev_3", 2_000, DisputeStage::Won, &actor())
        .await
        .expect("dispute")
        .expect("given back");
    assert_eq!(won.kind, ReversalKind::DisputeWon);
    assert_eq!((won.credits, won.owed), (500_000, 1_500_000));
    assert_eq!(books.money().await, (500_000, 2_000, 0));
    for stage in [DisputeStage::Opened, DisputeStage::Won, DisputeStage::Lost] {
        let late = books
            .ledger(0)
            .dispute("dp_rev", "pi_rev_3", 2_000, stage, &actor())
            .await
            .expect("dispute");
        assert!(late.is_none(), "{stage:?} after the close moves nothing");
    }

    // A dispute whose loss arrives before its opening is taken back once.
    let lost = books
        .ledger(0)
        .dispute(
            "dp_rev_lost",
            "pi_rev_3",
            1_000,
            DisputeStage::Lost,
            &actor(),
        )
        .await
        .expect("dispute");
    assert!(lost.is_some());
    let opened_late = books
        .ledger(1)
        .dispute(
            "dp_rev_lost",
            "pi_rev_3",
            1_000,
            DisputeStage::Opened,
            &actor(),
        )
        .await
        .expect("dispute");
    assert!(opened_late.is_none());
    assert_eq!(books.money().await, (0, 1_000, 500_000));
}

async fn one_refund_applied_by_many_at_once_takes_credits_back_once(books: Books) {
    books.top_up("pay_rev_4", "pi_rev_4", 5_000).await;
    let books = &books;
    let applied = futures::future::join_all((0..20).map(|i| async move {
        books
            .ledger(i)
            .refund("pi_rev_4", 2_000, &actor())
            .await
            .expect("refund")
    }))
    .await;
    assert_eq!(applied.iter().filter(|r| r.is_some()).count(), 1);
    let opened = futures::future::join_all((0..20).map(|i| async move {
        books
            .ledger(i)
            .dispute(
                "dp_rev_4",
                "pi_rev_4",
                1_000,
                DisputeStage::Opened,
                &actor(),
            )
            .await
            .expect("dispute")
    }))
    .await;
    assert_eq!(opened.iter().filter(|r| r.is_some()).count(), 1);
    assert_eq!(books.money().await, (2_000_000, 2_000, 0));
}

async fn a_dispute_won_after_a_full_refund_adds_nothing_to_the_lifetime_top_up(books: Books) {
    books.top_up("pay_rev_6", "pi_rev_6", 2_000).await;
    let refund = books.ledger(0).refund("pi_rev_6", 2_000, &actor()).await;
    assert!(refund.expect("refund").is_some());
    assert_eq!(books.money().await, (0, 0, 0));
    let opened = books
        .ledger(1)
        .dispute(
            "dp_rev_6",
            "pi_rev_6",
            2_000,
            DisputeStage::Opened,
            &actor(),
        )
        .await
        .expect("dispute");
    assert!(opened.is_some());
    let won = books
        .ledger(0)
        .dispute("dp_rev_6", "pi_rev_6", 2_000, DisputeStage::Won, &actor())
        .await
        .expect("dispute");
    assert!(won.is_some());
    assert_eq!(
        books.money().await,
        (0, 0, 0),
        "the payer has the $20 back: no tier may count it"
    );
    // A top-up kept whole counts in full, and a reversal of another top-up never moves it.
    books.top_up("pay_rev_7", "pi_rev_7", 3_000).await;
    let opened_again = books
        .ledger(1)
        .dispute(
            "dp_rev_6b",
            "pi_rev_6",
            2_000,
            DisputeStage::Opened,
            &actor(),
        )
        .await
        .expect("dispute");
    assert!(opened_again.is_some());
    assert_eq!(books.money().await.1, 3_000);
}

e2e::contract! {
    fixtures { postgres, postgres_through_pgbouncer, in_process }
    rules {
        a_refund_never_takes_the_balance_below_zero_and_the_next_top_up_pays_what_is_owed,
        a_dispute_won_returns_what_it_took_clearing_what_is_owed_first,
        one_refund_applied_by_many_at_once_takes_credits_back_once,
        a_dispute_won_after_a_full_refund_adds_nothing_to_the_lifetime_top_up,
    }
}
