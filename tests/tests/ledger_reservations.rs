//! A turn in flight is held in `reservations` and its ledger row written once, when it ends
//! (migration 0026, issue 35's compact rows), on real Postgres: the row is not there while the
//! turn runs (the reads still show the turn, `reserved`), it is there once after, and a settle
//! racing the reaper over the same turns bills each once, as its client is told (a race that
//! had both sides, settles and reaps winning, is required).

use std::sync::Arc;
use std::time::Duration;

use e2e::books::assert_rollups_match_rows;
use e2e::ledger::funded;
use e2e::PostgresServer;
use store::db::Database;
use store::ledger::fixtures::turn_record;
use store::ledger::{
    message_id, Ledger, MessageRecord, MessageStatus, NewReservation, PostgresLedger, Settlement,
};
use time::OffsetDateTime;

const CREDITS: u64 = 100_000_000;

/// Turns settled while the reaper takes them.
const RACED: usize = 200;

async fn ledger_on(pg: &PostgresServer) -> (Arc<PostgresLedger>, String) {
    let db = Database::connect(&pg.url(), 8, Duration::from_secs(30)).expect("url");
    db.migrate().await.expect("migrate");
    let (ledger, account) = funded(&db, "held", CREDITS).await;
    (Arc::new(ledger), account)
}

fn turn(account: &str) -> NewReservation {
    let id = message_id::mint("msg", OffsetDateTime::now_utc());
    NewReservation {
        record: MessageRecord {
            created_at: message_id::created_at(&id).expect("a time"),
            ..turn_record(&id, account, "key_held")
        },
        spend_cap: None,
        min: 1_000,
        max: 1_000,
    }
}

fn costing_400(id: &str) -> Settlement {
    Settlement {
        cost: 400,
        latency_ms: 5,
        ..Settlement::nothing(id.to_owned(), MessageStatus::Completed)
    }
}

async fn rows_of(pg: &PostgresServer, table: &str, id: &str) -> i64 {
    pg.query_i64(&format!("SELECT count(*) FROM {table} WHERE id = '{id}'"))
        .await
}

#[tokio::test]
async fn a_turns_ledger_row_is_written_once_when_it_ends_and_read_as_reserved_before() {
    let pg = PostgresServer::start().await;
    let (ledger, account) = ledger_on(&pg).await;
    let reservation = turn(&account);
    let id = reservation.record.id.clone();
    assert_eq!(ledger.reserve(reservation).await.expect("reserve"), 1_000);

    assert_eq!(
        rows_of(&pg, "messages", &id).await,
        0,
        "no row while it runs"
    );
    assert_eq!(rows_of(&pg, "reservations", &id).await, 1);
    let running = ledger.message(&id).await.expect("lookup").expect("found");
    assert_eq!(
        (running.status, running.reserved, running.model.as_str()),
        (MessageStatus::Reserved, 1_000, "svc/haiku")
    );
    let listed = ledger.recent_messages(&account, 5).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].status, MessageStatus::Reserved);

    assert_eq!(ledger.settle(costing_400(&id)).await.expect("settle"), 400);
    assert_eq!(
        rows_of(&pg, "messages", &id).await,
        1,
        "one row, written once"
    );
    assert_eq!(rows_of(&pg, "reservations", &id).await, 0);
    let ended = ledger.message(&id).await.expect("lookup").expect("found");
    assert_eq!(
        (ended.status, ended.billed),
        (MessageStatus::Completed, 400)
    );
    assert_eq!(
        ledger.settle(costing_400(&id)).await.expect("replay"),
        400,
        "a replay bills nothing more"
    );
    let balance = ledger.balance(&account).await.expect("balance");
    assert_eq!((balance.balance, balance.reserved), (CREDITS - 400, 0));
    assert_rollups_match_rows(&pg, &account).await;

    // The account's list: the turn in flight and the ended one, newest first.
    let later = turn(&account);
    let later_id = later.record.id.clone();
    ledger.reserve(later).await.expect("reserve");
    let listed = ledger.recent_messages(&account, 5).await.expect("list");
    let listed: Vec<_> = listed.iter().map(|m| (m.id.as_str(), m.status)).collect();
    assert_eq!(
        listed,
        [
            (later_id.as_str(), MessageStatus::Reserved),
            (id.as_str(), MessageStatus::Completed)
        ]
    );
}

