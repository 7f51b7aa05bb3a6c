//! The `Ledger` contract, kept alike by the in-process ledger of standalone mode, the Postgres
//! ledger of cluster mode that reserves every turn in Postgres, and the one that serves turns
//! from its allotments (`--allotment-turns`). Refunds and disputes have their own suite
//! (`ledger_reversals.rs`).

use e2e::contract::actor;
use std::sync::Arc;
use std::time::Duration;

use e2e::PostgresServer;
use futures::future::join_all;
use store::accounts::{Accounts, MemoryAccounts, PostgresAccounts};
use store::ledger::fixtures::turn_record;
use store::ledger::{
    Ledger, LedgerError, MemoryLedger, MessageStatus, NewReservation, NewTopUp, PostgresLedger,
    Settlement,
};
use store::usage::{StopReason, TokenUsage};
use time::OffsetDateTime;

use super::{database, key_record, unique};

pub struct Books {
    accounts: Arc<dyn Accounts>,
    ledger: Arc<dyn Ledger>,
    _pg: Option<PostgresServer>,
}

async fn in_process() -> Books {
    let ledger = Arc::new(MemoryLedger::default());
    Books {
        accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
        ledger,
        _pg: None,
    }
}

async fn on_postgres(allotment_turns: u64) -> Books {
    let (pg, db) = database().await;
    let ledger =
        PostgresLedger::new(db.clone()).with_allotments(allotment_turns, Duration::from_secs(30));
    ledger.heartbeat().await.expect("heartbeat");
    Books {
        accounts: Arc::new(PostgresAccounts::new(db)),
        ledger: Arc::new(ledger),
        _pg: Some(pg),
    }
}

async fn postgres() -> Books {
    on_postgres(0).await
}

async fn postgres_with_allotments() -> Books {
    on_postgres(16).await
}

impl Books {
    /// A new account holding `credits`.
    async fn account(&self, credits: u64) -> String {
        let account = self
            .accounts
            .create_account(&unique("ledger"))
            .await
            .expect("account");
        if credits > 0 {
            self.ledger
                .add_credits(&account.id, credits, &actor())
                .await
                .expect("add credits");
        }
        account.id
    }

    /// A new key of the account (a key's monthly spend is kept with the key).
    async fn key(&self, account_id: &str) -> String {
        let (record, _) = key_record(account_id, "free", 0);
        let id = record.id.clone();
        self.accounts
            .insert_key(record, &actor())
            .await
            .expect("key");
        id
    }

    async fn reserve(
        &self,
        account_id: &str,
        key_id: &str,
        (min, max): (u64, u64),
        spend_cap: Option<u64>,
    ) -> Result<(String, u64), LedgerError> {
        let id = unique("msg");
        let record = turn_record(&id, account_id, key_id);
        let held = self
            .ledger
            .reserve(NewReservation {
                record,
                spend_cap,
                min,
                max,
            })
            .await?;
        Ok((id, held))
    }

    async fn settle(&self, message_id: &str, status: MessageStatus, cost: u64) -> u64 {
        self.ledger
            .settle(settlement(message_id, status, cost))
            .await
            .expect("settle")
    }

    /// (balance, reserved).
    async fn money(&self, account_id: &str) -> (u64, u64) {
        let b = self.ledger.balance(account_id).await.expect("balance");
        (b.balance, b.reserved)
    }
}

fn usage(input_tokens: u32, output_tokens: u32) -> TokenUsage {
    TokenUsage {
        input_tokens,
        output_tokens,
        ..TokenUsage::default()
    }
}

fn settlement(message_id: &str, status: MessageStatus, cost: u64) -> Settlement {
    Settlement {
        message_id: message_id.to_owned(),
        served_by: None,
        status,
        cost,
        usage: usage(10, 20),
        stop_reason: Some(StopReason::EndTurn),
        latency_ms: 7,
    }
}

async fn a_new_account_holds_nothing_and_credits_added_go_to_its_balance(books: Books) {
    let account = books.account(0).await;
    assert_eq!(books.money(&account).await, (0, 0));
    let after = books
        .ledger
        .add_credits(&account, 1_500, &actor())
        .await
        .expect("add credits");
    assert_eq!((after.balance, after.reserved), (1_500, 0));
    books
        .ledger
        .add_credits(&account, 500, &actor())
        .await
        .expect("add credits");
    let balance = books.ledger.balance(&account).await.expect("balance");
    assert_eq!(balance.balance, 2_000);
    assert_eq!(
        balance.lifetime_top_up_cents, 0,
        "added credits are not a top-up: they count for no tier"
    );
}

