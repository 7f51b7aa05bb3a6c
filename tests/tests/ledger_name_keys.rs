//! A ledger row names its route and its upstream by small keys (migration 0025, issue 35's
//! compact rows), on real Postgres: what a row says reads back as it was written (through
//! fallback, from two processes), the keyed row is smaller by the names it no longer repeats,
//! and a ledger written before 0025 reads the same after it, its turn in flight settling on
//! the new code.

use std::time::{Duration, Instant};

use e2e::ledger::{funded, reserve};
use e2e::PostgresServer;
use store::db::Database;
use store::ledger::fixtures::turn_record;
use store::ledger::{
    message_id, Ledger, MessageRecord, MessageStatus, PostgresLedger, ServedBy, Settlement,
};
use time::OffsetDateTime;

const CREDITS: u64 = 100_000_000;

/// Rows of the layout of before, to time the migration on.
const BULK_ROWS: i64 = 200_000;

/// A turn of svc/sonnet through /v1/chat/completions, reserved on the first upstream.
fn sonnet(account: &str) -> MessageRecord {
    let id = message_id::mint("chatcmpl", OffsetDateTime::now_utc());
    MessageRecord {
        model: "svc/auto".to_owned(),
        served_model: "svc/sonnet".to_owned(),
        provider: "simulated".to_owned(),
        upstream: "primary".to_owned(),
        upstream_model: "simulated-sonnet".to_owned(),
        endpoint: "chat_completions",
        created_at: message_id::created_at(&id).expect("a time"),
        ..turn_record(&id, account, "key_names")
    }
}

async fn settle(ledger: &PostgresLedger, id: &str, served_by: Option<ServedBy>) -> u64 {
    ledger
        .settle(Settlement {
            served_by,
            cost: 400,
            latency_ms: 9,
            ..Settlement::nothing(id.to_owned(), MessageStatus::Completed)
        })
        .await
        .expect("settle")
}

fn fallback() -> ServedBy {
    ServedBy {
        provider: "simulated".to_owned(),
        upstream: "secondary".to_owned(),
        upstream_model: "simulated-sonnet-b".to_owned(),
    }
}

/// What a row reads back as: its route and upstream by name.
fn names(m: &MessageRecord) -> [&str; 6] {
    [
        &m.model,
        &m.served_model,
        m.endpoint,
        &m.provider,
        &m.upstream,
        &m.upstream_model,
    ]
}

#[tokio::test]
async fn a_row_keeps_its_route_and_upstream_as_keys_and_reads_back_their_names() {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(30)).expect("url");
    db.migrate().await.expect("migrate");
    let (ledger, account) = funded(&db, "keys", CREDITS).await;
    // Another process, with no key seen yet, on the same routes.
    let other = PostgresLedger::new(db.clone());
    other.heartbeat().await.expect("heartbeat");

    let stayed = sonnet(&account);
    let moved = sonnet(&account);
    let elsewhere = sonnet(&account);
    for record in [&stayed, &moved] {
        reserve(&ledger, record.clone()).await;
    }
    reserve(&other, elsewhere.clone()).await;
    assert_eq!(settle(&ledger, &stayed.id, None).await, 400);
    assert_eq!(settle(&ledger, &moved.id, Some(fallback())).await, 400);
    assert_eq!(settle(&other, &elsewhere.id, Some(fallback())).await, 400);

    let read = |id: String| {
        let ledger = &ledger;
        async move { ledger.message(&id).await.expect("lookup").expect("found") }
    };
    let row = read(stayed.id.clone()).await;
    assert_eq!(names(&row), names(&stayed), "as reserved");
    let served = [
        "svc/auto",
        "svc/sonnet",
        "chat_completions",
        "simulated",
        "secondary",
        "simulated-sonnet-b",
    ];
    assert_eq!(
        names(&read(moved.id.clone()).await),
        served,
        "the upstream that served it"
    );
    assert_eq!(
        names(&read(elsewhere.id.clone()).await),
        served,
        "from the other process"
    );
    let listed = ledger.recent_messages(&account, 10).await.expect("list");
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|m| m.model == "svc/auto"), "{listed:?}");

    // One key per route and per upstream, whichever process made it; no row repeats a name.
    assert_eq!(pg.query("SELECT count(*) FROM message_routes").await, "1");
    assert_eq!(
        pg.query("SELECT count(*) FROM message_upstreams").await,
        "2"
    );
    assert_eq!(
        pg.query(
            "SELECT count(*) FROM messages WHERE route_id IS NOT NULL AND upstream_id IS NOT NULL
                 AND num_nulls(model, served_model, endpoint, provider, upstream,
                     upstream_model) = 6"
        )
        .await,
        "3"
    );

    // A row naming neither a key nor a name is refused by Postgres.
    let nameless = pg
        .try_query(&format!(
            "INSERT INTO messages (id, account_id, key_id, stream, status, reserved,
                 instance_id, route_id)
             VALUES ('msg_nameless', '{account}', 'key_names', false, 'reserved', 0, 'i', 1)"
        ))
        .await;
    assert!(
        nameless
            .as_ref()
            .is_err_and(|e| e.contains("messages_named")),
        "{nameless:?}"
    );

    // The keyed row is smaller than the same row with its names by what the names took.
    let keyed = pg
        .query_i64(&format!(
            "SELECT pg_column_size(m.*) FROM messages m WHERE id = '{}'",
            stayed.id
        ))
        .await;
    let named = pg
        .query_i64(&format!(
            "SELECT pg_column_size(m.*) FROM (SELECT r.*, NULL::integer AS route_id,
                 NULL::integer AS upstream_id FROM message_rows r WHERE id = '{}') m",
            stayed.id
        ))
        .await;
    eprintln!("a settled row: {keyed} bytes keyed, {named} with its names");
    assert!(named - keyed >= 50, "{keyed} keyed against {named} named");
}

