//! The usage rollups (issue 35, part 3): per account, hour, key and model, written by the
//! statement that makes a row's bill final, so they always equal the rows grouped. After
//! concurrent turns through `serve` (some failed upstream, some streams cut by their client,
//! on a pod that reserves turn by turn and one that takes from allotments), the rollups are
//! exactly the rows' GROUP BY and `GET /v1/usage` reads them; a turn counts once, in the hour
//! (and day) its row was created, whenever it settles; and the migration's backfill of a
//! ledger filled first equals its rows.

use std::sync::Arc;
use std::time::Duration;

use e2e::books::assert_rollups_match_rows;
use e2e::contract::actor;
use e2e::ledger::reserve;
use e2e::{
    message, message_stream, poll_until, Cluster, KeySpec, ManifestDir, MockUpstream, MockUsage,
    PostgresServer, Reply, UpstreamDef,
};
use futures::future::join_all;
use store::accounts::{Accounts, PostgresAccounts};
use store::db::Database;
use store::ledger::fixtures::turn_record;
use store::ledger::{
    Ledger, MemoryLedger, MessageRecord, MessageStatus, PostgresLedger, Settlement,
};
use store::usage::TokenUsage;
use time::OffsetDateTime;

const CREDITS: u64 = 100_000_000;
/// Turns sent at once, JSON and streamed; a fifth of the JSON ones fail upstream.
const JSON_TURNS: usize = 40;
const STREAMS: usize = 12;

/// The simulated upstream's slow answer, time enough for its client to hang up mid-stream.
const SLOW_REPLY: &str = "one two three four five six seven eight nine ten eleven twelve \
    thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty";

/// Two pods on `pg`, both routed to `mock`: one reserving every turn in Postgres (settle),
/// one serving from allotments (the rows written after the turn).
async fn pods(pg: &PostgresServer, mock: &MockUpstream) -> Cluster {
    let url = pg.url();
    let turn_by_turn = |b: e2e::GatewayBuilder| b.database(&url).arg("--allotment-turns").arg("0");
    let allotted = |b: e2e::GatewayBuilder| b.database(&url).arg("--allotment-turns").arg("16");
    Cluster::start_on(
        ManifestDir::cluster_routed(&[UpstreamDef::anthropic(mock)]),
        &[&turn_by_turn, &allotted],
    )
    .await
}

/// Sends the turns of two keys of one account over both pods at once: JSON turns with cache
/// usage (every fifth failing upstream) on two models, then streams cut by their clients
/// after their first events. Waits until no row is left `reserved`; returns the account and
/// how many turns were answered 200.
async fn concurrent_turns(
    cluster: &Cluster,
    mock: &MockUpstream,
    pg: &PostgresServer,
) -> (String, usize) {
    let gw = &cluster.pods[0];
    let first = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let second = gw
        .mint_key(&first.account_id, &KeySpec::tier("enterprise"))
        .await;
    let keys = [first.secret.clone(), second.secret.clone()];
    mock.push((0..JSON_TURNS).map(|i| {
        if i % 5 == 4 {
            Reply::status(500)
        } else {
            Reply::text("rolled up").usage(MockUsage {
                input: 10 + i as u64,
                output: 3,
                cache_read: 7 * i as u64,
                cache_write: 5,
            })
        }
    }));
    let answers = join_all((0..JSON_TURNS).map(|i| {
        let model = if i % 3 == 0 {
            "svc/sonnet"
        } else {
            "svc/haiku"
        };
        let (pod, key) = (cluster.pod(i), &keys[i % 2]);
        async move { pod.post_messages(key, &message(model, "hello", 64)).await }
    }))
    .await;
    let served = answers.iter().filter(|a| a.status == 200).count();

    mock.push(
        (0..STREAMS).map(|_| Reply::text(SLOW_REPLY).chunk_delay(Duration::from_millis(100))),
    );
    join_all((0..STREAMS).map(|i| {
        let (pod, key) = (cluster.pod(i), &keys[i % 2]);
        async move {
            let mut stream = pod
                .stream(
                    "/v1/messages",
                    key,
                    &message_stream("svc/haiku", "hello", 64),
                )
                .await;
            for _ in 0..3 {
                stream.next_event().await;
            }
            stream.disconnect();
        }
    }))
    .await;
    let account = first.account_id.clone();
    poll_until(
        "every turn settled",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let open = pg
                .query_i64(&format!(
                    "SELECT count(*) FROM message_rows WHERE account_id = '{account}'
                     AND status = 'reserved'"
                ))
                .await;
            (open == 0).then_some(())
        },
    )
    .await;
    (first.account_id, served + STREAMS)
}

