//! `/v1/responses`, the OpenAI Responses API: JSON and the stream's event lifecycle, usage and
//! credits against the balance, tool round trips (namespaced tools included), reasoning on
//! svc/opus sealed through stateless clients, stored responses (retrieve, delete, input items,
//! `previous_response_id`, retention, account isolation), the `responses` scope, and the
//! same turns through both upstream adapters.

use e2e::books::{output_tokens, received_text, RoutePrice};
use e2e::sse::assemble_response_stream;
use e2e::upstream::carries_tool_result;
use e2e::*;
use reqwest::Method;
use serde_json::{json, Value};

const PATH: &str = "/v1/responses";

fn body(model: &str, input: Value) -> Value {
    json!({"model": model, "input": input})
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
}

fn function_tool() -> Value {
    let tool = weather_tool();
    json!({"type": "function", "name": tool["name"], "description": tool["description"],
           "parameters": tool["input_schema"]})
}

/// Text of every `output_text` part of a response's message items.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap_or_else(|| panic!("no output: {response}"))
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter(|part| part["type"] == "output_text")
        .map(|part| part["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn items_of_type<'a>(response: &'a Value, kind: &str) -> Vec<&'a Value> {
    response["output"]
        .as_array()
        .map(|items| items.iter().filter(|i| i["type"] == kind).collect())
        .unwrap_or_default()
}

async fn create(gw: &Gateway, key: &str, body: &Value) -> Value {
    gw.post_json(PATH, key, body).await.expect_ok()
}

async fn stream_response(gw: &Gateway, key: &str, body: &Value) -> ResponseStream {
    let stream = gw.stream(PATH, key, body).await;
    stream.expect_sse();
    assemble_response_stream(&stream.collect().await)
}

async fn delete(gw: &Gateway, key: &str, id: &str) -> Resp {
    gw.send(gw.request(Method::DELETE, &format!("{PATH}/{id}"), Some(key)))
        .await
}

fn check_usage(response: &Value) -> u64 {
    let usage = &response["usage"];
    let input = usage["input_tokens"].as_u64().expect("input_tokens");
    let output = usage["output_tokens"].as_u64().expect("output_tokens");
    assert!(input > 0 && output > 0, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(input + output),
        "{usage}"
    );
    assert!(
        usage["input_tokens_details"]["cached_tokens"].is_u64(),
        "{usage}"
    );
    let reasoning = usage["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .expect("reasoning_tokens");
    assert!(reasoning <= output, "{usage}");
    credits_of(response)
}

#[tokio::test]
async fn a_json_response_has_a_resp_id_the_virtual_model_a_message_and_credits_equal_to_the_balance_drop(
) {
    let gw = Gateway::start().await;
    let key = gw
        .new_key(10_000_000, &KeySpec::tier("pay_as_you_go"))
        .await;
    let before = gw.balance(&key.secret).await;
    let resp = gw
        .post_json(PATH, &key.secret, &body("svc/sonnet", json!("Hello there")))
        .await;
    let response = resp.expect_ok();
    let limits = resp.rate_limit();
    assert_eq!(limits.tier, "pay_as_you_go");

    let id = response["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"), "{response}");
    assert_eq!(resp.header("request-id").as_deref(), Some(id));
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["model"], "svc/sonnet");
    assert!(
        output_text(&response).ends_with("You said: Hello there"),
        "{response}"
    );
    let message = items_of_type(&response, "message")[0];
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    let credits = check_usage(&response);
    assert!(credits > 0);

    gw.wait_settled(&key.account_id).await;
    assert_eq!(before - gw.balance(&key.secret).await, credits as i64);
    let row = gw.message_record(id).await;
    assert_eq!(row["endpoint"], "responses", "{row}");
    assert_eq!(row["billed"].as_u64(), Some(credits), "{row}");
}

