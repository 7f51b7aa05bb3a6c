//! The `bedrock` upstream: both endpoints, in JSON and in streams, served through a route to
//! the mock upstream playing Amazon Bedrock (`crate::bedrock` in the harness: it recomputes
//! every request's SigV4 signature and refuses a mismatch with Bedrock's 403, checks the
//! body's `anthropic_version` and the model id in the path, and streams AWS event-stream
//! frames); the usage Bedrock reports is what the client sees, the ledger bills (naming
//! `bedrock`) and `/v1/usage` counts; Bedrock's `ThrottlingException`, as a 429 or as an
//! exception in the stream, falls back to the next upstream; a refused signature is the
//! gateway's own 502, never a 500, and no answer names Bedrock or carries its error.

use e2e::sse::{assemble_chat_stream, assemble_message_stream};
use std::time::Duration;

use e2e::bedrock::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, WRONG_CREDENTIALS};
use e2e::upstream::{Fault, Received};
use e2e::*;
use serde_json::json;

/// Weight that makes an upstream the first choice in all but one draw in a million.
const FIRST: u32 = 1_000_000;

/// What every call the gateway makes to Bedrock looks like: the streaming endpoint of the
/// route's model id (escaped as one segment), a signature with the Secret's key id and
/// session token, the Messages body without `model` and `stream`.
fn assert_bedrock_call(request: &Received) {
    assert_eq!(
        request.path,
        "/model/anthropic.upstream-model-zq7-v1%3A0/invoke-with-response-stream"
    );
    let authorization = request.headers["authorization"]
        .to_str()
        .unwrap_or_default();
    assert!(
        authorization.starts_with(&format!("AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/"))
            && authorization.contains("/eu-west-3/bedrock/aws4_request"),
        "{authorization}"
    );
    assert_eq!(
        request.headers["accept"],
        "application/vnd.amazon.eventstream"
    );
    assert_eq!(request.body["anthropic_version"], "bedrock-2023-05-31");
    for absent in ["model", "stream", "metadata"] {
        assert!(
            request.body.get(absent).is_none(),
            "{absent}: {}",
            request.body
        );
    }
}

#[tokio::test]
async fn both_endpoints_answer_through_a_bedrock_route_in_json_and_streams_and_bill_bedrocks_usage()
{
    let pg = PostgresServer::start().await;
    let mock = MockUpstream::start().await;
    // One pod settling every turn in Postgres, so the ledger rows are there to read.
    let url = pg.url();
    let turn_by_turn = |b: GatewayBuilder| b.database(&url).arg("--allotment-turns").arg("0");
    let cluster = Cluster::start_on(
        ManifestDir::cluster_routed(&[UpstreamDef::bedrock(&mock)]),
        &[&turn_by_turn],
    )
    .await;
    let gw = &cluster.pods[0];
    let reply = "Paris is the capital of France.";
    // Distinct counts per turn, so a count taken from the wrong turn or the gateway's own
    // tokenizer shows.
    let usages = [(31, 7), (32, 8), (33, 9), (34, 10)];
    mock.push(usages.iter().map(|&(input, output)| {
        Reply::text(reply).usage(MockUsage {
            input,
            output,
            ..MockUsage::default()
        })
    }));

    let json = gw
        .post_messages(&gw.key, &message("svc/sonnet", "Capital of France?", 100))
        .await
        .expect_ok();
    assert_eq!(response_text(&json), reply);
    assert_eq!(json["model"], "svc/sonnet");
    assert_eq!(
        (
            &json["usage"]["input_tokens"],
            &json["usage"]["output_tokens"]
        ),
        (&json!(31), &json!(7)),
        "{json}"
    );

    let stream = gw
        .stream(
            "/v1/messages",
            &gw.key,
            &message_stream("svc/sonnet", "Capital of France?", 100),
        )
        .await;
    stream.expect_sse();
    let stream = assemble_message_stream(&stream.collect().await);
    assert_eq!(stream.text(), reply);
    assert_eq!(stream.delta["stop_reason"], "end_turn");
    assert_eq!(stream.blocks.len(), 1, "{:?}", stream.blocks);
    assert_eq!(stream.usage["output_tokens"], 8);

    let chat = gw
        .chat(
            &gw.key,
            &chat_body("svc/sonnet", "Capital of France?", Some(100)),
        )
        .await
        .expect_ok();
    assert_eq!(chat["choices"][0]["message"]["content"], reply);
    assert_eq!(
        (
            &chat["usage"]["prompt_tokens"],
            &chat["usage"]["completion_tokens"]
        ),
        (&json!(33), &json!(9)),
        "{chat}"
    );

    let mut body = chat_stream_body("svc/sonnet", "Capital of France?", Some(100));
    body["stream_options"] = json!({"include_usage": true});
    let chunks = gw.stream("/v1/chat/completions", &gw.key, &body).await;
    chunks.expect_sse();
    let chunks = assemble_chat_stream(&chunks.collect().await);
    assert_eq!(chunks.content, reply);
    let usage = chunks.usage.as_ref().expect("the usage chunk");
    assert_eq!(
        (&usage["prompt_tokens"], &usage["completion_tokens"]),
        (&json!(34), &json!(10)),
        "{usage}"
    );

    let received = mock.received();
    assert_eq!(received.len(), 4, "one upstream call per turn");
    received.iter().for_each(assert_bedrock_call);
    assert_eq!(mock.refused_count(), 0, "every signature checked out");

    // The ledger bills Bedrock's counts, and names the upstream's kind as the route spells it.
    poll_until(
        "every turn settled",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let open = pg
                .query_i64("SELECT count(*) FROM message_rows WHERE status = 'reserved'")
                .await;
            (open == 0).then_some(())
        },
    )
    .await;
    let report = gw.get("/v1/usage", &gw.key).await.expect_ok();
    let totals = &report["totals"];
    assert_eq!(totals["requests"], 4, "{report}");
    assert_eq!(totals["input_tokens"], 31 + 32 + 33 + 34, "{report}");
    assert_eq!(
        pg.query(
            "SELECT string_agg(DISTINCT provider, ',') || ' ' || sum(input_tokens) || ' ' \
             || sum(output_tokens) FROM message_rows"
        )
        .await,
        "bedrock 130 34"
    );
}

