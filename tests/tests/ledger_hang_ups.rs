//! Clients that hang up while their turn waits for Postgres. hyper drops a request's future
//! when its client goes away; the turn's reservation and settlement run on their own tasks, so
//! what they moved is finished all the same: nothing stays held, and the books balance. Each
//! rule is checked with turns reserved one by one in Postgres and with allotments.
//!
//! And clients that hang up on a non-streamed turn their upstream is answering: billed the
//! input the upstream processed, not the answer they never received (docs/ledger.md), as a
//! cut stream is billed its input and what it was sent.
//!
//! A psql session locks the account's row, so that the turn's statement waits for it; the
//! client hangs up while it waits; once the gateway logs that it dropped the turn in the middle
//! of that step, the lock is let go.

use std::time::Duration;

use e2e::books::RoutePrice;
use e2e::{message, Cluster, Gateway, KeySpec, PostgresServer};
use gateway_core::turn::DROPPED_MID_STEP;
use reqwest::Method;

const CREDITS: u64 = 50_000_000;

/// The simulated upstream repeats what it is told, four tokens a chunk, a chunk every 100 ms:
/// this takes it about three seconds, time enough to lock the account before it settles.
const SLOW_REPLY: &str = "one two three four five six seven eight nine ten eleven twelve \
    thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two \
    twenty-three twenty-four twenty-five twenty-six twenty-seven twenty-eight twenty-nine thirty \
    thirty-one thirty-two thirty-three thirty-four thirty-five thirty-six thirty-seven \
    thirty-eight thirty-nine forty forty-one forty-two forty-three forty-four forty-five";

#[derive(Clone, Copy, Debug)]
enum Reserving {
    /// `--allotment-turns 0`: every turn reserved in Postgres.
    TurnByTurn,
    /// `--allotment-turns 16`: turns take from an allotment the pod holds for the account.
    FromAllotments,
}

/// One pod on `pg`, its simulated upstream slow enough (100 ms a chunk, see [`SLOW_REPLY`]) to
/// lock the account between a turn's reservation and its settlement.
async fn pod(pg: &PostgresServer, reserving: Reserving) -> Cluster {
    Cluster::start(1, |b| {
        // The statements wait for the lock far longer than the test holds it.
        let b = b
            .database(&pg.url())
            .arg("--database-timeout-ms")
            .arg("10000")
            .chunk_delay_ms(100);
        match reserving {
            Reserving::TurnByTurn => b.arg("--allotment-turns").arg("0"),
            Reserving::FromAllotments => b.arg("--allotment-turns").arg("16"),
        }
    })
    .await
}

fn lock_account(account_id: &str) -> String {
    format!("SELECT 1 FROM accounts WHERE id = '{account_id}' FOR UPDATE")
}

/// Starts a turn whose client will hang up (the returned task aborted).
fn turn_to_hang_up(gw: &Gateway, secret: &str) -> tokio::task::JoinHandle<()> {
    let request = gw
        .request(Method::POST, "/v1/messages", Some(secret))
        .json(&message("svc/haiku", SLOW_REPLY, 256));
    tokio::spawn(async move {
        let _ = request.send().await;
    })
}

/// Waits until a statement waits for the lock, then hangs the client up, and waits for the
/// gateway to say it dropped the turn in the middle of that step, before the lock goes: the
/// proof that the hang-up happened where the test means it to.
async fn hang_up_while_waiting(
    gw: &Gateway,
    pg: &PostgresServer,
    client: tokio::task::JoinHandle<()>,
) {
    e2e::poll_until(
        "a statement to wait for the locked account",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { (pg.lock_waiters().await > 0).then_some(()) },
    )
    .await;
    let before = gw.stderr().matches(DROPPED_MID_STEP).count();
    client.abort();
    let _ = client.await;
    e2e::poll_until(
        "the gateway to drop the turn in the middle of its step",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { (gw.stderr().matches(DROPPED_MID_STEP).count() > before).then_some(()) },
    )
    .await;
}