async fn credits_added_under_a_reference_are_added_once_however_often_and_concurrently_asked(
    books: Books,
) {
    let account = books.account(0).await;
    let reference = unique("signup");
    let books = Arc::new(books);
    let asked = join_all((0..16).map(|_| {
        let (books, account, reference) = (books.clone(), account.clone(), reference.clone());
        async move {
            books
                .ledger
                .add_credits_once(&account, 700, &reference, &actor())
                .await
        }
    }))
    .await;
    let credited = asked
        .into_iter()
        .map(|a| a.expect("add_credits_once"))
        .filter(|credited| *credited)
        .count();
    assert_eq!(credited, 1);
    assert_eq!(books.money(&account).await, (700, 0));
    assert!(!books
        .ledger
        .add_credits_once(&account, 700, &reference, &actor())
        .await
        .expect("add_credits_once"));
    let other = unique("signup");
    assert!(books
        .ledger
        .add_credits_once(&account, 300, &other, &actor())
        .await
        .expect("add_credits_once"));
    assert_eq!(books.money(&account).await, (1_000, 0));
}

async fn a_top_up_is_credited_once_per_reference_and_a_reused_reference_is_refused(books: Books) {
    let account = books.account(0).await;
    let other = books.account(0).await;
    let reference = unique("pay");
    let by = actor();
    let top_up = |account_id, usd_cents| NewTopUp {
        by: &by,
        account_id,
        reference: &reference,
        usd_cents,
        credits: usd_cents * 1_000,
        payment_id: None,
    };
    let first = books
        .ledger
        .top_up(top_up(&account, 2_500))
        .await
        .expect("top-up");
    assert!(first.first);
    assert_eq!(first.top_up.credits, 2_500_000);
    let replay = books
        .ledger
        .top_up(top_up(&account, 2_500))
        .await
        .expect("replay");
    assert!(!replay.first, "a replay confirms nothing new");
    assert_eq!(replay.top_up.reference, first.top_up.reference);
    assert!(matches!(
        books.ledger.top_up(top_up(&other, 2_500)).await,
        Err(LedgerError::ReferenceConflict)
    ));
    assert!(matches!(
        books.ledger.top_up(top_up(&account, 900)).await,
        Err(LedgerError::TopUpMismatch)
    ));
    let balance = books.ledger.balance(&account).await.expect("balance");
    assert_eq!(
        (balance.balance, balance.lifetime_top_up_cents),
        (2_500_000, 2_500)
    );
    assert_eq!(books.money(&other).await, (0, 0));
    let listed = books.ledger.top_ups(&account).await.expect("top-ups");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].usd_cents, listed[0].status),
        (2_500, "confirmed")
    );
    assert!(books.ledger.top_ups(&other).await.expect("none").is_empty());
}

