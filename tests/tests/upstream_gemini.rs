//! The `gemini` upstream: both endpoints, in JSON and in streams, served through a route to
//! the mock upstream playing the Gemini API (`crate::gemini` in the harness: it checks the
//! `x-goog-api-key` header, the model in the path and the body's shape as Google does,
//! refusing anything else); tool calls round trip from both client formats as
//! `functionCall`/`functionResponse`, thinking as thought parts, images as `inlineData`; the
//! usage Gemini reports (cached and thinking tokens) is what the client sees and the ledger
//! bills; a throttle falls back to the next upstream; a refused key is the gateway's 502,
//! never a 500; a schema keyword Gemini has no counterpart for is the client's 400 naming it;
//! and no answer names Gemini or carries its error.

use e2e::sse::{assemble_chat_stream, assemble_message_stream};
use std::time::Duration;

use e2e::gemini::WRONG_KEY_SECRET;
use e2e::upstream::{Received, UPSTREAM_API_KEY};
use e2e::*;
use serde_json::{json, Value};

/// Weight that makes an upstream the first choice in all but one draw in a million.
const FIRST: u32 = 1_000_000;

/// A 1x1 transparent PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// What every call the gateway makes to Gemini looks like: the streaming endpoint of the
/// route's model in SSE, the key in `x-goog-api-key`, a `GenerateContentRequest` body.
fn assert_gemini_call(request: &Received) {
    assert_eq!(
        request.path,
        "/v1beta/models/upstream-model-zq7:streamGenerateContent"
    );
    assert_eq!(request.query, "alt=sse");
    assert_eq!(request.headers["x-goog-api-key"], UPSTREAM_API_KEY);
    assert!(request.headers.get("authorization").is_none());
    assert!(request.body["contents"].is_array(), "{}", request.body);
    for absent in ["model", "messages", "max_tokens", "stream"] {
        assert!(
            request.body.get(absent).is_none(),
            "{absent}: {}",
            request.body
        );
    }
}

fn chat_tool() -> Value {
    let tool = weather_tool();
    json!([{"type": "function", "function": {"name": tool["name"],
        "description": tool["description"], "parameters": tool["input_schema"]}}])
}