#[tokio::test]
async fn a_stream_runs_the_whole_event_lifecycle_in_sequence_and_matches_its_billing() {
    let gw = Gateway::start().await;
    let key = gw
        .new_key(10_000_000, &KeySpec::tier("pay_as_you_go"))
        .await;
    let before = gw.balance(&key.secret).await;
    let stream = stream_response(
        &gw,
        &key.secret,
        &streamed(body("svc/haiku", json!("stream me please"))),
    )
    .await;

    let names = stream.names();
    assert_eq!(
        names[..5],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
        ]
    );
    assert_eq!(
        names[names.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(stream.end, "response.completed");
    assert!(stream.text.ends_with("You said: stream me please"));
    assert_eq!(output_text(&stream.response), stream.text);
    assert_eq!(stream.response["status"], "completed");
    assert_eq!(stream.response["model"], "svc/haiku");
    let credits = check_usage(&stream.response);

    gw.wait_settled(&key.account_id).await;
    assert_eq!(before - gw.balance(&key.secret).await, credits as i64);
}

#[tokio::test]
async fn a_response_cut_by_max_output_tokens_is_incomplete_with_the_reason() {
    let gw = Gateway::start().await;
    let mut request = body("svc/haiku", json!(words(60)));
    request["max_output_tokens"] = json!(5);
    let response = create(&gw, &gw.key, &request).await;
    assert_eq!(response["status"], "incomplete", "{response}");
    assert_eq!(
        response["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(response["usage"]["output_tokens"], 5);

    let stream = stream_response(&gw, &gw.key, &streamed(request)).await;
    assert_eq!(stream.end, "response.incomplete");
    assert_eq!(
        stream.response["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}

#[tokio::test]
async fn a_client_that_cuts_the_stream_pays_for_what_was_generated() {
    let gw = Gateway::builder().chunk_delay_ms(100).start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let mut request = streamed(body("svc/opus", json!(words(40))));
    request["max_output_tokens"] = json!(1_000);
    let mut stream = gw.stream(PATH, &key.secret, &request).await;
    stream.expect_sse();
    let mut seen = Vec::new();
    let created = stream.read_until("response.created", &mut seen).await;
    let id = created.json()["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for _ in 0..3 {
        stream
            .read_until("response.output_text.delta", &mut seen)
            .await;
    }
    stream.disconnect();
    let payloads: Vec<Value> = seen.iter().map(|e| e.json()).collect();
    let received = received_text(&payloads);

    gw.wait_settled(&key.account_id).await;
    let row = gw.message_record(&id).await;
    assert_eq!(row["status"], "client_disconnected", "{row}");
    let billed = row["billed"].as_u64().expect("billed");
    // The gateway bills what it took from the upstream, a chunk (4 tokens) at a time: what the
    // client received, and at most the chunks that were on their way when it hung up (one in
    // its buffers or on the wire, one taken before the gateway saw the close).
    let input = row["usage"]["input_tokens"].as_u64().expect("input_tokens");
    let price = RoutePrice::of("svc/opus");
    let least = price.cut_stream(input, &received);
    let most = price.credits(input, output_tokens(&received) + CHUNKS_IN_FLIGHT * 4);
    assert!(
        (least..=most).contains(&billed),
        "billed {billed}, where what the client received ({received:?}) costs {least}, and {most} with the chunks in flight: {row}"
    );
    assert_eq!(before - gw.balance(&key.secret).await, billed as i64);
}

/// Chunks a client that hangs up may be billed past the events it read (see
/// `a_client_that_cuts_the_stream_pays_for_what_was_generated`).
const CHUNKS_IN_FLIGHT: u64 = 2;

#[tokio::test]
async fn a_tool_round_trip_gives_a_function_call_with_a_call_id_then_answers_its_output() {
    let gw = Gateway::start().await;
    let mut request = body("svc/sonnet", json!("What is the weather in Paris?"));
    request["tools"] = json!([function_tool()]);
    request["tool_choice"] = json!("required");
    let response = create(&gw, &gw.key, &request).await;
    let calls = items_of_type(&response, "function_call");
    assert_eq!(calls.len(), 1, "{response}");
    let call = calls[0].clone();
    assert!(
        call["call_id"].as_str().unwrap().starts_with("call_"),
        "{call}"
    );
    assert!(call["id"].as_str().unwrap().starts_with("fc_"), "{call}");
    assert_eq!(call["name"], "get_weather");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, weather_tool_input());

    let streamed_call = stream_response(&gw, &gw.key, &streamed(request.clone())).await;
    let item = &streamed_call.items[0];
    assert_eq!(item["type"], "function_call");
    assert_eq!(
        streamed_call.arguments[0],
        item["arguments"].as_str().unwrap()
    );

    // Stateless continuation: the whole conversation resent as items.
    let mut next = body(
        "svc/sonnet",
        json!([
            {"role": "user", "content": "What is the weather in Paris?"},
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "22 degrees and sunny"}
        ]),
    );
    next["tools"] = json!([function_tool()]);
    next["store"] = json!(false);
    let answer = create(&gw, &gw.key, &next).await;
    assert!(
        output_text(&answer).ends_with("The tool returned: 22 degrees and sunny"),
        "{answer}"
    );
}

#[tokio::test]
async fn hosted_and_custom_tools_are_not_offered_and_never_fail_the_turn() {
    let gw = Gateway::start().await;
    let mut request = body("svc/sonnet", json!("Say hello"));
    request["tools"] = json!([
        {"type": "web_search"},
        {"type": "local_shell"},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
    ]);
    request["tool_choice"] = json!({"type": "web_search"});
    request["include"] = json!(["reasoning.encrypted_content", "web_search_call.results"]);
    request["prompt_cache_key"] = json!("cache-1");
    request["text"] = json!({"verbosity": "low"});
    let response = create(&gw, &gw.key, &request).await;
    assert_eq!(response["status"], "completed");
    assert!(items_of_type(&response, "function_call").is_empty());
    assert_eq!(
        response["tools"], request["tools"],
        "tools are echoed as sent"
    );
}

#[tokio::test]
async fn malformed_known_fields_are_400_naming_the_field() {
    let gw = Gateway::start().await;
    let cases = [
        (json!({"model": "svc/sonnet", "input": 3}), "input"),
        (
            json!({"model": "svc/sonnet", "input": [{"role": "user", "content": 7}]}),
            "input[0].content",
        ),
        (
            json!({"model": "svc/sonnet", "input": [{"role": "wizard", "content": "hi"}]}),
            "input[0].role",
        ),
        (
            json!({"model": "svc/sonnet", "input": [{"content": "hi"}]}),
            "input[0].type",
        ),
        (
            json!({"model": "svc/sonnet", "input": "hi", "tools": [{"type": "function"}]}),
            "tools[0]",
        ),
        (
            json!({"model": "svc/sonnet", "input": "hi", "reasoning": {"effort": "extreme"}}),
            "reasoning.effort",
        ),
        (
            json!({"model": "svc/sonnet", "input": "hi", "temperature": 3}),
            "temperature",
        ),
        (
            json!({"model": "svc/sonnet", "input": "hi", "max_output_tokens": -1}),
            "max_output_tokens",
        ),
        (json!({"model": "svc/nope", "input": "hi"}), "model"),
        (
            json!({"model": "svc/sonnet", "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{not json"}]}),
            "input[1].arguments",
        ),
        (
            json!({"model": "svc/sonnet", "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x"}]}]}),
            "input[0].content[0].image_url",
        ),
    ];
    for (request, field) in cases {
        let message = gw
            .post_json(PATH, &gw.key, &request)
            .await
            .expect_invalid(&[field]);
        assert!(message.starts_with(field), "{field}: {message}");
    }
}

