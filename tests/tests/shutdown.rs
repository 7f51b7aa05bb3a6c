//! SIGTERM: the gateway reports not ready and, after its shutdown delay, stops accepting, lets
//! open turns finish within the grace period, ends
//! the rest (a stream with an SSE `error` event that tells its bill, a JSON turn with 503),
//! settles each once, and exits 0. A stream is billed for what its client was sent, and told
//! so; a JSON turn cut before its answer is billed nothing, since its client got nothing and
//! will pay for its retry.
//!
//! The billing tests run `serve` on Postgres, whose ledger can be read after the process exits.

use std::time::{Duration, Instant};

use e2e::books::{received_text, RoutePrice};
use e2e::sse::{assemble_message_stream, SseEvent};
use e2e::*;
use serde_json::{json, Value};

#[tokio::test]
async fn sigterm_with_no_open_stream_exits_0_promptly() {
    let mut gw = Gateway::start().await;
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    gw.send_sigterm();
    // Well within the default 30 s grace period: nothing was open to wait for.
    let status = gw.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        gw.logs()
    );
}

#[tokio::test]
async fn sigterm_lets_an_open_stream_finish_within_the_grace_period_then_exits_0() {
    let grace = Duration::from_secs(60);
    let mut gw = Gateway::builder()
        .chunk_delay_ms(100)
        .shutdown_grace_secs(grace.as_secs())
        .start()
        .await;
    let body = message_stream("svc/haiku", &words(40), 256);
    let mut stream = gw.stream("/v1/messages", &gw.key, &body).await;
    stream.expect_sse();
    let mut events = Vec::new();
    stream.read_until("content_block_delta", &mut events).await;

    gw.send_sigterm();
    let signalled = Instant::now();
    let before_signal = events.len();

    // No new work is accepted while draining: the connection is refused (or, had it been
    // accepted just before, answered 503 with the envelope).
    let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
    poll_until(
        "the listener to stop accepting",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            match fresh
                .get(gw.url("/v1/models"))
                .bearer_auth(&gw.key)
                .send()
                .await
            {
                Err(_) => Some(()),
                Ok(resp) if resp.status() == 503 => {
                    Resp::read(resp).await.expect_error(503, "api_error");
                    Some(())
                }
                Ok(_) => None,
            }
        },
    )
    .await;

    while let Some(event) = stream.next_event_within(grace).await {
        events.push(event);
    }
    assert!(
        stream.transport_error.is_none(),
        "stream broke: {:?}",
        stream.transport_error
    );
    let after_signal = events[before_signal..]
        .iter()
        .filter(|e| e.name() == "content_block_delta")
        .count();
    assert!(
        after_signal >= 3,
        "only {after_signal} deltas after SIGTERM: the stream was not open long"
    );
    let done = assemble_message_stream(&events);
    assert!(done.text().ends_with(&words(40)), "{}", done.text());
    assert_eq!(done.delta["stop_reason"], "end_turn");

    let status = gw.wait_exit(grace).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        gw.logs()
    );
    // Once its last turn has ended the process has nothing to wait for.
    assert!(
        signalled.elapsed() < grace,
        "waited out the whole grace period with no turn open\n{}",
        gw.logs()
    );
}

