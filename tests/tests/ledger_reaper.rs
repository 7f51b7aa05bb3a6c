//! Reservations orphaned by a dead gateway process. Policy: when a process stops sending its
//! heartbeat for `--reaper-stale-secs`, any live process releases its reservations; the turns
//! end `abandoned` and are billed nothing (what the client received is unknown, and the
//! gateway never overcharges). Its allotments go back to their accounts the same way, and the
//! turns it served from them and had not written are billed nothing. A settle or a top-up
//! replayed afterwards changes nothing. A process taken for dead that was only cut off is
//! fenced: what it then writes under its old lease bills nothing, and it is told so.

use e2e::contract::actor;
use std::time::Duration;

use e2e::sse::SseStream;
use e2e::{message, message_stream, poll_until, ApiKey, Cluster, KeySpec, PostgresServer};
use store::accounts::{Accounts, PostgresAccounts};
use store::db::Database;
use store::ledger::fixtures::turn_record;
use store::ledger::{
    Ledger, MessageRecord, MessageStatus, NewReservation, PostgresLedger, Settlement,
};
use store::usage::TokenUsage;

const CREDITS: u64 = 5_000_000;

fn ledger(pg: &PostgresServer) -> PostgresLedger {
    let db = Database::connect(&pg.url(), 2, Duration::from_secs(5)).expect("database url");
    PostgresLedger::new(db)
}

fn settlement_costing_1000(message_id: &str) -> Settlement {
    Settlement {
        message_id: message_id.to_string(),
        served_by: None,
        status: MessageStatus::Completed,
        cost: 1_000,
        usage: TokenUsage {
            input_tokens: 10,
            output_tokens: 10,
            ..TokenUsage::default()
        },
        stop_reason: None,
        latency_ms: 1,
    }
}

/// Two pods (stale after 2 s, `--allotment-turns` as given) and a slow stream started on the
/// first, two events in: (the cluster, the key, the stream, its message id).
async fn a_stream_in_flight_on_the_first_of_two_pods(
    pg: &PostgresServer,
    allotment_turns: &str,
) -> (Cluster, ApiKey, SseStream, String) {
    let cluster = Cluster::start(2, |b| {
        b.database(&pg.url())
            .chunk_delay_ms(300)
            .arg("--reaper-stale-secs")
            .arg("2")
            .arg("--allotment-turns")
            .arg(allotment_turns)
    })
    .await;
    let key = cluster.pods[0]
        .new_key(CREDITS, &KeySpec::tier("enterprise"))
        .await;
    let body = message_stream("svc/sonnet", "tell me a long story", 500);
    let mut stream = cluster.pods[0]
        .stream("/v1/messages", &key.secret, &body)
        .await;
    let start = stream.next_event().await.expect("message_start");
    let message_id = start.json()["message"]["id"]
        .as_str()
        .expect("message id")
        .to_string();
    stream.next_event().await.expect("a second event");
    (cluster, key, stream, message_id)
}

#[tokio::test]
async fn a_stream_cut_by_sigkill_is_released_by_the_reaper_and_billed_nothing() {
    let pg = PostgresServer::start().await;
    // Every turn reserved in Postgres, with its row.
    let (mut cluster, key, stream, message_id) =
        a_stream_in_flight_on_the_first_of_two_pods(&pg, "0").await;
    let held = cluster.pods[1].admin_account(&key.account_id).await;
    assert!(
        held["reserved"].as_u64() > Some(0),
        "nothing reserved mid-stream: {held}"
    );

    cluster.pods[0].kill_9().await;
    drop(stream);

    let survivor = &cluster.pods[1];
    let account = poll_until(
        "the reaper to release the dead pod's reservation",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let account = survivor.admin_account(&key.account_id).await;
            (account["reserved"].as_u64() == Some(0)).then_some(account)
        },
    )
    .await;
    assert_eq!(account["balance"].as_u64(), Some(CREDITS), "{account}");
    let record = survivor.message_record(&message_id).await;
    assert_eq!(record["status"], "abandoned", "{record}");
    assert_eq!(record["billed"], 0, "{record}");

    let ledger = ledger(&pg);
    let billed = ledger
        .settle(settlement_costing_1000(&message_id))
        .await
        .expect("replayed settle");
    assert_eq!(billed, 0, "a settle after the reaper bills nothing");
    let after = survivor.admin_account(&key.account_id).await;
    assert_eq!(after["balance"].as_u64(), Some(CREDITS), "{after}");
    assert_eq!(after["reserved"].as_u64(), Some(0), "{after}");
    // The release rolled the abandoned turn up as an error, once.
    e2e::books::assert_rollups_match_rows(&pg, &key.account_id).await;
    let errors = format!(
        "SELECT coalesce(sum(errors), 0) FROM usage_rollups WHERE account_id = '{}'",
        key.account_id
    );
    assert_eq!(pg.query_i64(&errors).await, 1);
}