#[tokio::test]
async fn an_image_input_reaches_a_vision_model() {
    let gw = Gateway::start().await;
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let request = body(
        "svc/sonnet",
        json!([{"role": "user", "content": [
        {"type": "input_text", "text": "What is in the picture?"},
        {"type": "input_image", "image_url": format!("data:image/png;base64,{png}")}]}]),
    );
    let response = create(&gw, &gw.key, &request).await;
    assert!(
        output_text(&response).ends_with("What is in the picture?"),
        "{response}"
    );
}

#[tokio::test]
async fn stored_responses_are_retrieved_listed_continued_and_deleted_by_their_account_only() {
    let gw = Gateway::start().await;
    let mut first = body("svc/sonnet", json!("My name is Ada."));
    first["instructions"] = json!("Be brief.");
    first["metadata"] = json!({"topic": "names"});
    let response = create(&gw, &gw.key, &first).await;
    let id = response["id"].as_str().unwrap().to_owned();
    assert_eq!(response["store"], true);
    assert_eq!(response["metadata"]["topic"], "names");

    let retrieved = gw.get(&format!("{PATH}/{id}"), &gw.key).await.expect_ok();
    assert_eq!(retrieved, response);

    let next = create(
        &gw,
        &gw.key,
        &json!({"model": "svc/sonnet",
        "previous_response_id": id, "input": "What is my name?"}),
    )
    .await;
    assert_eq!(next["previous_response_id"], id.as_str());
    assert!(output_text(&next).ends_with("You said: What is my name?"));
    let next_id = next["id"].as_str().unwrap();
    let items = gw
        .get(&format!("{PATH}/{next_id}/input_items?order=asc"), &gw.key)
        .await
        .expect_ok();
    let data = items["data"].as_array().unwrap();
    assert_eq!(
        data.len(),
        3,
        "the inherited input and output, then the new input: {items}"
    );
    assert_eq!(data[0]["content"][0]["text"], "My name is Ada.");
    assert_eq!(data[1]["type"], "message");
    assert_eq!(data[1]["role"], "assistant");
    assert_eq!(data[2]["content"][0]["text"], "What is my name?");
    assert_eq!(items["first_id"], data[0]["id"]);
    let newest = gw
        .get(&format!("{PATH}/{next_id}/input_items?limit=1"), &gw.key)
        .await
        .expect_ok();
    assert_eq!(
        newest["data"][0]["id"], data[2]["id"],
        "newest first by default"
    );
    assert_eq!(newest["has_more"], true);

    let other = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.get(&format!("{PATH}/{id}"), &other.secret)
        .await
        .expect_error(404, "not_found_error");
    gw.get(&format!("{PATH}/{id}/input_items"), &other.secret)
        .await
        .expect_error(404, "not_found_error");
    delete(&gw, &other.secret, &id)
        .await
        .expect_error(404, "not_found_error");
    gw.post_json(
        PATH,
        &other.secret,
        &json!({"model": "svc/sonnet",
        "previous_response_id": id, "input": "hi"}),
    )
    .await
    .expect_error(404, "not_found_error");

    let deleted = delete(&gw, &gw.key, &id).await.expect_ok();
    assert_eq!(deleted["deleted"], true);
    gw.get(&format!("{PATH}/{id}"), &gw.key)
        .await
        .expect_error(404, "not_found_error");
}