async fn top_ups_are_listed_newest_first(books: Books) {
    let account = books.account(0).await;
    let mut references = Vec::new();
    for cents in [100, 200, 300] {
        let reference = unique("pay");
        books
            .ledger
            .top_up(NewTopUp {
                by: &actor(),
                account_id: &account,
                reference: &reference,
                usd_cents: cents,
                credits: cents * 1_000,
                payment_id: None,
            })
            .await
            .expect("top-up");
        references.push(reference);
        // Confirmation times must differ for an order to exist.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let listed: Vec<String> = books
        .ledger
        .top_ups(&account)
        .await
        .expect("top-ups")
        .into_iter()
        .map(|t| t.reference)
        .collect();
    references.reverse();
    assert_eq!(listed, references);
}

async fn a_reservation_holds_what_the_balance_allows_between_min_and_max(books: Books) {
    let account = books.account(1_000).await;
    let key = unique("key");
    let (_, held) = books
        .reserve(&account, &key, (100, 600), None)
        .await
        .expect("reserved");
    assert_eq!(
        held, 600,
        "the most the turn can cost, when the balance allows"
    );
    assert_eq!(books.money(&account).await, (1_000, 600));
    let (_, held) = books
        .reserve(&account, &key, (100, 600), None)
        .await
        .expect("reserved");
    assert_eq!(held, 400, "what is left, when it is at least the least");
    match books.reserve(&account, &key, (100, 600), None).await {
        Err(LedgerError::InsufficientCredits { needed, available }) => {
            assert_eq!((needed, available), (600, 0));
        }
        other => panic!("expected insufficient credits, got {other:?}"),
    }
    assert_eq!(
        books.money(&account).await,
        (1_000, 1_000),
        "a refused reservation holds nothing"
    );
}

async fn an_account_without_credits_is_refused_naming_what_the_turn_may_cost(books: Books) {
    let account = books.account(0).await;
    match books
        .reserve(&account, &unique("key"), (100, 600), None)
        .await
    {
        Err(LedgerError::InsufficientCredits { needed, available }) => {
            assert_eq!((needed, available), (600, 0));
        }
        other => panic!("expected insufficient credits, got {other:?}"),
    }
}

async fn a_settlement_bills_its_cost_up_to_what_was_held_once_and_releases_the_rest(books: Books) {
    let account = books.account(1_000).await;
    let key = unique("key");
    let (id, held) = books
        .reserve(&account, &key, (100, 600), None)
        .await
        .expect("reserved");
    assert_eq!(held, 600);
    assert_eq!(books.settle(&id, MessageStatus::Completed, 250).await, 250);
    assert_eq!(books.money(&account).await, (750, 0));
    assert_eq!(
        books.settle(&id, MessageStatus::Completed, 400).await,
        250,
        "a replay returns the first bill"
    );
    assert_eq!(books.money(&account).await, (750, 0), "and moves nothing");

    let (over, _) = books
        .reserve(&account, &key, (100, 300), None)
        .await
        .expect("reserved");
    assert_eq!(
        books.settle(&over, MessageStatus::Completed, 5_000).await,
        300,
        "never more than was held"
    );
    assert_eq!(books.money(&account).await, (450, 0));

    let row = books
        .ledger
        .message(&id)
        .await
        .expect("lookup")
        .expect("a row");
    assert_eq!(row.status, MessageStatus::Completed);
    assert_eq!((row.reserved, row.billed), (600, 250));
    assert_eq!(row.usage, usage(10, 20));
    assert_eq!(row.stop_reason, Some(StopReason::EndTurn));
    assert_eq!(row.latency_ms, Some(7));
    assert_eq!(
        (row.account_id.as_str(), row.key_id.as_str()),
        (account.as_str(), key.as_str())
    );
}

async fn a_failed_turn_is_billed_nothing_and_a_cut_one_what_it_cost(books: Books) {
    let account = books.account(1_000).await;
    let key = unique("key");
    let (failed, _) = books
        .reserve(&account, &key, (100, 400), None)
        .await
        .expect("reserved");
    assert_eq!(books.settle(&failed, MessageStatus::Failed, 300).await, 0);
    let (cut, _) = books
        .reserve(&account, &key, (100, 400), None)
        .await
        .expect("reserved");
    assert_eq!(
        books
            .settle(&cut, MessageStatus::ClientDisconnected, 120)
            .await,
        120
    );
    assert_eq!(books.money(&account).await, (880, 0));
    let row = |id: String| {
        let ledger = books.ledger.clone();
        async move { ledger.message(&id).await.expect("lookup").expect("a row") }
    };
    assert_eq!(row(failed).await.status, MessageStatus::Failed);
    assert_eq!(row(cut).await.status, MessageStatus::ClientDisconnected);
}

async fn an_unknown_message_has_no_row_and_cannot_be_settled(books: Books) {
    assert!(books
        .ledger
        .message(&unique("msg"))
        .await
        .expect("lookup")
        .is_none());
    assert!(matches!(
        books
            .ledger
            .settle(settlement(&unique("msg"), MessageStatus::Completed, 10))
            .await,
        Err(LedgerError::UnknownMessage)
    ));
}

async fn a_key_spend_cap_bounds_what_its_turns_hold_and_spend_in_the_month(books: Books) {
    let account = books.account(10_000).await;
    let key = books.key(&account).await;
    let (first, held) = books
        .reserve(&account, &key, (100, 600), Some(700))
        .await
        .expect("reserved");
    assert_eq!(held, 600);
    let (second, held) = books
        .reserve(&account, &key, (100, 600), Some(700))
        .await
        .expect("reserved");
    assert_eq!(held, 100, "what the cap leaves");
    match books.reserve(&account, &key, (100, 600), Some(700)).await {
        Err(LedgerError::SpendCapReached { cap, used, needed }) => {
            assert_eq!((cap, used, needed), (700, 700, 600));
        }
        other => panic!("expected the spend cap, got {other:?}"),
    }
    let spend = books.ledger.key_spend(&key).await.expect("spend");
    assert_eq!((spend.spent, spend.reserved), (0, 700));
    books.settle(&first, MessageStatus::Completed, 250).await;
    books.settle(&second, MessageStatus::Completed, 100).await;
    let spend = books.ledger.key_spend(&key).await.expect("spend");
    assert_eq!((spend.spent, spend.reserved), (350, 0));
    let other_key = books.ledger.key_spend(&unique("key")).await.expect("spend");
    assert_eq!((other_key.spent, other_key.reserved), (0, 0));
    let another = books.key(&account).await;
    books
        .reserve(&account, &another, (100, 600), Some(700))
        .await
        .expect("another key of the account has its own cap");
}

async fn usage_sums_the_billed_turns_by_day_and_model_and_recent_messages_come_newest_first(
    books: Books,
) {
    let account = books.account(100_000).await;
    let key = unique("key");
    let mut ids = Vec::new();
    for (status, cost) in [
        (MessageStatus::Completed, 100),
        (MessageStatus::Completed, 200),
        (MessageStatus::Failed, 50),
    ] {
        let (id, _) = books
            .reserve(&account, &key, (10, 1_000), None)
            .await
            .expect("reserved");
        books.settle(&id, status, cost).await;
        ids.push(id);
        // Creation times must differ for an order to exist.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let today = OffsetDateTime::now_utc().date();
    let rows = books
        .ledger
        .usage(&account, today.previous_day().expect("a day"), today)
        .await
        .expect("usage");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].date, rows[0].model.as_str()), (today, "svc/haiku"));
    let totals = rows[0].totals;
    assert_eq!(
        (
            totals.requests,
            totals.credits,
            totals.input_tokens,
            totals.output_tokens
        ),
        (2, 300, 20, 40),
        "a failed turn is no usage"
    );
    let recent: Vec<String> = books
        .ledger
        .recent_messages(&account, 2)
        .await
        .expect("recent")
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(recent, vec![ids[2].clone(), ids[1].clone()]);
    let other = books.account(0).await;
    assert!(books
        .ledger
        .recent_messages(&other, 10)
        .await
        .expect("recent")
        .is_empty());
}