/// How many of the account's rows end in `statuses`.
async fn rows_in(pg: &PostgresServer, account: &str, statuses: &str) -> i64 {
    pg.query_i64(&format!(
        "SELECT count(*) FROM messages WHERE account_id = '{account}' AND status IN ({statuses})"
    ))
    .await
}

#[tokio::test]
async fn after_concurrent_turns_failures_and_cut_streams_the_rollups_equal_the_rows_grouped() {
    let pg = PostgresServer::start().await;
    let mock = MockUpstream::start().await;
    let cluster = pods(&pg, &mock).await;
    let (account, answered) = concurrent_turns(&cluster, &mock, &pg).await;

    let completed = rows_in(&pg, &account, "'completed'").await;
    let failed = rows_in(&pg, &account, "'failed'").await;
    let cut = rows_in(&pg, &account, "'client_disconnected', 'interrupted'").await;
    assert!(
        completed >= (JSON_TURNS / 2) as i64
            && failed >= 1
            && cut >= 1
            && answered >= JSON_TURNS / 2,
        "{answered} turns answered; rows: {completed} completed, {failed} failed, {cut} cut"
    );
    let rolled = assert_rollups_match_rows(&pg, &account).await;
    assert_eq!(
        rolled,
        completed + failed + cut + rows_in(&pg, &account, "'unbilled', 'abandoned'").await
    );

    // GET /v1/usage reads the rollups: its totals are the rows'.
    let key = cluster.pods[0]
        .mint_key(&account, &KeySpec::tier("enterprise"))
        .await;
    let report = cluster.pods[1]
        .get("/v1/usage", &key.secret)
        .await
        .expect_ok();
    let served_rows = pg
        .query(&format!(
            "SELECT count(*) || '|' || sum(billed) || '|' || sum(cache_read_input_tokens)
             FROM messages WHERE account_id = '{account}'
             AND status NOT IN ('reserved', 'failed', 'abandoned')"
        ))
        .await;
    let totals = &report["totals"];
    assert_eq!(
        format!(
            "{}|{}|{}",
            totals["requests"], totals["credits"], totals["cache_read_input_tokens"]
        ),
        served_rows,
        "{report}"
    );
}

#[tokio::test]
async fn the_migrations_backfill_of_a_filled_ledger_equals_its_rows() {
    let pg = PostgresServer::start().await;
    let mock = MockUpstream::start().await;
    let cluster = pods(&pg, &mock).await;
    let (account, answered) = concurrent_turns(&cluster, &mock, &pg).await;
    assert!(answered >= JSON_TURNS / 2, "only {answered} turns answered");
    drop(cluster);

    // The ledger as the code of before migration 0017 left it: rows naming their routes and
    // upstreams (0025 keys them), no rollups.
    pg.query(
        "UPDATE messages m SET model = r.model, served_model = r.served_model,
             endpoint = r.endpoint, route_id = NULL,
             provider = u.provider, upstream = u.upstream, upstream_model = u.upstream_model,
             upstream_id = NULL
         FROM message_routes r, message_upstreams u
         WHERE r.id = m.route_id AND u.id = m.upstream_id;
         DROP TABLE usage_rollups; DELETE FROM _sqlx_migrations WHERE version = 17",
    )
    .await;
    pg.gateway_cli(&["migrate"]).await.expect("gateway migrate");

    let rolled = assert_rollups_match_rows(&pg, &account).await;
    assert!(
        rolled >= (JSON_TURNS / 2) as i64,
        "only {rolled} rows rolled up"
    );
}

/// A ledger (two for Postgres: two pods) and a funded account on it.
struct Books {
    ledgers: Vec<Arc<dyn Ledger>>,
    account_id: String,
    pg: Option<PostgresServer>,
}

async fn postgres() -> Books {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(5)).expect("url");
    db.migrate().await.expect("migrate");
    let account = PostgresAccounts::new(db.clone())
        .create_account("rollups")
        .await
        .expect("account");
    let mut ledgers: Vec<Arc<dyn Ledger>> = Vec::new();
    for _ in 0..2 {
        let ledger = PostgresLedger::new(db.clone());
        ledger.heartbeat().await.expect("heartbeat");
        ledgers.push(Arc::new(ledger));
    }
    ledgers[0]
        .add_credits(&account.id, CREDITS, &actor())
        .await
        .expect("credits");
    Books {
        ledgers,
        account_id: account.id,
        pg: Some(pg),
    }
}

async fn in_process() -> Books {
    let ledger = MemoryLedger::default();
    ledger
        .add_credits("acct_rollups", CREDITS, &actor())
        .await
        .expect("credits");
    Books {
        ledgers: vec![Arc::new(ledger)],
        account_id: "acct_rollups".to_owned(),
        pg: None,
    }
}