#[tokio::test]
async fn both_endpoints_answer_through_a_gemini_route_in_json_and_streams_and_bill_geminis_usage() {
    let pg = PostgresServer::start().await;
    let mock = MockUpstream::start().await;
    // One pod settling every turn in Postgres, so the ledger rows are there to read.
    let url = pg.url();
    let turn_by_turn = |b: GatewayBuilder| b.database(&url).arg("--allotment-turns").arg("0");
    let cluster = Cluster::start_on(
        ManifestDir::cluster_routed(&[UpstreamDef::gemini(&mock)]),
        &[&turn_by_turn],
    )
    .await;
    let gw = &cluster.pods[0];
    let reply = "Paris is the capital of France.";
    // Distinct counts per turn, with cached prompt tokens, so a count taken from the wrong
    // turn, the gateway's own tokenizer, or a prompt count that still holds the cached tokens
    // shows.
    let usages = [(31, 7, 5), (32, 8, 0), (33, 9, 4), (34, 10, 0)];
    mock.push(usages.iter().map(|&(input, output, cache_read)| {
        Reply::text(reply).usage(MockUsage {
            input,
            output,
            cache_read,
            ..MockUsage::default()
        })
    }));

    let json = gw
        .post_messages(&gw.key, &message("svc/sonnet", "Capital of France?", 100))
        .await
        .expect_ok();
    assert_eq!(response_text(&json), reply);
    assert_eq!(json["model"], "svc/sonnet");
    assert_eq!(json["stop_reason"], "end_turn");
    assert_eq!(
        (
            &json["usage"]["input_tokens"],
            &json["usage"]["output_tokens"],
            &json["usage"]["cache_read_input_tokens"]
        ),
        (&json!(31), &json!(7), &json!(5)),
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
        (&json!(33 + 4), &json!(9)),
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
    received.iter().for_each(assert_gemini_call);
    assert_eq!(
        received[0].body["generationConfig"]["maxOutputTokens"], 100,
        "{}",
        received[0].body
    );
    assert_eq!(received[0].body["contents"][0]["role"], "user");
    assert_eq!(mock.refused_count(), 0, "every request was well-formed");

    // The ledger bills Gemini's counts (cached tokens as cache reads), and names the
    // upstream's kind as the route spells it.
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
    assert_eq!(
        pg.query(
            "SELECT string_agg(DISTINCT provider, ',') || ' ' || sum(input_tokens) || ' ' \
             || sum(output_tokens) || ' ' || sum(cache_read_input_tokens) FROM message_rows"
        )
        .await,
        "gemini 130 34 9"
    );
}

#[tokio::test]
async fn a_tool_call_round_trips_from_both_client_formats_as_gemini_function_call_and_response() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::gemini(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let call = || Reply::tool_call("get_weather", json!({"location": "Oslo", "days": 1}));

    // The Messages API, in JSON.
    mock.push([call(), Reply::text("It is sunny in Oslo.")]);
    let mut first = message("svc/haiku", "Weather in Oslo?", 200);
    first["tools"] = json!([weather_tool()]);
    first["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
    let first = gw.post_messages(&gw.key, &first).await.expect_ok();
    assert_eq!(first["stop_reason"], "tool_use", "{first}");
    let tool_use = &first["content"][0];
    assert_eq!(tool_use["type"], "tool_use", "{first}");
    assert_eq!(tool_use["name"], "get_weather");
    assert_eq!(tool_use["input"], json!({"location": "Oslo", "days": 1}));
    let sent = mock.last_body();
    let declaration = &sent["tools"][0]["functionDeclarations"][0];
    assert_eq!(declaration["name"], "get_weather");
    assert_eq!(declaration["parameters"]["type"], "OBJECT");
    assert_eq!(
        declaration["parameters"]["properties"]["tags"],
        json!({"type": "ARRAY", "items": {"type": "STRING"}})
    );
    assert_eq!(
        sent["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY",
            "allowedFunctionNames": ["get_weather"]}})
    );
    let id = tool_use["id"].as_str().expect("an id").to_owned();
    let second = json!({
        "model": "svc/haiku",
        "max_tokens": 200,
        "system": "You are terse.",
        "tools": [weather_tool()],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": "sunny, 21C"},
                {"type": "text", "text": "Summarize."}
            ]}
        ]
    });
    let answer = gw.post_messages(&gw.key, &second).await.expect_ok();
    assert_eq!(response_text(&answer), "It is sunny in Oslo.");
    let sent = mock.last_body();
    assert_eq!(
        sent["systemInstruction"],
        json!({"parts": [{"text": "You are terse."}]})
    );
    let roles: Vec<&Value> = sent["contents"]
        .as_array()
        .expect("contents")
        .iter()
        .map(|c| &c["role"])
        .collect();
    assert_eq!(roles, [&json!("user"), &json!("model"), &json!("user")]);
    assert_eq!(
        sent["contents"][1]["parts"][0]["functionCall"],
        json!({"name": "get_weather", "args": {"location": "Oslo", "days": 1}})
    );
    assert_eq!(
        sent["contents"][2]["parts"][0]["functionResponse"],
        json!({"name": "get_weather", "response": {"content": "sunny, 21C"}})
    );
    assert_eq!(
        sent["contents"][2]["parts"][1],
        json!({"text": "Summarize."})
    );

    // Chat completions, streamed: the call arrives whole, then its result goes back.
    mock.push([call(), Reply::text("Sunny.")]);
    let mut body = chat_stream_body("svc/haiku", "Weather in Oslo?", Some(200));
    body["tools"] = chat_tool();
    let chunks = gw.stream("/v1/chat/completions", &gw.key, &body).await;
    chunks.expect_sse();
    let chunks = assemble_chat_stream(&chunks.collect().await);
    assert_eq!(chunks.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(chunks.tool_calls.len(), 1, "{:?}", chunks.tool_calls);
    let (id, name, arguments) = &chunks.tool_calls[0];
    assert_eq!(name, "get_weather");
    let args: Value = serde_json::from_str(arguments).expect("JSON arguments");
    assert_eq!(args, json!({"location": "Oslo", "days": 1}));
    let back = json!({
        "model": "svc/haiku",
        "max_tokens": 200,
        "tools": chat_tool(),
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": id, "content": "sunny, 21C"}
        ]
    });
    let answer = gw.chat(&gw.key, &back).await.expect_ok();
    assert_eq!(answer["choices"][0]["message"]["content"], "Sunny.");
    let sent = mock.last_body();
    assert_eq!(
        sent["contents"][2]["parts"][0]["functionResponse"],
        json!({"name": "get_weather", "response": {"content": "sunny, 21C"}})
    );
    assert_eq!(mock.request_count(), 4);
    mock.received().iter().for_each(assert_gemini_call);
    assert_eq!(mock.refused_count(), 0, "every request was well-formed");
}