#[tokio::test]
async fn sigterm_reports_not_ready_but_serves_new_connections_for_the_shutdown_delay_with_connection_close(
) {
    let delay = Duration::from_secs(4);
    let mut gw = Gateway::builder()
        .shutdown_delay_secs(delay.as_secs())
        .start()
        .await;
    assert_eq!(gw.admin_get("/readyz").await.status, 200);
    gw.send_sigterm();
    let signalled = Instant::now();
    poll_until(
        "readiness to report the drain",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { (gw.admin_get("/readyz").await.status == 503).then_some(()) },
    )
    .await;
    // A client that connects now (its load balancer has not yet heard) is served in full, and
    // told not to keep the connection.
    let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
    let response = fresh
        .post(gw.url("/v1/messages"))
        .bearer_auth(&gw.key)
        .json(&message("svc/haiku", "hi", 16))
        .send()
        .await
        .expect("a new connection within the shutdown delay is accepted");
    assert!(
        signalled.elapsed() < delay,
        "the check ran after the delay; it proves nothing"
    );
    assert_eq!(
        response.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    Resp::read(response).await.expect_ok();
    // After the delay the listener closes and, with nothing open, the process exits 0.
    exits_0(&mut gw).await;
    assert!(
        signalled.elapsed() >= delay,
        "exited before its shutdown delay was over\n{}",
        gw.logs()
    );
}

/// One `serve` pod with its ledger in `pg`, simulated chunks `chunk_delay_ms` apart.
async fn pod_on_postgres(pg: &PostgresServer, chunk_delay_ms: u64, grace_secs: u64) -> Cluster {
    Cluster::start(1, |b| {
        b.database(&pg.url())
            .chunk_delay_ms(chunk_delay_ms)
            .shutdown_grace_secs(grace_secs)
    })
    .await
}

/// The ledger row of message `id`, read from Postgres: (status, reserved, billed).
async fn ledger_row(pg: &PostgresServer, id: &str) -> (String, u64, u64) {
    let rows = pg
        .query(&format!(
            "SELECT status, reserved, billed FROM message_rows WHERE id = '{id}'"
        ))
        .await;
    let fields: Vec<&str> = rows.split('|').collect();
    match fields[..] {
        [status, reserved, billed] => (
            status.to_string(),
            reserved.parse().expect("reserved"),
            billed.parse().expect("billed"),
        ),
        _ => panic!("not exactly one ledger row for {id}: {rows:?}"),
    }
}

/// An account's (balance, reserved), read from Postgres.
async fn account_books(pg: &PostgresServer, account_id: &str) -> (i64, i64) {
    let row = pg
        .query(&format!(
            "SELECT balance, reserved FROM accounts WHERE id = '{account_id}'"
        ))
        .await;
    let (balance, reserved) = row
        .split_once('|')
        .unwrap_or_else(|| panic!("no account {account_id}: {row:?}"));
    (
        balance.parse().expect("balance"),
        reserved.parse().expect("reserved"),
    )
}

/// Waits until the account's credits are held for a turn (its own reservation, or the
/// allotment it takes them from), so that the turn is under way.
async fn credits_held(pg: &PostgresServer, account_id: &str) {
    poll_until(
        "credits held for the turn",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { (account_books(pg, account_id).await.1 > 0).then_some(()) },
    )
    .await
}

/// Waits for the process to exit (hanging is the failure) and expects status 0.
async fn exits_0(gw: &mut Gateway) {
    let status = gw.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        gw.logs()
    );
}