#[tokio::test]
async fn migration_0025_reads_a_ledger_of_before_the_same_and_its_turn_in_flight_settles_after() {
    let pg = PostgresServer::start().await;
    pg.migrate_before(25).await;

    let db = Database::connect(&pg.url(), 4, Duration::from_secs(60)).expect("url");
    let (ledger, account) = funded(&db, "keys", CREDITS).await;
    // Rows as the code of before wrote them: one settled, one still reserved (its 1,000
    // credits held), and a bulk of settled ones to time the migration.
    let done = sonnet(&account);
    let in_flight = sonnet(&account);
    for (m, status, billed) in [(&done, "completed", 300), (&in_flight, "reserved", 0)] {
        pg.query(&format!(
            "INSERT INTO messages (id, account_id, key_id, model, served_model, provider,
                 upstream, upstream_model, endpoint, stream, status, reserved, billed,
                 instance_id, created_at)
             VALUES ('{}', '{account}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', false,
                 '{status}', 1000, {billed}, 'inst_before',
                 'epoch'::timestamptz + {} * interval '1 microsecond');
             UPDATE accounts SET balance = balance - {billed},
                 reserved = reserved + CASE WHEN '{status}' = 'reserved' THEN 1000 ELSE 0 END
             WHERE id = '{account}'",
            m.id,
            m.key_id,
            m.model,
            m.served_model,
            m.provider,
            m.upstream,
            m.upstream_model,
            m.endpoint,
            m.created_at.unix_timestamp_nanos() / 1_000,
        ))
        .await;
    }
    pg.query(&format!(
        "INSERT INTO messages (id, account_id, key_id, model, served_model, provider, upstream,
             upstream_model, endpoint, stream, status, reserved, billed, instance_id,
             created_at, settled_at)
         SELECT 'msg_bulk_' || i, '{account}', 'key_bulk', 'svc/haiku', 'svc/haiku',
             'simulated', 'simulated', 'simulated-haiku', 'messages', false, 'completed',
             1000, i % 997, 'inst_bulk', now() - i * interval '1 second', now()
         FROM generate_series(1, {BULK_ROWS}) i"
    ))
    .await;
    let as_read = "SELECT count(*) || '|' || sum(billed) || '|' || string_agg(DISTINCT
        concat_ws(',', model, served_model, endpoint, provider, upstream, upstream_model), ';')
        FROM messages";
    let before = pg.query(as_read).await;

    let started = Instant::now();
    db.migrate().await.expect("0025 on a filled ledger");
    let took = started.elapsed();
    eprintln!(
        "migration 0025: {} rows in {took:?} (nothing rewritten)",
        BULK_ROWS + 2
    );
    assert_eq!(
        pg.query(&as_read.replace("FROM messages", "FROM message_rows"))
            .await,
        before,
        "every row reads as it did"
    );
    assert_eq!(
        names(
            &ledger
                .message(&done.id)
                .await
                .expect("lookup")
                .expect("found")
        ),
        names(&done)
    );

    // The turn in flight settles on the new code, moved to another upstream: its row then
    // names the upstream by key, and reads it back; billed once.
    assert_eq!(settle(&ledger, &in_flight.id, Some(fallback())).await, 400);
    assert_eq!(
        settle(&ledger, &in_flight.id, None).await,
        400,
        "a replay bills nothing"
    );
    let row = ledger
        .message(&in_flight.id)
        .await
        .expect("lookup")
        .expect("found");
    assert_eq!(
        names(&row),
        [
            "svc/auto",
            "svc/sonnet",
            "chat_completions",
            "simulated",
            "secondary",
            "simulated-sonnet-b"
        ]
    );
    assert_eq!(
        pg.query(&format!(
            "SELECT (route_id IS NULL) || '|' || (upstream_id IS NOT NULL) || '|'
                 || (provider IS NULL) FROM messages WHERE id = '{}'",
            in_flight.id
        ))
        .await,
        "true|true|true",
        "the route by name as written, the upstream by key"
    );
    assert_eq!(
        pg.query(&format!(
            "SELECT balance || '|' || reserved FROM accounts WHERE id = '{account}'"
        ))
        .await,
        format!("{}|0", CREDITS - 300 - 400),
        "each turn debited once, nothing left held"
    );
}