#[tokio::test]
async fn thinking_streams_as_thought_parts_before_the_answer_and_an_image_goes_as_inline_data() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::gemini(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    mock.push([Reply::text("42.")
        .thinking_first("Six times seven.", "sig-abc123")
        .usage(MockUsage {
            input: 12,
            output: 30,
            ..MockUsage::default()
        })]);
    let mut body = message_stream("svc/opus", "What is 6*7?", 2000);
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let stream = gw.stream("/v1/messages", &gw.key, &body).await;
    stream.expect_sse();
    let stream = assemble_message_stream(&stream.collect().await);
    assert_eq!(stream.blocks.len(), 2, "{:?}", stream.blocks);
    assert_eq!(stream.blocks[0].kind(), "thinking");
    assert_eq!(stream.blocks[0].thinking, "Six times seven.");
    assert_eq!(stream.blocks[0].signature, "sig-abc123");
    assert_eq!(stream.text(), "42.");
    // The mock counts a third of the output as thoughts: the client is billed both.
    assert_eq!(stream.usage["output_tokens"], 30);
    assert_eq!(
        mock.last_body()["generationConfig"]["thinkingConfig"],
        json!({"thinkingBudget": 1024, "includeThoughts": true})
    );

    mock.push([Reply::text("A transparent pixel.")]);
    let body = json!({
        "model": "svc/sonnet",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "text", "text": "What is this?"}
        ]}]
    });
    let answer = gw.post_messages(&gw.key, &body).await.expect_ok();
    assert_eq!(response_text(&answer), "A transparent pixel.");
    assert_eq!(
        mock.last_body()["contents"][0]["parts"],
        json!([{"inlineData": {"mimeType": "image/png", "data": PNG}},
            {"text": "What is this?"}])
    );
    assert_eq!(mock.request_count(), 2);
    assert_eq!(mock.refused_count(), 0);
}