async fn turns_reserved_at_once_never_hold_more_than_the_balance(books: Books) {
    let account = books.account(1_000).await;
    let key = unique("key");
    let books = Arc::new(books);
    let turns = join_all((0..40).map(|_| {
        let (books, account, key) = (books.clone(), account.clone(), key.clone());
        async move { books.reserve(&account, &key, (100, 100), None).await }
    }))
    .await;
    let held: Vec<(String, u64)> = turns.into_iter().filter_map(Result::ok).collect();
    assert_eq!(held.len(), 10, "exactly what the balance covers");
    assert_eq!(books.money(&account).await, (1_000, 1_000));
    join_all(
        held.iter()
            .map(|(id, _)| books.settle(id, MessageStatus::Completed, 30)),
    )
    .await;
    assert_eq!(books.money(&account).await, (700, 0));
}

e2e::contract! {
    fixtures { in_process, postgres, postgres_with_allotments }
    rules {
        a_new_account_holds_nothing_and_credits_added_go_to_its_balance,
        credits_added_under_a_reference_are_added_once_however_often_and_concurrently_asked,
        a_top_up_is_credited_once_per_reference_and_a_reused_reference_is_refused,
        top_ups_are_listed_newest_first,
        a_reservation_holds_what_the_balance_allows_between_min_and_max,
        an_account_without_credits_is_refused_naming_what_the_turn_may_cost,
        a_settlement_bills_its_cost_up_to_what_was_held_once_and_releases_the_rest,
        a_failed_turn_is_billed_nothing_and_a_cut_one_what_it_cost,
        an_unknown_message_has_no_row_and_cannot_be_settled,
        a_key_spend_cap_bounds_what_its_turns_hold_and_spend_in_the_month,
        usage_sums_the_billed_turns_by_day_and_model_and_recent_messages_come_newest_first,
        turns_reserved_at_once_never_hold_more_than_the_balance,
    }
}