/// A stream of each endpoint, on `svc/haiku`: (path, body).
fn one_stream_of_each_endpoint() -> [(&'static str, Value); 3] {
    let text = words(30);
    [
        ("/v1/messages", message_stream("svc/haiku", &text, 256)),
        (
            "/v1/chat/completions",
            chat_stream_body("svc/haiku", &text, Some(256)),
        ),
        (
            "/v1/responses",
            json!({"model": "svc/haiku", "input": text, "stream": true, "max_output_tokens": 256}),
        ),
    ]
}

/// The turn id a stream's first event carries.
fn stream_id(path: &str, first: &Value) -> String {
    let id = match path {
        "/v1/messages" => &first["message"]["id"],
        "/v1/responses" => &first["response"]["id"],
        _ => &first["id"],
    };
    id.as_str()
        .unwrap_or_else(|| panic!("{path}: no id in the first event: {first}"))
        .to_owned()
}

/// What the last event of a stream cut by shutdown says: (its usage, its error message).
fn cut_stream_end(path: &str, last: &SseEvent) -> (Value, String) {
    let data = last.json();
    let (usage, error) = match path {
        "/v1/responses" => {
            assert_eq!(last.name(), "response.failed", "{data}");
            (&data["response"]["usage"], &data["response"]["error"])
        }
        _ => {
            assert_eq!(data["type"], "error", "{path}: {data}");
            assert_eq!(data["error"]["type"], "api_error", "{data}");
            (&data["usage"], &data["error"])
        }
    };
    let message = error["message"].as_str().unwrap_or_default().to_owned();
    (usage.clone(), message)
}

#[tokio::test]
async fn a_stream_that_outlives_the_grace_period_ends_telling_its_bill_which_is_the_price_of_what_it_sent(
) {
    let pg = PostgresServer::start().await;
    let mut cluster = pod_on_postgres(&pg, 1_000, 1).await;
    let gw = &mut cluster.pods[0];
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let (before, _) = account_books(&pg, &key.account_id).await;
    let mut streams = Vec::new();
    for (path, body) in one_stream_of_each_endpoint() {
        let mut stream = gw.stream(path, &key.secret, &body).await;
        stream.expect_sse();
        let first = stream
            .next_event_within(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{path}: no first event"));
        let id = stream_id(path, &first.json());
        streams.push((path, id, stream, vec![first]));
    }
    assert!(
        account_books(&pg, &key.account_id).await.1 > 0,
        "no credits held for the turns in flight"
    );

    gw.send_sigterm();
    let signalled = Instant::now();
    let price = RoutePrice::of("svc/haiku");
    let mut told_total = 0;
    let mut cut = Vec::new();
    for (path, id, mut stream, mut events) in streams {
        // Hanging here is the failure: the cut comes after the 1 s grace period.
        while let Some(event) = stream.next_event_within(Duration::from_secs(30)).await {
            events.push(event);
        }
        assert!(
            signalled.elapsed() >= Duration::from_millis(900),
            "{path}: cut before the grace period"
        );
        let last = events.last().expect("events");
        let (usage, message) = cut_stream_end(path, last);
        assert!(
            message.contains("billed") && !message.contains("retry"),
            "{path}: the error must say the part sent is billed, not invite a blind retry: {message}"
        );
        let told = usage["credits_consumed"]
            .as_u64()
            .unwrap_or_else(|| panic!("{path}: the last event does not tell the bill: {usage}"));
        let input = usage["input_tokens"]
            .as_u64()
            .or(usage["prompt_tokens"].as_u64())
            .expect("input tokens");
        let payloads: Vec<Value> = events
            .iter()
            .filter_map(|e| serde_json::from_str(&e.data).ok())
            .collect();
        let received = received_text(&payloads);
        assert!(
            !received.is_empty(),
            "{path}: nothing streamed before the cut"
        );
        assert!(
            !events
                .iter()
                .any(|e| ["message_stop", "response.completed"].contains(&e.name())),
            "{path}: finished and cut: {events:#?}"
        );
        told_total += told;
        cut.push((path, id, told, price.cut_stream(input, &received), received));
    }
    exits_0(gw).await;

    // The books after the process is gone: each row settled once, billed what it told, which
    // is the price of its input and of the output its client received; the balance down by
    // exactly that.
    for (path, id, told, price_of_received, received) in cut {
        let (status, _, billed) = ledger_row(&pg, &id).await;
        assert_eq!(status, "interrupted", "{path}\n{}", gw.logs());
        assert_eq!(billed, told, "{path}: told other than billed");
        assert_eq!(
            billed, price_of_received,
            "{path}: billed other than its input and the output received ({received:?})"
        );
    }
    let (after, held) = account_books(&pg, &key.account_id).await;
    assert_eq!(held, 0, "credits still held after the pod exited");
    assert_eq!(
        before - after,
        told_total as i64,
        "the balance moved by other than the bills told"
    );
}

#[tokio::test]
async fn a_json_turn_cut_by_shutdown_gets_503_and_is_billed_nothing() {
    let pg = PostgresServer::start().await;
    let mut cluster = pod_on_postgres(&pg, 1_000, 1).await;
    let gw = &mut cluster.pods[0];
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let (before, _) = account_books(&pg, &key.account_id).await;
    let body = message("svc/haiku", &words(30), 256);

    let (cut, ()) = tokio::join!(gw.post_messages(&key.secret, &body), async {
        credits_held(&pg, &key.account_id).await;
        gw.send_sigterm();
    });
    cut.expect_error(503, "api_error");
    assert_eq!(cut.retry_after(), 1, "another pod serves the retry at once");
    let id = cut
        .header("request-id")
        .expect("request-id of the cut turn");
    exits_0(gw).await;

    let (status, _, billed) = ledger_row(&pg, &id).await;
    assert_eq!(status, "interrupted", "{}", gw.logs());
    assert_eq!(billed, 0, "billed for an answer its client never received");
    assert_eq!(
        account_books(&pg, &key.account_id).await,
        (before, 0),
        "the balance moved for a turn that was not delivered"
    );
}

#[tokio::test]
async fn a_json_turn_in_flight_at_sigterm_finishes_within_the_grace_period_and_is_billed_as_told() {
    let pg = PostgresServer::start().await;
    let mut cluster = pod_on_postgres(&pg, 100, 60).await;
    let gw = &mut cluster.pods[0];
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let (before, _) = account_books(&pg, &key.account_id).await;
    let body = message("svc/haiku", &words(30), 256);

    let (answer, ()) = tokio::join!(gw.post_messages(&key.secret, &body), async {
        credits_held(&pg, &key.account_id).await;
        gw.send_sigterm();
    });
    let answer = answer.expect_ok();
    let id = answer["id"].as_str().expect("message id").to_string();
    assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
    assert!(response_text(&answer).ends_with(&words(30)), "{answer}");
    let told = credits_of(&answer);
    exits_0(gw).await;

    let (status, _, billed) = ledger_row(&pg, &id).await;
    assert_eq!(status, "completed");
    assert_eq!(billed, told, "billed other than the answer said");
    assert_eq!(
        account_books(&pg, &key.account_id).await,
        (before - told as i64, 0)
    );
}