/// Nothing held once the allotments are idle, and what the account lost is what its rows
/// billed. Returns the turn's row: (status, billed).
///
/// A refill started for the turn may land after the turn's own reservation was undone, so
/// `reserved` can read 0 for a moment with an allotment still to come; the rule is that both
/// are empty once the pod's allotments have been idle (2 s), so both are waited for together.
async fn books(gw: &Gateway, pg: &PostgresServer, account_id: &str) -> (String, u64) {
    let allotments = format!("SELECT count(*) FROM allotments WHERE account_id = '{account_id}'");
    let account = e2e::poll_until(
        "no credits reserved and no allotment held for the account",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let account = gw.admin_account(account_id).await;
            (account["reserved"].as_i64() == Some(0) && pg.query_i64(&allotments).await == 0)
                .then_some(account)
        },
    )
    .await;
    let balance = account["balance"].as_u64().expect("balance");
    let row = pg
        .query(&format!(
            "SELECT status, billed FROM message_rows WHERE account_id = '{account_id}'"
        ))
        .await;
    let (status, billed) = row
        .split_once('|')
        .unwrap_or_else(|| panic!("one row for the turn, found {row:?}"));
    let billed: u64 = billed.parse().expect("billed");
    assert_eq!(
        CREDITS - balance,
        billed,
        "the balance lost what the turn's row billed: {account}"
    );
    (status.to_string(), billed)
}

async fn hang_up_while_reserving(reserving: Reserving) {
    let pg = PostgresServer::start().await;
    let cluster = pod(&pg, reserving).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let lock = pg.hold_locks(&lock_account(&key.account_id)).await;

    let client = turn_to_hang_up(gw, &key.secret);
    hang_up_while_waiting(gw, &pg, client).await;
    lock.release().await;

    let (status, billed) = books(gw, &pg, &key.account_id).await;
    assert_eq!(
        (status.as_str(), billed),
        ("client_disconnected", 0),
        "{reserving:?}: the turn never reached its client"
    );
    // The pod serves the account as before.
    gw.post_messages(&key.secret, &message("svc/haiku", "hello", 16))
        .await
        .expect_ok();
}

#[tokio::test]
async fn a_client_that_hangs_up_while_its_turn_is_reserved_in_postgres_leaves_nothing_held_and_pays_nothing(
) {
    hang_up_while_reserving(Reserving::TurnByTurn).await;
}

#[tokio::test]
async fn a_client_that_hangs_up_while_its_allotment_is_granted_leaves_nothing_held_and_pays_nothing(
) {
    hang_up_while_reserving(Reserving::FromAllotments).await;
}

async fn hang_up_while_settling(reserving: Reserving) {
    let pg = PostgresServer::start().await;
    let cluster = pod(&pg, reserving).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let id = &key.account_id;

    let client = turn_to_hang_up(gw, &key.secret);
    // Reserved (a row, or the allotment it took from), and the upstream still answering.
    let reserved = match reserving {
        Reserving::TurnByTurn => format!(
            "SELECT count(*) FROM message_rows WHERE account_id = '{id}' AND status = 'reserved'"
        ),
        Reserving::FromAllotments => {
            format!("SELECT count(*) FROM allotments WHERE account_id = '{id}'")
        }
    };
    e2e::poll_until(
        "the turn's credits to be reserved",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || async { (pg.query_i64(&reserved).await > 0).then_some(()) },
    )
    .await;
    let lock = pg.hold_locks(&lock_account(id)).await;
    hang_up_while_waiting(gw, &pg, client).await;
    lock.release().await;

    // The bill was settled before the answer could be sent: it stands, and is all it moved.
    let (status, billed) = books(gw, &pg, id).await;
    assert_eq!(status, "completed", "{reserving:?}");
    assert!(
        billed > 0,
        "{reserving:?}: a completed turn bills its usage"
    );
    gw.post_messages(&key.secret, &message("svc/haiku", "hello", 16))
        .await
        .expect_ok();
}