#[tokio::test]
async fn a_response_with_store_false_is_not_kept() {
    let gw = Gateway::start().await;
    let mut request = body("svc/haiku", json!("forget me"));
    request["store"] = json!(false);
    let response = create(&gw, &gw.key, &request).await;
    assert_eq!(response["store"], false);
    let id = response["id"].as_str().unwrap();
    gw.get(&format!("{PATH}/{id}"), &gw.key)
        .await
        .expect_error(404, "not_found_error");
}

#[tokio::test]
async fn the_store_keeps_at_most_its_capacity_and_forgets_the_oldest_first() {
    let gw = Gateway::builder()
        .arg("--responses-capacity")
        .arg("2")
        .start()
        .await;
    let mut ids = Vec::new();
    for text in ["one", "two", "three"] {
        let response = create(&gw, &gw.key, &body("svc/haiku", json!(text))).await;
        ids.push(response["id"].as_str().unwrap().to_owned());
    }
    gw.get(&format!("{PATH}/{}", ids[0]), &gw.key)
        .await
        .expect_error(404, "not_found_error");
    for id in &ids[1..] {
        gw.get(&format!("{PATH}/{id}"), &gw.key).await.expect_ok();
    }
}

#[tokio::test]
async fn reasoning_on_opus_streams_a_summary_and_round_trips_sealed_through_a_stateless_client() {
    let gw = Gateway::start().await;
    let question = "Use get_weather: what is the weather in Paris?";
    let mut request = body("svc/opus", json!(question));
    request["reasoning"] = json!({"effort": "low", "summary": "auto"});
    request["include"] = json!(["reasoning.encrypted_content"]);
    request["store"] = json!(false);
    request["tools"] = json!([function_tool()]);
    request["max_output_tokens"] = json!(4_000);
    let stream = stream_response(&gw, &gw.key, &streamed(request.clone())).await;
    let names = stream.names();
    assert_eq!(
        names[2..5],
        [
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
        ]
    );
    let reasoning = stream.items[0].clone();
    assert_eq!(reasoning["type"], "reasoning");
    assert_eq!(reasoning["summary"][0]["text"], stream.summary.as_str());
    assert!(!stream.summary.is_empty());
    let sealed = reasoning["encrypted_content"]
        .as_str()
        .expect("sealed thinking");
    assert!(!sealed.contains(&stream.summary), "the seal is opaque");
    let reasoning_tokens = stream.response["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!(reasoning_tokens > 0, "{}", stream.response);
    let kinds: Vec<&Value> = stream.items.iter().map(|i| &i["type"]).collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"]);
    let call = stream.items[2].clone();

    let mut next = request.clone();
    next["input"] = json!([
        {"role": "user", "content": question},
        reasoning,
        stream.items[1],
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "22 degrees and sunny"}
    ]);
    let answer = create(&gw, &gw.key, &next).await;
    assert!(output_text(&answer).ends_with("The tool returned: 22 degrees and sunny"));

    let mut tampered = next.clone();
    let mut forged = sealed.to_owned();
    forged.insert(10, 'x');
    tampered["input"][1]["encrypted_content"] = json!(forged);
    gw.post_json(PATH, &gw.key, &tampered)
        .await
        .expect_invalid(&["input[1].encrypted_content"]);
}