#[tokio::test]
async fn a_dead_pods_allotment_is_returned_by_the_reaper_and_its_unwritten_turn_costs_nothing() {
    let pg = PostgresServer::start().await;
    let (mut cluster, key, stream, message_id) =
        a_stream_in_flight_on_the_first_of_two_pods(&pg, "16").await;
    let id = &key.account_id;
    let allotments = format!("SELECT count(*) FROM allotments WHERE account_id = '{id}'");
    assert_eq!(
        pg.query_i64(&allotments).await,
        1,
        "the stream was not served from an allotment"
    );

    cluster.pods[0].kill_9().await;
    drop(stream);

    let survivor = &cluster.pods[1];
    let account = poll_until(
        "the reaper to return the dead pod's allotment",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let account = survivor.admin_account(id).await;
            (account["reserved"].as_u64() == Some(0)).then_some(account)
        },
    )
    .await;
    assert_eq!(account["balance"].as_u64(), Some(CREDITS), "{account}");
    assert_eq!(pg.query_i64(&allotments).await, 0);
    let record = survivor
        .admin_get(&format!("/admin/messages/{message_id}"))
        .await;
    assert_eq!(record.status, 404, "the unwritten turn has no ledger row");
}

#[tokio::test]
async fn a_replayed_settle_returns_the_first_billing_and_changes_nothing() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let answer = gw
        .post_messages(&key.secret, &message("svc/haiku", "hello", 64))
        .await
        .expect_ok();
    let consumed = answer["usage"]["credits_consumed"]
        .as_u64()
        .expect("credits");
    let message_id = answer["id"].as_str().expect("id");
    let before = gw.wait_settled(&key.account_id).await;

    let billed = ledger(&pg)
        .settle(settlement_costing_1000(message_id))
        .await
        .expect("replayed settle");

    assert_eq!(billed, consumed);
    let after = gw.admin_account(&key.account_id).await;
    assert_eq!(after, before, "a replayed settle moved money");
    let record = gw.message_record(message_id).await;
    assert_eq!(record["billed"].as_u64(), Some(consumed), "{record}");
}

/// A turn of 1,000 credits at most, started `age` ago.
fn reservation(account_id: &str, id: &str, age: time::Duration) -> NewReservation {
    NewReservation {
        spend_cap: None,
        record: MessageRecord {
            stream: true,
            created_at: time::OffsetDateTime::now_utc() - age,
            ..turn_record(id, account_id, "key_reaper")
        },
        min: 1_000,
        max: 1_000,
    }
}

/// A migrated database with one account of `CREDITS` credits.
async fn database_with_an_account(pg: &PostgresServer) -> (Database, String) {
    let db = Database::connect(&pg.url(), 2, Duration::from_secs(5)).expect("url");
    db.migrate().await.expect("migrate");
    let account = PostgresAccounts::new(db.clone())
        .create_account("reaper-account")
        .await
        .expect("account");
    PostgresLedger::new(db.clone())
        .add_credits(&account.id, CREDITS, &actor())
        .await
        .expect("add credits");
    (db, account.id)
}

/// [`database_with_an_account`]'s ledger, its process' heartbeat beaten: (the ledger, the
/// account).
async fn a_beating_ledger(pg: &PostgresServer) -> (PostgresLedger, String) {
    let (db, account_id) = database_with_an_account(pg).await;
    let ledger = PostgresLedger::new(db);
    ledger.heartbeat().await.expect("heartbeat");
    (ledger, account_id)
}