#[tokio::test]
async fn a_gemini_throttle_or_overload_falls_back_to_the_next_upstream_and_is_a_529_when_none_is_left(
) {
    let gemini = MockUpstream::start().await;
    let next = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[
        UpstreamDef::gemini(&gemini).named("gemini").weight(FIRST),
        UpstreamDef::anthropic(&next).named("next"),
    ]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    // A 429 RESOURCE_EXHAUSTED (its RetryInfo keeps Gemini out of the plans for a while),
    // so the overload is tried on a fresh gateway.
    gemini.push([Reply::status(429)]);
    next.push([Reply::text("from the next upstream")]);
    let json = gw
        .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
        .expect_ok();
    assert_eq!(response_text(&json), "from the next upstream");
    assert_eq!(gemini.request_count(), 1, "Gemini was tried first");
    assert_eq!(next.request_count(), 1, "then the next upstream");
    // Within the RetryInfo's wait, Gemini is not tried again.
    next.push([Reply::text("still the next upstream")]);
    let json = gw
        .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
        .expect_ok();
    assert_eq!(response_text(&json), "still the next upstream");
    assert_eq!(gemini.request_count(), 1, "the throttle's wait was kept");

    // A 503 UNAVAILABLE, streamed.
    let gemini = MockUpstream::start().await;
    let next = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[
        UpstreamDef::gemini(&gemini).named("gemini").weight(FIRST),
        UpstreamDef::anthropic(&next).named("next"),
    ]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    gemini.push([Reply::status(503)]);
    next.push([Reply::text("from the next upstream")]);
    let events = gw
        .stream(
            "/v1/messages",
            &gw.key,
            &message_stream("svc/haiku", "hello", 50),
        )
        .await;
    events.expect_sse();
    assert_eq!(
        assemble_message_stream(&events.collect().await).text(),
        "from the next upstream"
    );
    assert_eq!((gemini.request_count(), next.request_count()), (1, 1));
    gemini.received().iter().for_each(assert_gemini_call);

    // With nothing left to fall back to, the client is told the service is overloaded.
    let alone = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::gemini(&alone)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    alone.push([Reply::status(429)]);
    let refused = gw
        .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await;
    refused.expect_error(529, "overloaded_error");
    assert_eq!(alone.request_count(), 1);
}

#[tokio::test]
async fn a_key_gemini_refuses_is_the_gateways_502_never_a_500_and_names_neither_gemini_nor_its_error(
) {
    let mock = MockUpstream::start().await;
    let manifests =
        RoutedManifests::new(&[UpstreamDef::gemini(&mock).api_key_secret(WRONG_KEY_SECRET)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    for stream in [false, true] {
        let mut body = message("svc/haiku", "hello", 50);
        body["stream"] = json!(stream);
        let refused = gw.post_messages(&gw.key, &body).await;
        // Google refuses a wrong key with a 400; the client's request was fine.
        refused.expect_error(502, "api_error");
        let text = refused.text.to_lowercase();
        for word in ["gemini", "google", "api key", "invalid_argument"] {
            assert!(!text.contains(word), "the error names {word:?}: {text}");
        }
    }
    let refused = gw
        .chat(&gw.key, &chat_body("svc/haiku", "hello", Some(50)))
        .await;
    refused.expect_error(502, "api_error");
    assert_eq!(mock.refused_count(), 3, "the mock refused every key");
}

#[tokio::test]
async fn a_schema_keyword_gemini_has_no_counterpart_for_is_a_400_naming_it_and_reaches_no_upstream()
{
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::gemini(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let mut tool = weather_tool();
    tool["input_schema"]["properties"]["days"] =
        json!({"oneOf": [{"type": "integer"}, {"type": "string"}]});

    let mut body = message("svc/haiku", "Weather in Oslo?", 200);
    body["tools"] = json!([tool.clone()]);
    let message = gw
        .post_messages(&gw.key, &body)
        .await
        .expect_error(400, "invalid_request_error");
    assert!(
        message.contains("\"oneOf\" at properties.days") && message.contains("get_weather"),
        "{message}"
    );

    let mut body = chat_body("svc/haiku", "Weather in Oslo?", Some(200));
    body["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": tool["input_schema"]}}]);
    let refused = gw.chat(&gw.key, &body).await;
    refused.expect_error(400, "invalid_request_error");
    assert!(
        refused.text.contains("oneOf"),
        "the refusal names the keyword: {}",
        refused.text
    );
    assert!(!refused.text.to_lowercase().contains("gemini"));
    assert_eq!(mock.request_count(), 0, "nothing reached the upstream");
}
