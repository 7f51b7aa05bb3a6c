//! When upstreams fail: fallback to the next upstream before anything reached the client, the
//! circuit breaker that takes a failing upstream out and probes it back, the status of each
//! kind of failure when no upstream is left, failures mid-stream (no fallback, but they count
//! toward the breaker), and a client that goes away mid-stream (the upstream call is
//! cancelled, the generated tokens billed).

use std::time::Duration;

use e2e::books::{output_tokens, received_text, RoutePrice};
use e2e::upstream::PROVIDERS;
use e2e::*;
use serde_json::Value;

/// Chunks a client that hangs up mid-stream may be billed past the events it read.
const CHUNKS_IN_FLIGHT: usize = 2;

/// Weight that makes an upstream the first choice in all but one draw in a million.
const FIRST: u32 = 1_000_000;

struct Rig {
    gw: Gateway,
    _manifests: RoutedManifests,
}

async fn start(upstreams: &[UpstreamDef], flags: &[&str]) -> Rig {
    let manifests = RoutedManifests::new(upstreams);
    let mut builder = Gateway::builder().manifests(&manifests.path);
    for flag in flags {
        builder = builder.arg(flag);
    }
    Rig {
        gw: builder.start().await,
        _manifests: manifests,
    }
}

async fn ask(gw: &Gateway) -> Resp {
    gw.post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
}

