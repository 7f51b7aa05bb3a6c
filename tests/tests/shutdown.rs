//! SIGTERM: the gateway stops accepting, lets open streams finish within the grace period,
//! ends the rest with an SSE `error` event, settles them once, and exits 0.

use std::time::{Duration, Instant};

use e2e::sse::assemble_message_stream;
use e2e::*;

#[tokio::test]
async fn sigterm_with_no_open_stream_exits_0_promptly() {
    let mut gw = Gateway::start().await;
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    gw.send_sigterm();
    let status = gw.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        gw.logs()
    );
}

#[tokio::test]
async fn sigterm_lets_an_open_stream_finish_within_the_grace_period_then_exits_0() {
    let mut gw = Gateway::builder()
        .chunk_delay_ms(100)
        .shutdown_grace_secs(20)
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

    // No new work is accepted while draining.
    let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
    let late = poll_until(
        "the listener to stop accepting",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async {
            match fresh
                .get(gw.url("/v1/models"))
                .bearer_auth(&gw.key)
                .send()
                .await
            {
                Err(e) => Some(format!("refused: {e}")),
                Ok(resp) if resp.status() == 503 => Some("503".to_string()),
                Ok(_) => None,
            }
        },
    )
    .await;
    assert!(!late.is_empty());

    while let Some(event) = stream.next_event_within(Duration::from_secs(20)).await {
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

    let status = gw.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        gw.logs()
    );
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "exited after the grace period"
    );
}

#[tokio::test]
async fn a_stream_that_outlives_the_grace_period_ends_with_an_error_event_and_is_billed_once() {
    let mut gw = Gateway::builder()
        .chunk_delay_ms(1_000)
        .shutdown_grace_secs(1)
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let mut stream = gw
        .stream(
            "/v1/messages",
            &key.secret,
            &message_stream("svc/haiku", &words(30), 256),
        )
        .await;
    stream.expect_sse();
    let mut events = Vec::new();
    let start = stream.read_until("message_start", &mut events).await;
    let id = start.json()["message"]["id"].as_str().unwrap().to_string();
    let in_flight = gw.message_record(&id).await;
    assert!(
        in_flight["reserved"].as_u64().is_some_and(|r| r > 0),
        "{in_flight}"
    );
    assert_eq!(
        in_flight["billed"], 0,
        "billed before the turn ended: {in_flight}"
    );

    gw.send_sigterm();
    let signalled = Instant::now();
    while let Some(event) = stream.next_event_within(Duration::from_secs(10)).await {
        events.push(event);
    }
    let cut_after = signalled.elapsed();
    let last = events.last().expect("events");
    assert_eq!(
        last.name(),
        "error",
        "the stream does not end with an error event: {events:#?}"
    );
    let error = last.json();
    assert_eq!(error["type"], "error");
    assert!(
        error["error"]["type"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{error}"
    );
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{error}"
    );
    assert!(
        !events.iter().any(|e| e.name() == "message_stop"),
        "message_stop and error: {events:#?}"
    );
    assert!(
        cut_after >= Duration::from_millis(900),
        "cut before the grace period: {cut_after:?}"
    );
    assert!(
        cut_after < Duration::from_secs(6),
        "cut long after the 1 s grace period: {cut_after:?}"
    );

    // The ledger, if the admin listener still answers after the cut: the turn is settled
    // once, within its reservation, and the balance moved by exactly what was billed. (The
    // standalone gateway closes both listeners on SIGTERM and keeps its ledger in memory, so
    // usually nothing is left to read.)
    let settled = gw.try_admin_get(&format!("/admin/messages/{id}")).await;
    let account = gw
        .try_admin_get(&format!("/admin/accounts/{}", key.account_id))
        .await;
    let status = gw.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        gw.logs()
    );

    let reserved = in_flight["reserved"]
        .as_u64()
        .expect("reserved while in flight");
    match (settled, account) {
        (Some(settled), Some(account)) if settled.status == 200 && account.status == 200 => {
            let row = settled.json();
            let billed = row["billed"].as_u64().expect("billed");
            assert!(
                billed <= reserved,
                "billed {billed} > reserved {reserved}: {row}"
            );
            let account = account.json();
            assert_eq!(
                account["reserved"], 0,
                "reservation left after shutdown: {account}"
            );
            let balance = account["balance"].as_i64().unwrap();
            assert_eq!(
                (before - balance) as u64,
                billed,
                "balance moved by other than billed: {row}"
            );
        }
        _ => eprintln!("admin listener closed on SIGTERM: ledger after the cut not observable"),
    }
}
