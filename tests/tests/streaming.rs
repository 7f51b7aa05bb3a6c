//! Streaming: the Anthropic SSE event grammar and payloads, the OpenAI chunk stream, tool use
//! and thinking blocks, and what a client that disconnects mid-stream pays.

use std::time::Duration;

use e2e::sse::{assemble_chat_stream, assemble_message_stream};
use e2e::*;
use serde_json::{json, Value};

async fn stream_message(gw: &Gateway, key: &str, body: &Value) -> MessageStream {
    let stream = gw.stream("/v1/messages", key, body).await;
    stream.expect_sse();
    assemble_message_stream(&stream.collect().await)
}

async fn stream_chat(gw: &Gateway, key: &str, body: &Value) -> ChatStream {
    let stream = gw.stream("/v1/chat/completions", key, body).await;
    stream.expect_sse();
    assemble_chat_stream(&stream.collect().await)
}

#[tokio::test]
async fn a_message_stream_follows_the_anthropic_event_order_and_matches_the_json_reply() {
    let gw = Gateway::start().await;
    let json_reply = gw
        .post_messages(&gw.key, &message("svc/haiku", "stream me please", 256))
        .await
        .expect_ok();
    let stream = stream_message(
        &gw,
        &gw.key,
        &message_stream("svc/haiku", "stream me please", 256),
    )
    .await;

    let start = &stream.message;
    assert!(
        stream.id().starts_with("msg_"),
        "message id {}",
        stream.id()
    );
    assert_ne!(
        stream.id(),
        json_reply["id"].as_str().unwrap(),
        "ids are unique"
    );
    assert_eq!(start["type"], "message");
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["model"], "svc/haiku");
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null(), "{start}");
    assert_eq!(
        start["usage"]["input_tokens"],
        json_reply["usage"]["input_tokens"]
    );

    assert_eq!(stream.blocks.len(), 1);
    assert_eq!(stream.blocks[0].start, json!({"type": "text", "text": ""}));
    assert_eq!(stream.text(), response_text(&json_reply));
    assert!(
        stream.text().ends_with("You said: stream me please"),
        "{}",
        stream.text()
    );

    assert_eq!(stream.delta["stop_reason"], "end_turn");
    assert!(stream.delta["stop_sequence"].is_null());
    assert_eq!(
        stream.usage["output_tokens"],
        json_reply["usage"]["output_tokens"]
    );
    assert_eq!(stream.credits(), credits_of(&json_reply));
    assert!(
        stream
            .events
            .iter()
            .filter(|e| e.name() == "content_block_delta")
            .count()
            > 1,
        "the reply arrives in several deltas"
    );
}