/// A turn of 1,000 credits reserved `age` ago in `messages`, as a process of before
/// migration 0026 reserved it (a process now gone): the row, and the credits held.
async fn reserved_in_messages(
    pg: &PostgresServer,
    account_id: &str,
    id: &str,
    age: time::Duration,
) {
    let micros = (time::OffsetDateTime::now_utc() - age).unix_timestamp_nanos() / 1_000;
    pg.query(&format!(
        "INSERT INTO messages (id, account_id, key_id, model, served_model, provider, upstream,
             upstream_model, endpoint, stream, status, reserved, instance_id, created_at)
         VALUES ('{id}', '{account_id}', 'key_reaper', 'svc/haiku', 'svc/haiku', 'simulated',
             'simulated', 'simulated-haiku', 'messages', true, 'reserved', 1000, 'inst_gone',
             'epoch'::timestamptz + {micros} * interval '1 microsecond');
         UPDATE accounts SET reserved = reserved + 1000 WHERE id = '{account_id}'"
    ))
    .await;
}

/// The status of the message `id` has in the ledger, if it has a row.
async fn status_of(ledger: &PostgresLedger, id: &str) -> Option<MessageStatus> {
    ledger.message(id).await.expect("row").map(|m| m.status)
}

#[tokio::test]
async fn a_reservation_older_than_the_longest_turn_is_released_even_if_its_process_lives() {
    let pg = PostgresServer::start().await;
    let (ledger, account_id) = a_beating_ledger(&pg).await;
    let reserve = |id: &str, age: time::Duration| reservation(&account_id, id, age);
    // Its settle was lost two hours ago; the other turn is a live one of a minute.
    ledger
        .reserve(reserve("msg_reaper_lost", time::Duration::hours(2)))
        .await
        .expect("reserve");
    ledger
        .reserve(reserve("msg_reaper_live", time::Duration::minutes(1)))
        .await
        .expect("reserve");

    let released = ledger
        .reap(Duration::from_secs(30), Duration::from_secs(3_600), None)
        .await
        .expect("reap");

    assert_eq!(released, 1);
    let balance = ledger.balance(&account_id).await.expect("balance");
    assert_eq!((balance.balance, balance.reserved), (CREDITS, 1_000));
    assert_eq!(
        status_of(&ledger, "msg_reaper_lost").await,
        Some(MessageStatus::Abandoned)
    );
    assert_eq!(
        status_of(&ledger, "msg_reaper_live").await,
        Some(MessageStatus::Reserved)
    );
}

/// A reap since a time reads only the reservations created since then (the recent days'
/// partitions); the reap of every day releases the older ones.
#[tokio::test]
async fn a_reap_since_a_time_leaves_older_rows_reserved_in_messages_to_the_reap_of_every_day() {
    let pg = PostgresServer::start().await;
    let (ledger, account_id) = a_beating_ledger(&pg).await;
    // All past the longest turn (an hour): any reap that reads them releases them. Two reserved
    // in `messages` by a process of before 0026; one held in `reservations`, read whole.
    for (id, age) in [
        ("msg_reaper_days_old", time::Duration::days(3)),
        ("msg_reaper_hours_old", time::Duration::hours(2)),
    ] {
        reserved_in_messages(&pg, &account_id, id, age).await;
    }
    ledger
        .reserve(reservation(
            &account_id,
            "msg_reaper_held_days",
            time::Duration::days(3),
        ))
        .await
        .expect("reserve");
    let (stale, max_turn) = (Duration::from_secs(30), Duration::from_secs(3_600));
    let since = time::OffsetDateTime::now_utc() - time::Duration::days(1);

    let recent = ledger
        .reap(stale, max_turn, Some(since))
        .await
        .expect("reap");
    assert_eq!(
        recent, 2,
        "the held turn and, of the rows in messages, the last day's only"
    );
    for id in ["msg_reaper_hours_old", "msg_reaper_held_days"] {
        assert_eq!(
            status_of(&ledger, id).await,
            Some(MessageStatus::Abandoned),
            "{id}"
        );
    }
    assert_eq!(
        status_of(&ledger, "msg_reaper_days_old").await,
        Some(MessageStatus::Reserved)
    );

    let every_day = ledger.reap(stale, max_turn, None).await.expect("reap");
    assert_eq!(every_day, 1);
    assert_eq!(
        status_of(&ledger, "msg_reaper_days_old").await,
        Some(MessageStatus::Abandoned)
    );
    let balance = ledger.balance(&account_id).await.expect("balance");
    assert_eq!((balance.balance, balance.reserved), (CREDITS, 0));
}