/// One race of [`RACED`] turns reserved, then settled while the reaper takes whatever is
/// still held (every turn older than a stale time and a longest turn of zero): each turn is
/// billed once, as its client is told (400 settled, 0 reaped). The turns settled and reaped,
/// and what was billed.
async fn race(ledger: &Arc<PostgresLedger>, account: &str) -> (usize, u64, u64) {
    let mut ids = Vec::with_capacity(RACED);
    for _ in 0..RACED {
        let reservation = turn(account);
        ids.push(reservation.record.id.clone());
        ledger.reserve(reservation).await.expect("reserve");
    }
    let reaper = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            let mut reaped = 0;
            for _ in 0..20 {
                reaped += ledger
                    .reap(Duration::ZERO, Duration::ZERO, None)
                    .await
                    .expect("reap");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            reaped
        }
    });
    let settles: Vec<_> = ids
        .iter()
        .map(|id| {
            let (ledger, id) = (ledger.clone(), id.clone());
            tokio::spawn(async move { ledger.settle(costing_400(&id)).await.expect("settle") })
        })
        .collect();
    let mut told = Vec::with_capacity(RACED);
    for settle in settles {
        told.push(settle.await.expect("task"));
    }
    let reaped = reaper.await.expect("task");

    let mut settled = 0;
    for (id, told) in ids.iter().zip(&told) {
        let row = ledger.message(id).await.expect("lookup").expect("a row");
        let expected = match row.status {
            MessageStatus::Completed => 400,
            MessageStatus::Abandoned => 0,
            other => panic!("{id} ended {other:?}"),
        };
        assert_eq!((row.billed, *told), (expected, expected), "{id}");
        settled += usize::from(expected > 0);
    }
    assert_eq!(
        settled as u64 + reaped,
        RACED as u64,
        "each turn ended once: {settled} settled, {reaped} reaped"
    );
    (settled, reaped, told.iter().sum())
}

/// Races of a settle against the reaper: each turn billed once, as told. A race one side of
/// which never happened (every turn settled before any reap, or reaped before any settle)
/// proves nothing of the two at once: races are run until one had both sides, at most
/// [`RACES`] (each checked whole), and the test fails if none did.
#[tokio::test]
async fn a_settle_racing_the_reaper_bills_each_turn_once_as_its_client_is_told() {
    const RACES: usize = 5;
    let pg = PostgresServer::start().await;
    let (ledger, account) = ledger_on(&pg).await;
    let mut races = Vec::new();
    let mut billed = 0;
    while races.len() < RACES {
        let (settled, reaped, bills) = race(&ledger, &account).await;
        billed += bills;
        races.push((settled, reaped));
        if settled > 0 && reaped > 0 {
            break;
        }
    }
    eprintln!("races (settled, reaped): {races:?}");
    assert!(
        races
            .iter()
            .any(|&(settled, reaped)| settled > 0 && reaped > 0),
        "in {} races of {RACED} turns, no race had both a settle and a reap win: {races:?}",
        races.len()
    );
    assert_eq!(
        pg.query_i64(&format!(
            "SELECT count(*) FROM messages WHERE account_id = '{account}'"
        ))
        .await,
        (RACED * races.len()) as i64,
        "one row a turn"
    );
    assert_eq!(pg.query_i64("SELECT count(*) FROM reservations").await, 0);
    let balance = ledger.balance(&account).await.expect("balance");
    assert_eq!(
        (balance.balance, balance.reserved),
        (CREDITS - billed, 0),
        "debited what was told, nothing held"
    );
    assert_rollups_match_rows(&pg, &account).await;
}