#[tokio::test]
async fn a_client_that_hangs_up_while_its_turn_is_settled_in_postgres_leaves_nothing_held() {
    hang_up_while_settling(Reserving::TurnByTurn).await;
}

#[tokio::test]
async fn a_client_that_hangs_up_while_its_allotted_turn_is_written_leaves_nothing_held() {
    hang_up_while_settling(Reserving::FromAllotments).await;
}

/// A non-streamed turn's client hangs up once the upstream has read its input and begun
/// answering (its first event came through the turn): the row ends `client_disconnected`,
/// billed the price of its input alone, not of the output generated before the cut, which
/// its client never received; the balance lost exactly that, once. A turn whose client waits
/// for its answer is then told what its row bills.
async fn hang_up_while_answered(reserving: Reserving) {
    let pg = PostgresServer::start().await;
    let cluster = pod(&pg, reserving).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let id = &key.account_id;
    let haiku = [("model", "svc/haiku")];

    let client = turn_to_hang_up(gw, &key.secret);
    e2e::poll_until(
        "the upstream to begin the turn's answer",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || async {
            let first = gw
                .metrics()
                .await
                .get("gateway_time_to_first_token_seconds_count", &haiku);
            (first.unwrap_or(0.0) >= 1.0).then_some(())
        },
    )
    .await;
    // Some output generated too, most likely (a chunk every 100 ms); nothing is asserted of
    // how much, only that none of it is billed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.abort();
    let _ = client.await;

    let (status, billed) = books(gw, &pg, id).await;
    let usage = pg
        .query(&format!(
            "SELECT input_tokens, cache_read_input_tokens + cache_creation_input_tokens, output_tokens \
             FROM message_rows WHERE account_id = '{id}'"
        ))
        .await;
    let tokens: Vec<u64> = usage
        .split('|')
        .map(|n| n.trim().parse().expect("a token count"))
        .collect();
    let [input, cached, output] = tokens[..] else {
        panic!("one row's usage, found {usage:?}");
    };
    assert_eq!(status, "client_disconnected", "{reserving:?}");
    assert!(input > 0, "{reserving:?}: the row names the input it bills");
    assert_eq!(
        cached, 0,
        "{reserving:?}: the simulated upstream caches nothing"
    );
    let price = RoutePrice::of("svc/haiku");
    assert_eq!(
        billed,
        price.credits(input, 0),
        "{reserving:?}: billed its {input} input tokens, none of the {output} output tokens it never received"
    );

    // A turn waited for is told its row's bill, and that is all else the balance lost.
    let answer = gw
        .post_messages(&key.secret, &message("svc/haiku", "hello", 16))
        .await
        .expect_ok();
    let told = answer["usage"]["credits_consumed"]
        .as_u64()
        .expect("credits_consumed");
    let row = e2e::poll_until(
        "the answered turn's row",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let row = pg
                .query(&format!(
                    "SELECT status, billed FROM message_rows \
                     WHERE account_id = '{id}' AND status <> 'client_disconnected'"
                ))
                .await;
            row.starts_with("completed|").then_some(row)
        },
    )
    .await;
    assert_eq!(row, format!("completed|{told}"), "{reserving:?}");
    assert!(told > 0);
    let balance = gw.admin_account(id).await["balance"]
        .as_u64()
        .expect("balance");
    assert_eq!(CREDITS - balance, billed + told, "{reserving:?}");
}

#[tokio::test]
async fn a_client_that_hangs_up_on_a_json_turn_being_answered_pays_its_input_not_the_answer() {
    hang_up_while_answered(Reserving::TurnByTurn).await;
}

#[tokio::test]
async fn a_client_that_hangs_up_on_an_allotted_json_turn_being_answered_pays_its_input_not_the_answer(
) {
    hang_up_while_answered(Reserving::FromAllotments).await;
}