/// A pod's first reap reads every day: an orphan reserved in `messages` older than the recent
/// days' window (left by a process of before 0026 that died while every pod was down) is
/// released soon after a pod starts.
#[tokio::test]
async fn a_pods_first_reap_releases_an_orphan_older_than_the_recent_days() {
    let pg = PostgresServer::start().await;
    let (_, account_id) = database_with_an_account(&pg).await;
    reserved_in_messages(
        &pg,
        &account_id,
        "msg_reaper_week_old",
        time::Duration::days(7),
    )
    .await;

    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url()).arg("--reaper-stale-secs").arg("1")
    })
    .await;
    let pod = &cluster.pods[0];
    let account = poll_until(
        "the first reap to release the week-old orphan",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let account = pod.admin_account(&account_id).await;
            (account["reserved"].as_u64() == Some(0)).then_some(account)
        },
    )
    .await;
    assert_eq!(account["balance"].as_u64(), Some(CREDITS), "{account}");
    let status = pg
        .query("SELECT status FROM message_rows WHERE id = 'msg_reaper_week_old'")
        .await;
    assert_eq!(status.trim(), "abandoned");
}

#[tokio::test]
async fn a_pod_taken_for_dead_is_told_its_later_turns_cost_nothing_and_writes_them_unbilled() {
    let pg = PostgresServer::start().await;
    let (db, account_id) = database_with_an_account(&pg).await;
    let ledger = PostgresLedger::new(db.clone()).with_allotments(16, Duration::from_secs(60));
    ledger.heartbeat().await.expect("heartbeat");
    let held = ledger
        .reserve(reservation(
            &account_id,
            "msg_cut_off",
            time::Duration::ZERO,
        ))
        .await
        .expect("reserve");
    assert_eq!(held, 1_000);
    let allotments = "SELECT count(*) FROM allotments";
    assert_eq!(
        pg.query_i64(allotments).await,
        1,
        "not served from an allotment"
    );

    // Cut off from Postgres past the stale time: another pod's reaper returns its allotment.
    pg.query("UPDATE gateway_instances SET heartbeat_at = now() - interval '1 hour'")
        .await;
    let reaped = PostgresLedger::new(db)
        .reap(Duration::from_secs(30), Duration::from_secs(3_600), None)
        .await
        .expect("reap");
    assert_eq!(reaped, 1);
    assert_eq!(pg.query_i64(allotments).await, 0);

    // The turn ends afterwards: its row is written before its bill is told, and bills
    // nothing and moves no money, since its lease is gone.
    let told = ledger
        .settle(settlement_costing_1000("msg_cut_off"))
        .await
        .expect("settle");
    assert_eq!(told, 0, "told a bill its allotment no longer covers");
    let row = pg
        .query("SELECT status, billed FROM message_rows WHERE id = 'msg_cut_off'")
        .await;
    assert_eq!(row, "unbilled|0");
    let balance = ledger.balance(&account_id).await.expect("balance");
    assert_eq!((balance.balance, balance.reserved), (CREDITS, 0));
}