#[tokio::test]
async fn a_refused_connection_falls_back_to_the_next_upstream() {
    let mock = MockUpstream::start().await;
    let rig = start(
        &[
            UpstreamDef::refused("anthropic").weight(FIRST),
            UpstreamDef::openai(&mock).named("second"),
        ],
        &[],
    )
    .await;
    mock.push([Reply::text("from the second upstream")]);
    let answer = ask(&rig.gw).await.expect_ok();
    assert_eq!(response_text(&answer), "from the second upstream");
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn a_5xx_a_529_or_a_slow_first_byte_falls_back_before_anything_reached_the_client() {
    // Both upstreams are the same mock, one per wire format: whichever is drawn first gets the
    // scripted failure, the other one the answer.
    let mock = MockUpstream::start().await;
    let rig = start(
        &[
            UpstreamDef::anthropic(&mock)
                .named("one")
                .timeouts(500, 5_000),
            UpstreamDef::openai(&mock).named("two").timeouts(500, 5_000),
        ],
        &["--breaker-failures", "100"],
    )
    .await;
    let failures = [
        Reply::status(500),
        Reply::status(503),
        Reply::status(529),
        Reply::status(429),
        Reply::text("late").fault(Fault::FirstByteDelay(Duration::from_millis(1_500))),
    ];
    for (i, failure) in failures.into_iter().enumerate() {
        mock.push([failure, Reply::text("recovered")]);
        let before = mock.request_count();
        let stream = rig
            .gw
            .stream(
                "/v1/messages",
                &rig.gw.key,
                &message_stream("svc/haiku", "hi", 50),
            )
            .await;
        stream.expect_sse();
        let events = stream.collect().await;
        let message = sse::assemble_message_stream(&events);
        assert_eq!(message.text(), "recovered", "failure #{i}");
        let received = mock.received();
        assert_eq!(received.len(), before + 2, "failure #{i}: one attempt each");
        assert_ne!(
            received[before].path,
            received[before + 1].path,
            "failure #{i}: the second attempt went to the other upstream"
        );
    }
}

#[tokio::test]
async fn each_upstream_failure_has_its_own_status_when_no_upstream_is_left() {
    let mock = MockUpstream::start().await;
    let rig = start(
        &[UpstreamDef::anthropic(&mock).timeouts(400, 5_000)],
        &["--breaker-failures", "100"],
    )
    .await;
    let before = rig.gw.balance(&rig.gw.key).await;
    let cases = [
        (Reply::status(400), 400, "invalid_request_error"),
        (Reply::status(422), 400, "invalid_request_error"),
        (Reply::status(401), 502, "api_error"),
        (Reply::status(500), 502, "api_error"),
        (Reply::status(503), 502, "api_error"),
        (Reply::status(529), 529, "overloaded_error"),
        (Reply::status(429), 529, "overloaded_error"),
        (
            Reply::text("late").fault(Fault::FirstByteDelay(Duration::from_millis(1_200))),
            504,
            "api_error",
        ),
    ];
    for (reply, status, kind) in cases {
        mock.push([reply]);
        let message = ask(&rig.gw).await.expect_error(status, kind);
        assert!(
            !message.contains("says no"),
            "the upstream's own message is never forwarded: {message}"
        );
    }
    assert_eq!(
        rig.gw.balance(&rig.gw.key).await,
        before,
        "failed turns cost nothing"
    );

    let refused = start(&[UpstreamDef::refused("openai")], &[]).await;
    ask(&refused.gw).await.expect_error(503, "api_error");
}

/// Streams a turn the upstream cuts after its first deltas: the client got text, then an
/// `error` event (returned) instead of `message_stop`.
async fn cut_stream(gw: &Gateway, what: &str) -> SseEvent {
    let stream = gw
        .stream(
            "/v1/messages",
            &gw.key,
            &message_stream("svc/haiku", "hi", 200),
        )
        .await;
    stream.expect_sse();
    let events = stream.collect().await;
    let names: Vec<&str> = events.iter().map(|e| e.name()).collect();
    assert!(names.contains(&"content_block_delta"), "{what}: {names:?}");
    assert!(!names.contains(&"message_stop"), "{what}: {names:?}");
    let last = events.last().expect("events").clone();
    assert_eq!(last.name(), "error", "{what}: {names:?}");
    last
}

#[tokio::test]
async fn a_failure_mid_stream_ends_the_stream_with_an_error_event() {
    let mock = MockUpstream::start().await;
    let rig = start(&[UpstreamDef::anthropic(&mock).timeouts(5_000, 500)], &[]).await;
    let long = words(30);
    mock.push([
        Reply::text(&long).fault(Fault::StallAfter(5)),
        Reply::text(&long).fault(Fault::OverloadedAfter(5)),
        Reply::text(&long).fault(Fault::MalformedAfter(5)),
    ]);
    for (what, kind) in [
        ("stall", "api_error"),
        ("overloaded", "overloaded_error"),
        ("malformed", "api_error"),
    ] {
        let last = cut_stream(&rig.gw, what).await;
        assert_eq!(last.json()["error"]["type"], kind, "{what}");
    }
}

#[tokio::test]
async fn the_breaker_takes_a_failing_upstream_out_and_a_probe_brings_it_back() {
    let flaky = MockUpstream::start().await;
    let steady = MockUpstream::start().await;
    let rig = start(
        &[
            UpstreamDef::anthropic(&flaky).named("flaky").weight(FIRST),
            UpstreamDef::openai(&steady).named("steady"),
        ],
        // A cooldown long enough that the five turns below fall inside it on a loaded machine.
        &["--breaker-failures", "2", "--breaker-cooldown-ms", "8000"],
    )
    .await;
    flaky.push([Reply::status(500), Reply::status(500)]);

    for _ in 0..2 {
        ask(&rig.gw).await.expect_ok();
    }
    assert_eq!(flaky.request_count(), 2, "tried first, failed twice");
    assert_eq!(steady.request_count(), 2, "each failure fell back");

    for _ in 0..5 {
        ask(&rig.gw).await.expect_ok();
    }
    assert_eq!(
        flaky.request_count(),
        2,
        "out of rotation during the cooldown"
    );
    assert_eq!(steady.request_count(), 7);
    let circuit = [("upstream", "svc/haiku/flaky")];
    let open = rig.gw.metrics().await;
    assert_eq!(
        open.value("gateway_upstream_circuit_state", &circuit),
        2.0,
        "the metric shows the breaker open"
    );

    // Once the cooldown is over, the next turn probes it: turns are asked (each still served
    // by steady until then) until one reaches flaky.
    poll_until(
        "a turn to probe the flaky upstream after the cooldown",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            ask(&rig.gw).await.expect_ok();
            (flaky.request_count() > 2).then_some(())
        },
    )
    .await;
    assert_eq!(flaky.request_count(), 3, "one turn probes it");
    let steady_at_probe = steady.request_count();
    for _ in 0..3 {
        ask(&rig.gw).await.expect_ok();
    }
    assert_eq!(
        flaky.request_count(),
        6,
        "the probe succeeded: back in rotation"
    );
    assert_eq!(steady.request_count(), steady_at_probe);
    let closed = rig.gw.metrics().await;
    assert_eq!(
        closed.value("gateway_upstream_circuit_state", &circuit),
        0.0,
        "and closed again"
    );
}