#[tokio::test]
async fn reasoning_on_a_model_without_thinking_is_accepted_and_not_applied() {
    let gw = Gateway::start().await;
    let mut request = body("svc/haiku", json!("Think hard"));
    request["reasoning"] = json!({"effort": "high", "summary": "detailed"});
    let response = create(&gw, &gw.key, &request).await;
    assert_eq!(response["status"], "completed");
    assert!(
        items_of_type(&response, "reasoning").is_empty(),
        "{response}"
    );
    assert_eq!(
        response["usage"]["output_tokens_details"]["reasoning_tokens"],
        0
    );
}

#[tokio::test]
async fn the_responses_scope_opens_the_endpoint_and_other_scopes_do_not() {
    let gw = Gateway::start().await;
    let chat_only = gw
        .new_key(
            1_000_000,
            &KeySpec::tier("pay_as_you_go").with_scopes(&["chat"]),
        )
        .await;
    let message = gw
        .post_json(PATH, &chat_only.secret, &body("svc/haiku", json!("hi")))
        .await
        .expect_error(403, "permission_error");
    assert!(message.contains("responses"), "{message}");
    let responses_only = gw
        .new_key(
            1_000_000,
            &KeySpec::tier("pay_as_you_go").with_scopes(&["responses"]),
        )
        .await;
    let response = create(&gw, &responses_only.secret, &body("svc/haiku", json!("hi"))).await;
    let id = response["id"].as_str().unwrap();
    gw.get(&format!("{PATH}/{id}"), &responses_only.secret)
        .await
        .expect_ok();
    gw.chat(
        &responses_only.secret,
        &chat_body("svc/haiku", "hi", Some(16)),
    )
    .await
    .expect_error(403, "permission_error");
}

// ---- through the upstream adapters ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Adapter {
    Anthropic,
    OpenAi,
}