/// A turn created one second before midnight (UTC) that settles now, on another pod, is
/// counted once, on the day (and in the hour) its row was created; the day it settled has
/// none of it.
async fn a_turn_settled_after_its_hour_ends_counts_once_in_the_hour_it_was_created(books: Books) {
    let now = OffsetDateTime::now_utc();
    let created = now.replace_time(time::Time::MIDNIGHT) - time::Duration::seconds(1);
    let record = MessageRecord {
        created_at: created,
        ..turn_record("msg_across_midnight", &books.account_id, "key_rollups")
    };
    let held = reserve(books.ledgers[0].as_ref(), record).await;
    let settling = books.ledgers.last().expect("a ledger");
    let usage = TokenUsage {
        input_tokens: 11,
        output_tokens: 7,
        ..TokenUsage::default()
    };
    let billed = settling
        .settle(Settlement {
            cost: 600,
            usage,
            latency_ms: 1,
            ..Settlement::nothing("msg_across_midnight".into(), MessageStatus::Completed)
        })
        .await
        .expect("settle");
    assert_eq!((held, billed), (1_000, 600));
    // A replayed settle changes nothing, the rollups included.
    settling
        .settle(Settlement::nothing(
            "msg_across_midnight".into(),
            MessageStatus::Completed,
        ))
        .await
        .expect("replay");

    let (yesterday, today) = (created.date(), now.date());
    let ledger = &books.ledgers[0];
    let then = ledger
        .usage(&books.account_id, yesterday, yesterday)
        .await
        .expect("usage");
    assert_eq!(then.len(), 1, "{then:?}");
    let totals = then[0].totals;
    assert_eq!(
        (
            then[0].date,
            totals.requests,
            totals.credits,
            totals.input_tokens,
            totals.output_tokens
        ),
        (yesterday, 1, 600, 11, 7)
    );
    let settled_day = ledger
        .usage(&books.account_id, today, today)
        .await
        .expect("usage");
    assert!(
        settled_day.is_empty(),
        "counted on the day it settled: {settled_day:?}"
    );
    if let Some(pg) = &books.pg {
        assert_eq!(
            pg.query("SELECT hour AT TIME ZONE 'UTC', turns, credits FROM usage_rollups")
                .await,
            format!("{} 23:00:00|1|600", yesterday),
        );
        assert_rollups_match_rows(pg, &books.account_id).await;
    }
}

e2e::contract! {
    fixtures { in_process, postgres }
    rules { a_turn_settled_after_its_hour_ends_counts_once_in_the_hour_it_was_created }
}

/// 900 turns of one key and model are one rollup row per hour they started in, however many
/// statements settled them. Prints what they take on disk (`--no-capture`; the figures of
/// docs/benchmarks.md, "Usage rollups: statements, commits and bytes per turn"): the rows, the
/// rollups, and the commits the database saw meanwhile.
#[tokio::test]
async fn the_turns_of_one_key_and_model_in_an_hour_are_one_rollup_row() {
    let pg = PostgresServer::start().await;
    let url = pg.url();
    let cluster = Cluster::start(1, |b| b.database(&url).arg("--allotment-turns").arg("0")).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let body = message("svc/haiku", "hello", 16);
    let commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    let before = pg.query_i64(commits).await;
    let mut served = 0;
    for _ in 0..30 {
        let answers = join_all((0..30).map(|_| gw.post_messages(&key.secret, &body))).await;
        served += answers.iter().filter(|a| a.status == 200).count();
    }
    assert_eq!(served, 900);
    let account = &key.account_id;
    let rows = assert_rollups_match_rows(&pg, account).await;
    assert_eq!(rows, 900);
    let hours = pg
        .query_i64(&format!(
            "SELECT count(DISTINCT date_trunc('hour', created_at, 'UTC')) FROM messages
             WHERE account_id = '{account}'"
        ))
        .await;
    let rollups = pg
        .query_i64(&format!(
            "SELECT count(*) FROM usage_rollups WHERE account_id = '{account}'"
        ))
        .await;
    assert_eq!(rollups, hours);
    let commits = pg.query_i64(commits).await - before;
    let sizes = pg
        .query(
            "SELECT pg_total_relation_size('messages') || ' bytes of messages, '
             || pg_total_relation_size('usage_rollups') || ' bytes of usage_rollups'",
        )
        .await;
    let scrape = gw.metrics().await;
    let statements = |op| scrape.get("gateway_ledger_batch_turns_count", &[("op", op)]);
    eprintln!(
        "900 turns: {sizes}; {commits} commits; ledger statements: reserve {:?}, settle {:?}",
        statements("reserve"),
        statements("settle")
    );
}