#[tokio::test]
async fn a_bedrock_throttle_as_a_429_or_in_the_stream_falls_back_to_the_next_upstream_and_is_a_529_when_none_is_left(
) {
    let bedrock = MockUpstream::start().await;
    let next = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[
        UpstreamDef::bedrock(&bedrock)
            .named("bedrock")
            .weight(FIRST),
        UpstreamDef::anthropic(&next).named("next"),
    ]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    // A ThrottlingException 429, then a throttlingException message before the first event.
    let throttles = [
        Reply::status(429),
        Reply::text("unused").fault(Fault::OverloadedAfter(0)),
    ];
    let mut turns = 0;
    for throttle in throttles {
        for stream in [false, true] {
            bedrock.push([throttle.clone()]);
            next.push([Reply::text("from the next upstream")]);
            let body = message("svc/haiku", "hello", 50);
            let text = if stream {
                let mut body = body;
                body["stream"] = json!(true);
                let events = gw.stream("/v1/messages", &gw.key, &body).await;
                events.expect_sse();
                assemble_message_stream(&events.collect().await).text()
            } else {
                response_text(&gw.post_messages(&gw.key, &body).await.expect_ok())
            };
            turns += 1;
            assert_eq!(
                text, "from the next upstream",
                "{throttle:?} stream: {stream}"
            );
            assert_eq!(bedrock.request_count(), turns, "Bedrock was tried first");
            assert_eq!(next.request_count(), turns, "then the next upstream");
        }
    }
    bedrock.received().iter().for_each(assert_bedrock_call);

    // As every adapter's 429: the upstream limits us, so with nothing left to fall back to
    // the client is told the service is overloaded (529), not that it failed (502).
    let alone = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::bedrock(&alone)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    alone.push([Reply::status(429)]);
    gw.post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
        .expect_error(529, "overloaded_error");
    assert_eq!(alone.request_count(), 1);
}

#[tokio::test]
async fn an_exception_or_a_broken_chunk_after_the_first_event_ends_the_clients_stream_with_an_error_event(
) {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::bedrock(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    // A throttlingException message is a 529's error; a chunk whose event is not JSON a 502's.
    for (fault, kind) in [
        (Fault::OverloadedAfter(3), "overloaded_error"),
        (Fault::MalformedAfter(3), "api_error"),
    ] {
        mock.push([Reply::text("a long enough answer to cut").fault(fault.clone())]);
        let events = gw
            .stream(
                "/v1/messages",
                &gw.key,
                &message_stream("svc/haiku", "hello", 50),
            )
            .await;
        events.expect_sse();
        let events = events.collect().await;
        let last = events.last().expect("some events");
        assert_eq!(
            last.event.as_deref(),
            Some("error"),
            "{fault:?}: {events:?}"
        );
        assert_eq!(last.json()["error"]["type"], kind, "{fault:?}");
    }
    assert_eq!(mock.request_count(), 2, "nothing falls back mid-stream");
}

#[tokio::test]
async fn a_signature_bedrock_refuses_is_the_gateways_502_never_a_500_and_names_neither_bedrock_nor_its_error(
) {
    // A wrong secret key, and a key scoped to a region the endpoint is not in: Bedrock's 403
    // (our configuration's fault), so the client gets the gateway's own 502.
    for upstream in [
        |mock: &MockUpstream| UpstreamDef::bedrock(mock).aws_credentials(Some(WRONG_CREDENTIALS)),
        |mock: &MockUpstream| UpstreamDef::bedrock(mock).region("us-west-2"),
    ] {
        let mock = MockUpstream::start().await;
        let manifests = RoutedManifests::new(&[upstream(&mock)]);
        let gw = Gateway::builder().manifests(&manifests.path).start().await;
        for stream in [false, true] {
            let mut body = message("svc/haiku", "hello", 50);
            body["stream"] = json!(stream);
            let refused = gw.post_messages(&gw.key, &body).await;
            refused.expect_error(502, "api_error");
            let text = refused.text.to_lowercase();
            for word in ["signature", "bedrock", "amazon", "credential", "aws"] {
                assert!(!text.contains(word), "the error names {word:?}: {text}");
            }
        }
        assert_eq!(mock.refused_count(), 2, "the mock refused both signatures");
    }
}

#[tokio::test]
async fn with_no_credentials_secret_the_gateway_signs_with_the_standard_environment_variables() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::bedrock(&mock).aws_credentials(None)]);
    let gw = Gateway::builder()
        .manifests(&manifests.path)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
        .start()
        .await;
    mock.push([Reply::text("signed from the environment")]);
    let json = gw
        .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
        .expect_ok();
    assert_eq!(response_text(&json), "signed from the environment");
    let received = mock.received();
    assert_eq!(received.len(), 1);
    assert_bedrock_call(&received[0]);
    assert!(
        received[0].headers.get("x-amz-security-token").is_none(),
        "long-term keys have no session token"
    );
    assert_eq!(mock.refused_count(), 0);
}