#[tokio::test]
async fn failures_after_the_first_byte_count_toward_the_breaker_without_falling_back() {
    let flaky = MockUpstream::start().await;
    let steady = MockUpstream::start().await;
    let rig = start(
        &[
            UpstreamDef::anthropic(&flaky)
                .named("flaky")
                .weight(FIRST)
                .timeouts(10_000, 500),
            UpstreamDef::openai(&steady).named("steady"),
        ],
        &["--breaker-failures", "2", "--breaker-cooldown-ms", "600000"],
    )
    .await;
    let long = words(30);
    flaky.push([
        Reply::text(&long).fault(Fault::StallAfter(5)),
        Reply::text(&long).fault(Fault::MalformedAfter(5)),
    ]);
    let circuit = [("upstream", "svc/haiku/flaky")];

    for what in ["stall past the idle timeout", "malformed chunk"] {
        cut_stream(&rig.gw, what).await;
    }
    assert_eq!(flaky.request_count(), 2);
    assert_eq!(
        steady.request_count(),
        0,
        "the client had bytes: no fallback"
    );
    let open = rig.gw.metrics().await;
    assert_eq!(
        open.value("gateway_upstream_circuit_state", &circuit),
        2.0,
        "two failed streams in a row opened the breaker"
    );

    ask(&rig.gw).await.expect_ok();
    assert_eq!(flaky.request_count(), 2, "out of rotation");
    assert_eq!(steady.request_count(), 1, "the next turn went to the other");
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_the_upstream_call_and_pays_what_was_generated(
) {
    for provider in PROVIDERS {
        let mock = MockUpstream::start().await;
        let rig = start(&[UpstreamDef::of(provider, &mock)], &[]).await;
        let gw = &rig.gw;
        let usage = MockUsage {
            input: 10,
            output: 400,
            ..MockUsage::default()
        };
        let reply = words(200);
        mock.push([Reply::text(&reply)
            .usage(usage)
            .chunk_delay(Duration::from_millis(30))]);
        let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
        let mut stream = gw
            .stream(
                "/v1/messages",
                &key.secret,
                &message_stream("svc/opus", "go", 1_000),
            )
            .await;
        stream.expect_sse();
        let mut seen = Vec::new();
        let start = stream.read_until("message_start", &mut seen).await;
        let id = start.json()["message"]["id"].as_str().unwrap().to_owned();
        for _ in 0..5 {
            stream.read_until("content_block_delta", &mut seen).await;
        }
        stream.disconnect();
        let payloads: Vec<Value> = seen.iter().map(|e| e.json()).collect();
        let received = received_text(&payloads);
        assert!(reply.starts_with(&received), "{received:?}");

        poll_until(
            "the upstream stream to be dropped",
            Duration::from_secs(5),
            Duration::from_millis(20),
            || async { (mock.abandoned() == 1).then_some(()) },
        )
        .await;
        gw.wait_settled(&key.account_id).await;
        let row: Value = gw.message_record(&id).await;
        // The upstream's own count (400) never came: the gateway counts the text it took from
        // the upstream, a mock chunk (6 characters) at a time: what the client received, and
        // at most the chunks on their way when it hung up (one in its buffers or on the wire,
        // one taken before the gateway saw the close).
        let generated = |chars: usize| &reply[..(received.len() + chars).min(reply.len())];
        let (least, most) = (
            output_tokens(&received),
            output_tokens(generated(CHUNKS_IN_FLIGHT * 6)),
        );
        let output = row["usage"]["output_tokens"]
            .as_u64()
            .expect("output_tokens");
        assert!(
            (least..=most).contains(&output),
            "{provider}: {output} output tokens billed, {least} received ({received:?}), {most} with the chunks in flight: {row}"
        );
        let input = row["usage"]["input_tokens"].as_u64().expect("input_tokens");
        let billed = row["billed"].as_u64().expect("billed");
        assert_eq!(
            billed,
            RoutePrice::of("svc/opus").credits(input, output),
            "{provider}: billed other than the route's price of its tokens: {row}"
        );
        assert_eq!(row["status"], "client_disconnected", "{row}");
    }
}
