//! Probes while a pod drains: from SIGTERM until its last stream ends, the admin listener and
//! the metrics listener keep answering, `/livez` 200 (a liveness probe must not kill a pod
//! that is finishing its streams), `/readyz` 503 `"draining": true` (with the binary's default
//! shutdown delay of 0 too) and `/metrics` (a scrape gets the last numbers). The streams
//! complete, and the process exits 0.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use e2e::gateway::ready_fields;
use e2e::sse::assemble_message_stream;
use e2e::*;

/// Words each stream sends, 100 ms apart: the drain lasts several seconds.
const WORDS: usize = 60;
/// How long a probe may be unreachable after the streams' last event reached the client
/// before the test takes it for a listener that closed with streams still open: the client
/// reads the last event a moment after the gateway sent it, then the gateway exits.
const CLIENT_LAG: Duration = Duration::from_secs(2);

/// `GET url`: the status and body, or the connection error.
async fn probe(http: &reqwest::Client, url: &str) -> Result<(u16, String), String> {
    let response = http.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// One round of the three probes on `base` during the drain: live, not ready (draining),
/// metrics served. An error names the probe that could not be reached.
async fn drain_round(http: &reqwest::Client, base: &str) -> Result<(), String> {
    let (live, _) = probe(http, &format!("{base}/livez")).await?;
    assert_eq!(live, 200, "{base}/livez while draining");
    let (ready, body) = probe(http, &format!("{base}/readyz")).await?;
    assert_eq!(ready, 503, "{base}/readyz while draining: {body}");
    let readiness: serde_json::Value = serde_json::from_str(&body).expect("readyz JSON");
    assert_eq!(readiness["draining"], true, "{body}");
    let (metrics, scrape) = probe(http, &format!("{base}/metrics")).await?;
    assert_eq!(metrics, 200, "{base}/metrics while draining");
    assert!(scrape.contains("gateway_"), "{base}/metrics: {scrape}");
    Ok(())
}

#[tokio::test]
async fn probes_and_metrics_answer_not_ready_until_the_last_stream_of_a_draining_pod_ends() {
    let grace = Duration::from_secs(60);
    // The binary's default shutdown delay (0): the listener closes at SIGTERM.
    let mut gw = Gateway::builder()
        .chunk_delay_ms(100)
        .shutdown_grace_secs(grace.as_secs())
        .arg("--metrics-listen")
        .arg("127.0.0.1:0")
        .start()
        .await;
    let metrics_base = ready_fields(&gw.ready_line)
        .and_then(|fields| fields.into_iter().find(|(k, _)| k == "metrics"))
        .map(|(_, url)| url)
        .unwrap_or_else(|| panic!("no metrics listener: {}", gw.ready_line));
    let bases = [gw.admin.clone(), metrics_base];

    let body = message_stream("svc/haiku", &words(WORDS), 512);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut stream = gw.stream("/v1/messages", &gw.key, &body).await;
        stream.expect_sse();
        let mut events = Vec::new();
        stream.read_until("content_block_delta", &mut events).await;
        streams.push((stream, events));
    }

    gw.send_sigterm();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let readyz = format!("{}/readyz", gw.admin);
    poll_until(
        "readiness to report the drain",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { matches!(probe(&http, &readyz).await, Ok((503, _))).then_some(()) },
    )
    .await;
    let streams_ended = AtomicBool::new(false);
    let read_streams = async {
        let mut done = Vec::new();
        for (mut stream, mut events) in streams {
            while let Some(event) = stream.next_event_within(grace).await {
                events.push(event);
            }
            assert!(
                stream.transport_error.is_none(),
                "stream broke: {:?}",
                stream.transport_error
            );
            done.push(events);
        }
        streams_ended.store(true, Ordering::SeqCst);
        done
    };
    let poll_probes = async {
        let mut rounds = 0;
        while !streams_ended.load(Ordering::SeqCst) {
            for base in &bases {
                if let Err(e) = drain_round(&http, base).await {
                    // Unreachable: fine only once the streams have ended and the process is
                    // exiting.
                    poll_until(
                        &format!("the streams to have ended, since {base} is unreachable ({e})"),
                        CLIENT_LAG,
                        Duration::from_millis(20),
                        || async { streams_ended.load(Ordering::SeqCst).then_some(()) },
                    )
                    .await;
                    return rounds;
                }
            }
            rounds += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        rounds
    };
    let (done, rounds) = tokio::join!(read_streams, poll_probes);

    // The drain lasted: the probes were polled through it, not once before it ended.
    assert!(
        rounds >= 10,
        "only {rounds} rounds of probes while the streams ran"
    );
    for events in &done {
        let message = assemble_message_stream(events);
        assert!(
            message.text().ends_with(&words(WORDS)),
            "{}",
            message.text()
        );
        assert_eq!(message.delta["stop_reason"], "end_turn");
    }
    let status = gw.wait_exit(grace).await;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        gw.logs()
    );
}