#[tokio::test]
async fn a_settle_postgres_refuses_is_told_0_counted_not_retried_and_fails_no_turn_batched_with_it()
{
    let pg = PostgresServer::start().await;
    let (db, account_id) = database_with_an_account(&pg).await;
    let mut others = Vec::new();
    for name in ["refused-account", "lane-account"] {
        let account = PostgresAccounts::new(db.clone())
            .create_account(name)
            .await
            .expect("account");
        PostgresLedger::new(db.clone())
            .add_credits(&account.id, CREDITS, &actor())
            .await
            .expect("add credits");
        others.push(account.id);
    }
    let (poisoned, lane) = (&others[0], &others[1]);
    let ledger = PostgresLedger::new(db.clone());
    ledger.heartbeat().await.expect("heartbeat");
    for (account, id) in [
        (&account_id, "msg_fine"),
        (poisoned, "msg_poisoned"),
        (lane, "msg_lane"),
    ] {
        ledger
            .reserve(reservation(account, id, time::Duration::ZERO))
            .await
            .expect("reserve");
    }
    // Its books broken behind the gateway's back: releasing its reservation would take its
    // `reserved` below zero, which the accounts CHECK refuses.
    pg.query(&format!(
        "UPDATE accounts SET reserved = 0 WHERE id = '{poisoned}'"
    ))
    .await;

    // The one settle lane held by a settle waiting for a locked account, so that the next two
    // settles queue and share one batch.
    let mut lock = db.pool().begin().await.expect("transaction");
    sqlx::query("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE")
        .bind(lane)
        .execute(&mut *lock)
        .await
        .expect("lock");
    let waiting = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.settle(settlement_costing_1000("msg_lane")).await }
    });
    poll_until(
        "the lane's settle to wait for the lock",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async {
            let waiting = pg
                .query_i64("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                .await;
            (waiting > 0).then_some(())
        },
    )
    .await;
    let mut both = Box::pin(async {
        tokio::join!(
            ledger.settle(settlement_costing_1000("msg_fine")),
            ledger.settle(settlement_costing_1000("msg_poisoned"))
        )
    });
    assert!(futures::poll!(&mut both).is_pending(), "settled at once");
    lock.rollback().await.expect("unlock");
    let (fine, refused) = both.await;

    assert_eq!(fine.expect("settle"), 1_000, "the fine turn failed with it");
    assert_eq!(refused.expect("settle"), 0, "a refused bill was told");
    assert_eq!(waiting.await.expect("task").expect("settle"), 1_000);
    assert_eq!(
        pg.query("SELECT status, billed FROM message_rows WHERE id = 'msg_fine'")
            .await,
        "completed|1000"
    );
    poll_until(
        "the refused turn's row to say it was not billed",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let row = pg
                .query("SELECT status, billed FROM message_rows WHERE id = 'msg_poisoned'")
                .await;
            (row == "unbilled|0").then_some(())
        },
    )
    .await;
    let metrics = e2e::Scrape::parse(&gateway_core::telemetry::metrics::render());
    assert_eq!(
        metrics.get("gateway_ledger_refused_total", &[("op", "settle")]),
        Some(1.0),
        "the refusal was not counted once (retried?)"
    );
    for account in [&account_id, poisoned, lane] {
        e2e::books::assert_rollups_match_rows(&pg, account).await;
    }
}

#[tokio::test]
async fn a_draining_pod_is_not_taken_for_dead_within_its_announced_time_even_when_silent() {
    let pg = PostgresServer::start().await;
    let (db, account_id) = database_with_an_account(&pg).await;
    let draining = PostgresLedger::new(db.clone());
    draining.heartbeat().await.expect("heartbeat");
    draining
        .reserve(reservation(
            &account_id,
            "msg_draining",
            time::Duration::minutes(1),
        ))
        .await
        .expect("reserve");
    draining
        .drain(Duration::from_secs(3_600))
        .await
        .expect("drain");
    // Silent since long before the stale time, as a draining pod cut off would be.
    pg.query("UPDATE gateway_instances SET heartbeat_at = now() - interval '1 hour'")
        .await;
    let reaper = PostgresLedger::new(db);
    let stale = Duration::from_secs(30);
    let max_turn = Duration::from_secs(3_600);

    assert_eq!(reaper.reap(stale, max_turn, None).await.expect("reap"), 0);
    let status = "SELECT status FROM message_rows WHERE id = 'msg_draining'";
    assert_eq!(pg.query(status).await, "reserved");

    // Past the time it announced, it is dead.
    pg.query("UPDATE gateway_instances SET draining_until = now() - interval '1 second'")
        .await;
    assert_eq!(reaper.reap(stale, max_turn, None).await.expect("reap"), 1);
    assert_eq!(pg.query(status).await, "abandoned");
}

#[tokio::test]
async fn a_pod_reaps_others_only_once_its_own_heartbeat_has_been_healthy_for_the_stale_time() {
    let mut pg = PostgresServer::start().await;
    let (db, _) = database_with_an_account(&pg).await;
    let ledger = PostgresLedger::new(db);
    assert!(!ledger.may_reap(Duration::ZERO), "never beaten");
    ledger.heartbeat().await.expect("heartbeat");
    assert!(ledger.may_reap(Duration::ZERO));
    assert!(
        !ledger.may_reap(Duration::from_secs(3_600)),
        "healthy for less than the stale time"
    );

    pg.stop().await;
    assert!(ledger.heartbeat().await.is_err(), "beat with Postgres down");
    assert!(
        !ledger.may_reap(Duration::ZERO),
        "reaps right after its own heartbeat failed"
    );
    pg.restart().await;
    poll_until(
        "the heartbeat to succeed again",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { ledger.heartbeat().await.ok() },
    )
    .await;
    assert!(ledger.may_reap(Duration::ZERO));
    assert!(!ledger.may_reap(Duration::from_secs(3_600)));
}