async fn routed(adapter: Adapter) -> (MockUpstream, Gateway, RoutedManifests) {
    let mock = MockUpstream::start().await;
    let upstream = match adapter {
        Adapter::Anthropic => UpstreamDef::anthropic(&mock),
        Adapter::OpenAi => UpstreamDef::openai(&mock),
    };
    let manifests = RoutedManifests::new(&[upstream]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    (mock, gw, manifests)
}

#[tokio::test]
async fn both_adapters_answer_json_and_streams_and_namespaced_calls_come_back_namespaced() {
    for adapter in [Adapter::Anthropic, Adapter::OpenAi] {
        let (mock, gw, _manifests) = routed(adapter).await;
        let reply = "Paris is the capital of France.";
        mock.push([Reply::text(reply), Reply::text(reply)]);
        let json = create(
            &gw,
            &gw.key,
            &body("svc/sonnet", json!("Capital of France?")),
        )
        .await;
        assert_eq!(output_text(&json), reply, "{adapter:?}");
        assert_eq!(json["usage"]["output_tokens"], 9, "the upstream's count");
        assert_eq!(json["model"], "svc/sonnet");
        let stream = stream_response(
            &gw,
            &gw.key,
            &streamed(body("svc/sonnet", json!("Capital?"))),
        )
        .await;
        assert_eq!(stream.text, reply, "{adapter:?}");

        let input = json!({"id": "C-7"});
        mock.push([Reply::tool_call("crm__lookup", input.clone())]);
        let mut request = streamed(body("svc/sonnet", json!("Find customer 7")));
        request["tools"] = json!([{"type": "namespace", "name": "crm", "description": "CRM",
            "tools": [{"type": "function", "name": "lookup",
                       "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}]}]);
        let stream = stream_response(&gw, &gw.key, &request).await;
        let call = &stream.items[0];
        assert_eq!(call["type"], "function_call", "{adapter:?}: {call}");
        assert_eq!(call["name"], "lookup");
        assert_eq!(call["namespace"], "crm");
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, input);
        let offered = mock.last_body();
        let offered_name = match adapter {
            Adapter::Anthropic => &offered["tools"][0]["name"],
            Adapter::OpenAi => &offered["tools"][0]["function"]["name"],
        };
        assert_eq!(offered_name, "crm__lookup");

        mock.push([Reply::text("Customer 7 is Ada.")]);
        let mut next = body(
            "svc/sonnet",
            json!([
            {"role": "user", "content": "Find customer 7"},
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "Ada"}]),
        );
        next["tools"] = request["tools"].clone();
        let answer = create(&gw, &gw.key, &next).await;
        assert_eq!(output_text(&answer), "Customer 7 is Ada.");
        assert!(carries_tool_result(&mock.last_body()), "{adapter:?}");
    }
}

#[tokio::test]
async fn opus_thinking_round_trips_with_its_signature_to_an_anthropic_upstream() {
    let (mock, gw, _manifests) = routed(Adapter::Anthropic).await;
    mock.push([Reply::tool_call("get_weather", weather_tool_input())
        .thinking_first("Weather needs the tool.", "sig-abc123")]);
    let mut request = body("svc/opus", json!("Weather in Paris?"));
    request["reasoning"] = json!({"effort": "medium", "summary": "auto"});
    request["include"] = json!(["reasoning.encrypted_content"]);
    request["store"] = json!(false);
    request["tools"] = json!([function_tool()]);
    request["max_output_tokens"] = json!(10_000);
    let stream = stream_response(&gw, &gw.key, &streamed(request.clone())).await;
    assert_eq!(
        mock.last_body()["thinking"]["budget_tokens"],
        4_096,
        "effort medium asks for thinking"
    );
    let reasoning = stream.items[0].clone();
    assert_eq!(reasoning["summary"][0]["text"], "Weather needs the tool.");
    let call = stream.items[1].clone();

    mock.push([Reply::text("Sunny.")]);
    let mut next = request.clone();
    next["input"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        reasoning, call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]);
    let answer = create(&gw, &gw.key, &next).await;
    assert_eq!(output_text(&answer), "Sunny.");
    let sent = mock.last_body();
    let assistant = &sent["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["content"][0]["type"], "thinking", "{sent}");
    assert_eq!(
        assistant["content"][0]["thinking"],
        "Weather needs the tool."
    );
    assert_eq!(assistant["content"][0]["signature"], "sig-abc123");
    assert_eq!(assistant["content"][1]["type"], "tool_use");
    assert_eq!(assistant["content"][1]["id"], call["call_id"]);
    assert_eq!(
        sent["messages"][2]["content"][0]["tool_use_id"],
        call["call_id"]
    );
}

#[tokio::test]
async fn an_upstream_failure_mid_stream_ends_with_response_failed_then_an_error_in_the_envelope_and_bills_nothing(
) {
    let (mock, gw, _manifests) = routed(Adapter::Anthropic).await;
    mock.push([Reply::text(&words(30)).fault(Fault::OverloadedAfter(5))]);
    let account_id = gw.account(&gw.key).await["id"].as_str().unwrap().to_owned();
    let before = gw.balance(&gw.key).await;
    let stream = stream_response(&gw, &gw.key, &streamed(body("svc/sonnet", json!("hi")))).await;
    assert_eq!(stream.end, "response.failed", "{:?}", stream.names());
    assert_eq!(stream.response["status"], "failed");
    assert!(
        stream.response["error"]["message"].is_string(),
        "{}",
        stream.response
    );
    let error = stream.error.expect("an error event after response.failed");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "overloaded_error", "{error}");
    assert_eq!(error["message"], error["error"]["message"]);
    gw.wait_settled(&account_id).await;
    assert_eq!(
        gw.balance(&gw.key).await,
        before,
        "a failed turn is billed nothing"
    );
}

#[tokio::test]
async fn a_request_shaped_like_codex_streams_on_opus_with_its_reasoning_sealed() {
    let gw = Gateway::start().await;
    let request = json!({
        "model": "svc/opus",
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "List the files"}]}
        ],
        "tools": [
            {"type": "function", "name": "shell", "description": "Runs a command", "strict": false,
             "parameters": {"type": "object", "properties": {"command": {"type": "array",
                 "items": {"type": "string"}}}, "required": ["command"]}},
            {"type": "namespace", "name": "mcp__files", "description": "Files",
             "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}]},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a7c2-session",
        "text": {"verbosity": "medium"}
    });
    let stream = stream_response(&gw, &gw.key, &request).await;
    assert_eq!(stream.end, "response.completed");
    assert_eq!(stream.items[0]["type"], "reasoning");
    assert!(stream.items[0]["encrypted_content"].is_string());
    assert!(stream.text.ends_with("List the files"), "{}", stream.text);
    assert_eq!(stream.response["store"], false);
    assert_eq!(stream.response["parallel_tool_calls"], false);
}