#[tokio::test]
async fn the_json_reply_has_the_anthropic_message_shape() {
    let gw = Gateway::start().await;
    let body = gw
        .post_messages(&gw.key, &message("svc/sonnet", "shape check", 256))
        .await
        .expect_ok();
    assert!(body["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["model"], "svc/sonnet");
    assert_eq!(body["stop_reason"], "end_turn");
    assert!(body["stop_sequence"].is_null());
    assert_eq!(body["content"][0]["type"], "text");
    assert!(response_text(&body).starts_with("This is a simulated reply from svc/sonnet."));
    assert!(response_text(&body).ends_with("You said: shape check"));
}

#[tokio::test]
async fn max_tokens_truncates_the_stream_with_stop_reason_max_tokens() {
    let gw = Gateway::start().await;
    let stream = stream_message(
        &gw,
        &gw.key,
        &message_stream("svc/haiku", "a long answer please", 4),
    )
    .await;
    assert_eq!(stream.delta["stop_reason"], "max_tokens");
    assert_eq!(stream.usage["output_tokens"], 4);
    let json_reply = gw
        .post_messages(&gw.key, &message("svc/haiku", "a long answer please", 4))
        .await
        .expect_ok();
    assert_eq!(json_reply["stop_reason"], "max_tokens");
    assert_eq!(stream.text(), response_text(&json_reply));
}

#[tokio::test]
async fn a_stop_sequence_cuts_the_reply_with_stop_reason_stop_sequence() {
    let gw = Gateway::start().await;
    let mut body = message("svc/haiku", "stop here", 256);
    body["stop_sequences"] = json!(["never-produced", "You said"]);
    let json_reply = gw.post_messages(&gw.key, &body).await.expect_ok();
    assert_eq!(json_reply["stop_reason"], "stop_sequence");
    assert_eq!(json_reply["stop_sequence"], "You said");
    let text = response_text(&json_reply);
    assert!(!text.contains("You said"), "{text}");
    assert!(text.starts_with("This is a simulated reply"), "{text}");

    body["stream"] = json!(true);
    let stream = stream_message(&gw, &gw.key, &body).await;
    assert_eq!(stream.delta["stop_reason"], "stop_sequence");
    assert_eq!(stream.delta["stop_sequence"], "You said");
    assert_eq!(stream.text(), text);
}

#[tokio::test]
async fn a_simulated_reply_with_no_content_is_one_empty_text_block_in_json_and_in_the_stream() {
    let gw = Gateway::start().await;
    // A forced tool call that max_tokens leaves no room for: no block at all. A stop sequence
    // at the reply's first word: an empty text block.
    let mut no_room = tool_request("svc/sonnet", false);
    no_room["max_tokens"] = json!(1);
    let mut stopped_at_once = message("svc/haiku", "hi", 100);
    stopped_at_once["stop_sequences"] = json!(["This"]);
    for (body, stop_reason) in [(no_room, "max_tokens"), (stopped_at_once, "stop_sequence")] {
        let json_reply = gw.post_messages(&gw.key, &body).await.expect_ok();
        assert_eq!(
            json_reply["content"],
            json!([{"type": "text", "text": ""}]),
            "{json_reply}"
        );
        assert_eq!(json_reply["stop_reason"], stop_reason);
        assert_eq!(json_reply["usage"]["output_tokens"], 0, "{json_reply}");

        let mut body = body;
        body["stream"] = json!(true);
        let stream = stream_message(&gw, &gw.key, &body).await;
        assert_eq!(stream.blocks.len(), 1, "{:?}", stream.blocks);
        assert_eq!(stream.blocks[0].start, json!({"type": "text", "text": ""}));
        assert_eq!(stream.text(), "");
        assert_eq!(stream.delta["stop_reason"], stop_reason);
        assert_eq!(stream.usage["output_tokens"], 0);
    }
}

fn tool_request(model: &str, stream: bool) -> Value {
    let mut body = message(model, "what is the weather", 512);
    body["tools"] = json!([weather_tool()]);
    body["tool_choice"] = json!({"type": "any"});
    body["stream"] = json!(stream);
    body
}

#[tokio::test]
async fn tool_use_streams_input_json_deltas_that_assemble_to_the_full_input() {
    let gw = Gateway::start().await;
    let stream = stream_message(&gw, &gw.key, &tool_request("svc/sonnet", true)).await;
    assert_eq!(stream.delta["stop_reason"], "tool_use");
    let tool = stream
        .blocks
        .iter()
        .find(|b| b.kind() == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {:#?}", stream.blocks));
    assert_eq!(tool.start["name"], "get_weather");
    assert_eq!(tool.start["input"], json!({}));
    assert!(
        tool.start["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("toolu_")),
        "{}",
        tool.start
    );
    let input: Value = serde_json::from_str(&tool.partial_json).unwrap_or_else(|e| {
        panic!(
            "partial_json does not assemble to JSON ({e}): {:?}",
            tool.partial_json
        )
    });
    assert_eq!(input, weather_tool_input());

    let json_reply = gw
        .post_messages(&gw.key, &tool_request("svc/sonnet", false))
        .await
        .expect_ok();
    assert_eq!(json_reply["stop_reason"], "tool_use");
    let block = tool_use_block(&json_reply);
    assert_eq!(block["input"], input);
    assert_eq!(block["name"], "get_weather");
}

/// The first tool_use block of a JSON reply.
fn tool_use_block(reply: &Value) -> Value {
    reply["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .cloned()
        .expect("tool_use block")
}

#[tokio::test]
async fn tool_choice_auto_calls_a_named_tool_and_answers_a_tool_result_in_text() {
    let gw = Gateway::start().await;
    let mut body = message("svc/haiku", "please call get_weather for Paris", 512);
    body["tools"] = json!([weather_tool()]);
    body["tool_choice"] = json!({"type": "auto"});
    let first = gw.post_messages(&gw.key, &body).await.expect_ok();
    assert_eq!(first["stop_reason"], "tool_use");
    let call = tool_use_block(&first);

    body["messages"] = json!([
        {"role": "user", "content": "please call get_weather for Paris"},
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": "sunny, 21 degrees"}
        ]}
    ]);
    let second = gw.post_messages(&gw.key, &body).await.expect_ok();
    assert_eq!(second["stop_reason"], "end_turn");
    assert!(
        response_text(&second).contains("sunny, 21 degrees"),
        "{second}"
    );

    let mut plain = message("svc/haiku", "no tools mentioned", 512);
    plain["tools"] = json!([weather_tool()]);
    let reply = gw.post_messages(&gw.key, &plain).await.expect_ok();
    assert_eq!(
        reply["stop_reason"], "end_turn",
        "auto does not call an unnamed tool: {reply}"
    );
}

fn thinking_request(stream: bool) -> Value {
    let mut body = message("svc/opus", "think first", 4_096);
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    body["stream"] = json!(stream);
    body
}

#[tokio::test]
async fn adaptive_thinking_on_opus_gives_a_thinking_block_before_the_text() {
    let gw = Gateway::start().await;
    let mut body = message("svc/opus", "decide how long to think", 4_096);
    body["thinking"] = json!({"type": "adaptive"});
    let reply = gw.post_messages(&gw.key, &body).await.expect_ok();
    assert_eq!(reply["content"][0]["type"], "thinking", "{reply}");
    assert_eq!(reply["content"][1]["type"], "text", "{reply}");
}

#[tokio::test]
async fn credits_consumed_is_reported_once_known_in_message_delta_and_not_in_message_start() {
    let gw = Gateway::start().await;
    let stream = stream_message(&gw, &gw.key, &message_stream("svc/haiku", "bill me", 64)).await;
    assert!(
        stream.message["usage"].get("credits_consumed").is_none(),
        "message_start usage must not carry a credits_consumed it cannot know yet: {}",
        stream.message
    );
    assert!(stream.usage["credits_consumed"]
        .as_u64()
        .is_some_and(|c| c > 0));
}

#[tokio::test]
async fn thinking_on_opus_streams_a_signed_thinking_block_before_the_text() {
    let gw = Gateway::start().await;
    let stream = stream_message(&gw, &gw.key, &thinking_request(true)).await;
    assert_eq!(stream.blocks.len(), 2, "{:#?}", stream.blocks);
    let thinking = &stream.blocks[0];
    assert_eq!(thinking.kind(), "thinking");
    assert!(!thinking.thinking.is_empty(), "empty thinking");
    assert!(
        !thinking.signature.is_empty(),
        "thinking block without a signature"
    );
    assert_eq!(stream.blocks[1].kind(), "text");
    assert!(stream.text().ends_with("You said: think first"));

    let json_reply = gw
        .post_messages(&gw.key, &thinking_request(false))
        .await
        .expect_ok();
    let content = json_reply["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking", "{json_reply}");
    assert!(content[0]["thinking"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    assert!(content[0]["signature"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert_eq!(content[1]["type"], "text");

    // Output tokens include the thinking block.
    let without = gw
        .post_messages(&gw.key, &message("svc/opus", "think first", 4_096))
        .await
        .expect_ok();
    assert!(
        json_reply["usage"]["output_tokens"].as_u64() > without["usage"]["output_tokens"].as_u64(),
        "thinking tokens not counted: {} vs {}",
        json_reply["usage"],
        without["usage"]
    );
    assert_eq!(
        stream.usage["output_tokens"],
        json_reply["usage"]["output_tokens"]
    );
}

#[tokio::test]
async fn a_chat_stream_sends_chunks_then_a_usage_chunk_then_done() {
    let gw = Gateway::start().await;
    let json_reply = gw
        .chat(&gw.key, &chat_body("svc/kimi", "chat with me", Some(256)))
        .await
        .expect_ok();
    assert!(
        json_reply["id"].as_str().unwrap().starts_with("chatcmpl_"),
        "{json_reply}"
    );
    assert_eq!(json_reply["object"], "chat.completion");
    assert_eq!(json_reply["model"], "svc/kimi");
    let choice = &json_reply["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "stop");
    let text = choice["message"]["content"]
        .as_str()
        .expect("content string");
    assert!(text.ends_with("You said: chat with me"), "{text}");

    let stream = stream_chat(
        &gw,
        &gw.key,
        &chat_stream_body("svc/kimi", "chat with me", Some(256)),
    )
    .await;
    assert_ne!(stream.id, json_reply["id"].as_str().unwrap());
    assert_eq!(stream.model, "svc/kimi");
    assert_eq!(stream.chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(stream.content, text);
    assert_eq!(stream.finish_reason.as_deref(), Some("stop"));
    let usage = stream.usage.expect("usage chunk with include_usage");
    for field in [
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "credits_consumed",
    ] {
        assert_eq!(usage[field], json_reply["usage"][field], "usage.{field}");
    }
}

#[tokio::test]
async fn a_chat_stream_ends_with_finish_reason_length_at_max_tokens() {
    let gw = Gateway::start().await;
    let stream = stream_chat(
        &gw,
        &gw.key,
        &chat_stream_body("svc/haiku", "longer please", Some(3)),
    )
    .await;
    assert_eq!(stream.finish_reason.as_deref(), Some("length"));
    assert_eq!(stream.usage.expect("usage")["completion_tokens"], 3);
}

#[tokio::test]
async fn chat_tool_calls_stream_arguments_that_assemble_to_the_json_reply() {
    let gw = Gateway::start().await;
    let tool = weather_tool();
    let mut body = chat_body("svc/sonnet", "what is the weather", Some(512));
    body["tools"] = json!([{
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool["description"],
            "parameters": tool["input_schema"],
        }
    }]);
    body["tool_choice"] = json!("required");
    let json_reply = gw.chat(&gw.key, &body).await.expect_ok();
    let choice = &json_reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{json_reply}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments: Value = serde_json::from_str(
        call["function"]["arguments"]
            .as_str()
            .expect("arguments string"),
    )
    .expect("arguments are JSON");
    assert_eq!(arguments, weather_tool_input());

    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let stream = stream_chat(&gw, &gw.key, &body).await;
    assert_eq!(stream.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(stream.tool_calls.len(), 1, "{:?}", stream.tool_calls);
    let (id, name, args) = &stream.tool_calls[0];
    assert!(!id.is_empty());
    assert_eq!(name, "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(args).expect("streamed arguments are JSON"),
        arguments
    );
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_pays_only_for_what_was_generated() {
    let gw = Gateway::builder().chunk_delay_ms(100).start().await;
    let text = words(40);

    // Reference: the whole turn, and how a completed turn is recorded.
    let full = gw
        .post_messages(&gw.key, &message("svc/opus", &text, 1_000))
        .await
        .expect_ok();
    let full_output = full["usage"]["output_tokens"].as_u64().unwrap();
    let completed = gw.message_record(full["id"].as_str().unwrap()).await;

    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let mut stream = gw
        .stream(
            "/v1/messages",
            &key.secret,
            &message_stream("svc/opus", &text, 1_000),
        )
        .await;
    stream.expect_sse();
    let mut seen = Vec::new();
    let start = stream.read_until("message_start", &mut seen).await;
    let id = start.json()["message"]["id"].as_str().unwrap().to_string();
    for _ in 0..3 {
        stream.read_until("content_block_delta", &mut seen).await;
    }
    stream.disconnect();

    gw.wait_settled(&key.account_id).await;
    let row = gw.message_record(&id).await;
    let billed = row["billed"].as_u64().expect("billed");
    let reserved = row["reserved"].as_u64().expect("reserved");
    assert!(billed <= reserved, "{row}");
    assert!(
        billed > 0,
        "the input and the generated tokens are paid: {row}"
    );
    assert!(
        billed < credits_of(&full),
        "billed {billed} for a partial turn, the whole costs {}",
        credits_of(&full)
    );
    let output = row["usage"]["output_tokens"]
        .as_u64()
        .expect("usage.output_tokens");
    assert!(
        output >= 3 && output < full_output,
        "partial output {output} of {full_output}: {row}"
    );
    assert_ne!(
        row["status"], completed["status"],
        "a disconnected turn is recorded as such: {row}"
    );
    assert_eq!(row["stream"], true);
    assert_eq!((before - gw.balance(&key.secret).await) as u64, billed);

    // The key's stream slot is free again.
    poll_until(
        "the stream slot to be released",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async {
            let rl = gw.get("/v1/models", &key.secret).await.rate_limit();
            (rl.remaining_streams == rl.limit_streams).then_some(())
        },
    )
    .await;
}
