//! The `azure-openai` upstream: both endpoints, in JSON and in streams, served through a route
//! to the mock upstream playing an Azure OpenAI resource (which checks the `api-key` header,
//! the api-version and the deployment as Azure does, and refuses a mismatch with 401 or 404);
//! the usage Azure reports is what the client sees, the ledger bills and `/v1/usage` counts;
//! Azure's 429 falls back to the next upstream, which serves the route until the `retry-after`
//! Azure gave is over, and an upstream Azure
//! refuses never shows its name or its error to the client.

use e2e::sse::{assemble_chat_stream, assemble_message_stream};
use std::time::Duration;

use e2e::upstream::{Received, AZURE_API_VERSION, UPSTREAM_API_KEY, UPSTREAM_MODEL};
use e2e::*;
use serde_json::json;

/// Weight that makes an upstream the first choice in all but one draw in a million.
const FIRST: u32 = 1_000_000;

/// What the mock's azure requests must look like: the deployment in the path, the version in
/// the query, the key in `api-key` and nowhere else.
fn assert_azure_call(request: &Received) {
    assert_eq!(
        request.path,
        format!("/openai/deployments/{UPSTREAM_MODEL}/chat/completions")
    );
    assert_eq!(request.query, format!("api-version={AZURE_API_VERSION}"));
    assert_eq!(request.headers["api-key"], UPSTREAM_API_KEY);
    assert!(
        request.headers.get("authorization").is_none(),
        "the key goes in api-key only"
    );
    assert_eq!(request.body["stream"], true, "adapters always stream");
    assert_eq!(
        request.body["stream_options"]["include_usage"], true,
        "Azure reports a stream's usage only when asked"
    );
}

#[tokio::test]
async fn both_endpoints_answer_through_an_azure_openai_route_in_json_and_streams_and_bill_azures_usage(
) {
    let pg = PostgresServer::start().await;
    let mock = MockUpstream::start().await;
    // One pod settling every turn in Postgres, so the ledger rows are there to read.
    let url = pg.url();
    let turn_by_turn = |b: GatewayBuilder| b.database(&url).arg("--allotment-turns").arg("0");
    let cluster = Cluster::start_on(
        ManifestDir::cluster_routed(&[UpstreamDef::azure(&mock)]),
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
    assert_eq!(chat["choices"][0]["finish_reason"], "stop");
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
    assert_eq!(chunks.finish_reason.as_deref(), Some("stop"));
    let usage = chunks.usage.as_ref().expect("the usage chunk");
    assert_eq!(
        (&usage["prompt_tokens"], &usage["completion_tokens"]),
        (&json!(34), &json!(10)),
        "{usage}"
    );

    let received = mock.received();
    assert_eq!(received.len(), 4, "one upstream call per turn");
    received.iter().for_each(assert_azure_call);

    // The ledger bills Azure's counts, and names the upstream's kind as the route spells it.
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
    assert_eq!(totals["output_tokens"], 7 + 8 + 9 + 10, "{report}");
    assert_eq!(
        pg.query(
            "SELECT string_agg(DISTINCT provider, ',') || ' ' || sum(input_tokens) || ' ' \
             || sum(output_tokens) FROM message_rows"
        )
        .await,
        "azure-openai 130 34"
    );
}

#[tokio::test]
async fn an_azure_429_falls_back_to_the_next_upstream_which_serves_until_azures_retry_after_and_is_a_529_when_none_is_left(
) {
    let azure = MockUpstream::start().await;
    let next = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[
        UpstreamDef::azure(&azure).named("azure").weight(FIRST),
        UpstreamDef::openai(&next).named("next"),
    ]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    azure.push([Reply::status(429)]);
    for (i, stream) in [false, true].into_iter().enumerate() {
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
        assert_eq!(text, "from the next upstream", "stream: {stream}");
        // Azure said to come back in 20 s: the turn after its 429 does not try it again
        // (a plain failure would take five in a row to keep it out).
        assert_eq!(azure.request_count(), 1, "Azure was tried first, once");
        assert_eq!(next.request_count(), i + 1, "then the next upstream");
    }
    azure.received().iter().for_each(assert_azure_call);

    // As every adapter's 429: the upstream limits us, so with nothing left to fall back to
    // the client is told the service is overloaded (529), not that it failed (502).
    let alone = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::azure(&alone)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    alone.push([Reply::status(429)]);
    gw.post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
        .expect_error(529, "overloaded_error");
    assert_eq!(alone.request_count(), 1);
}

#[tokio::test]
async fn an_upstream_azure_refuses_is_a_502_that_names_neither_azure_nor_its_error() {
    // A route whose api-version the resource does not serve: Azure's 404, as for a wrong
    // endpoint; our configuration's fault, so the client gets the gateway's own 502.
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::azure(&mock).api_version("2023-05-15")]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let refused = gw
        .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await;
    refused.expect_error(502, "api_error");
    let text = refused.text.to_lowercase();
    for word in ["azure", "resource not found", "deployment"] {
        assert!(!text.contains(word), "the error names {word:?}: {text}");
    }
    let received = mock.received();
    assert_eq!(received.len(), 1, "the mock saw the call it refused");
    assert_eq!(received[0].query, "api-version=2023-05-15");
}
