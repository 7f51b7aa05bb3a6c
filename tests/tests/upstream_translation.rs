//! Real upstreams behind both endpoints: every model routed to the mock upstream through the
//! `anthropic`, the `openai`, the `azure-openai`, the `bedrock` or the `vertex` adapter, each endpoint
//! in JSON and in SSE;
//! tool calls streamed whole, tool results and images in the upstream's format, thinking with
//! its signature, cache tokens in usage, the client's beta features for an Anthropic upstream
//! only, no provider name, upstream model or upstream key in any response, an empty reply as
//! one empty text block, and the spec's default temperature sent where the upstream's default
//! may differ.

use e2e::sse::{assemble_chat_stream, assemble_message_stream};
use e2e::upstream::{UPSTREAM_API_KEY, UPSTREAM_MODEL};
use e2e::*;
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Adapter {
    Anthropic,
    OpenAi,
    /// The `openai` wire format at Azure's address (`upstream_azure.rs` has the rest).
    AzureOpenAi,
    /// The Messages format on Amazon Bedrock, SigV4-signed (`upstream_bedrock.rs` has the
    /// rest).
    Bedrock,
    /// The Messages format on Google Vertex AI, with a Google token (`upstream_vertex.rs` has
    /// the rest).
    Vertex,
}

const ADAPTERS: [Adapter; 5] = [
    Adapter::Anthropic,
    Adapter::OpenAi,
    Adapter::AzureOpenAi,
    Adapter::Bedrock,
    Adapter::Vertex,
];

/// A gateway whose every model is served by one mock upstream through `adapter`.
struct Rig {
    mock: MockUpstream,
    gw: Gateway,
    _manifests: RoutedManifests,
}

impl Rig {
    async fn start(adapter: Adapter) -> Rig {
        let mock = MockUpstream::start().await;
        let upstream = match adapter {
            Adapter::Anthropic => UpstreamDef::anthropic(&mock),
            Adapter::OpenAi => UpstreamDef::openai(&mock),
            Adapter::AzureOpenAi => UpstreamDef::azure(&mock),
            Adapter::Bedrock => UpstreamDef::bedrock(&mock),
            Adapter::Vertex => UpstreamDef::vertex(&mock),
        };
        let manifests = RoutedManifests::new(&[upstream]);
        let gw = Gateway::builder().manifests(&manifests.path).start().await;
        Rig {
            mock,
            gw,
            _manifests: manifests,
        }
    }

    async fn message_stream(&self, body: &Value) -> MessageStream {
        let stream = self.gw.stream("/v1/messages", &self.gw.key, body).await;
        stream.expect_sse();
        assemble_message_stream(&stream.collect().await)
    }

    async fn chat_stream(&self, body: &Value) -> ChatStream {
        let stream = self
            .gw
            .stream("/v1/chat/completions", &self.gw.key, body)
            .await;
        stream.expect_sse();
        assemble_chat_stream(&stream.collect().await)
    }
}

fn with_tools(mut body: Value, tools: Value) -> Value {
    body["tools"] = tools;
    body
}

fn chat_tool() -> Value {
    let tool = weather_tool();
    json!([{"type": "function", "function": {"name": tool["name"],
        "description": tool["description"], "parameters": tool["input_schema"]}}])
}

#[tokio::test]
async fn both_endpoints_answer_through_each_adapter_in_json_and_in_streams() {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        let reply = "Paris is the capital of France.";
        rig.mock.push((0..4).map(|_| Reply::text(reply)));

        let json = rig
            .gw
            .post_messages(
                &rig.gw.key,
                &message("svc/sonnet", "Capital of France?", 100),
            )
            .await
            .expect_ok();
        assert_eq!(response_text(&json), reply, "{adapter:?}");
        assert_eq!(json["model"], "svc/sonnet");
        assert_eq!(json["stop_reason"], "end_turn");
        assert_eq!(
            json["usage"]["output_tokens"], 9,
            "the upstream's count: {json}"
        );

        let stream = rig
            .message_stream(&message_stream("svc/sonnet", "Capital of France?", 100))
            .await;
        assert_eq!(stream.text(), reply, "{adapter:?}");
        assert_eq!(stream.delta["stop_reason"], "end_turn");
        assert_eq!(stream.blocks.len(), 1, "{adapter:?}: {:?}", stream.blocks);

        let chat = rig
            .gw
            .chat(
                &rig.gw.key,
                &chat_body("svc/sonnet", "Capital of France?", Some(100)),
            )
            .await
            .expect_ok();
        assert_eq!(chat["choices"][0]["message"]["content"], reply);
        assert_eq!(chat["choices"][0]["finish_reason"], "stop");
        assert_eq!(chat["usage"]["completion_tokens"], 9);

        let chunks = rig
            .chat_stream(&chat_stream_body(
                "svc/sonnet",
                "Capital of France?",
                Some(100),
            ))
            .await;
        assert_eq!(chunks.content, reply, "{adapter:?}");
        assert_eq!(chunks.finish_reason.as_deref(), Some("stop"));

        let received = rig.mock.received();
        assert_eq!(received.len(), 4);
        for request in &received {
            if adapter == Adapter::Bedrock {
                // The model is in the path, the stream is the endpoint's, both signed.
                assert_eq!(
                    request.path,
                    "/model/anthropic.upstream-model-zq7-v1%3A0/invoke-with-response-stream"
                );
                assert!(request.body.get("model").is_none(), "{}", request.body);
                assert!(request.body.get("stream").is_none(), "{}", request.body);
                assert_eq!(request.body["anthropic_version"], "bedrock-2023-05-31");
                let authorization = request.headers["authorization"].to_str().unwrap();
                assert!(
                    authorization.starts_with(&format!(
                        "AWS4-HMAC-SHA256 Credential={}/",
                        bedrock::ACCESS_KEY_ID
                    )),
                    "{authorization}"
                );
                assert_eq!(
                    request.headers["x-amz-security-token"],
                    bedrock::SESSION_TOKEN
                );
                continue;
            }
            if adapter == Adapter::Vertex {
                // The model is in the path; the token is the mock's own.
                assert!(
                    request.path.ends_with(&format!(
                        "/publishers/anthropic/models/{}:streamRawPredict",
                        vertex::MODEL_ID
                    )),
                    "{}",
                    request.path
                );
                assert!(request.body.get("model").is_none(), "{}", request.body);
                assert_eq!(request.body["stream"], true, "adapters always stream");
                assert_eq!(request.body["anthropic_version"], vertex::ANTHROPIC_VERSION);
                let authorization = request.headers["authorization"].to_str().unwrap();
                assert!(authorization.starts_with("Bearer ya29."), "{authorization}");
                continue;
            }
            assert_eq!(
                request.body["model"], UPSTREAM_MODEL,
                "the upstream's own model name"
            );
            assert_eq!(request.body["stream"], true, "adapters always stream");
            match adapter {
                Adapter::Anthropic => {
                    assert_eq!(request.path, "/v1/messages");
                    assert_eq!(request.headers["x-api-key"], UPSTREAM_API_KEY);
                    assert!(request.headers.contains_key("anthropic-version"));
                }
                Adapter::OpenAi => {
                    assert_eq!(request.path, "/v1/chat/completions");
                    assert_eq!(
                        request.headers["authorization"],
                        format!("Bearer {UPSTREAM_API_KEY}").as_str()
                    );
                    assert_eq!(request.body["stream_options"]["include_usage"], true);
                }
                Adapter::AzureOpenAi => {
                    assert_eq!(
                        request.path,
                        format!("/openai/deployments/{UPSTREAM_MODEL}/chat/completions")
                    );
                    assert_eq!(request.headers["api-key"], UPSTREAM_API_KEY);
                    assert!(request.headers.get("authorization").is_none());
                    assert_eq!(request.body["stream_options"]["include_usage"], true);
                }
                Adapter::Bedrock | Adapter::Vertex => unreachable!("checked above"),
            }
        }
        assert_eq!(
            rig.mock.refused_count(),
            0,
            "{adapter:?}: a refused signature"
        );
    }
}

#[tokio::test]
async fn a_streamed_tool_call_arrives_whole_with_stop_reason_tool_use_and_no_empty_text_block() {
    let input = json!({"location": "Paris, \"FR\"", "days": 3, "metric": true, "tags": ["a", "b"]});
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock
            .push((0..3).map(|_| Reply::tool_call("get_weather", input.clone())));

        let body = with_tools(
            message_stream("svc/sonnet", "Weather in Paris?", 200),
            json!([weather_tool()]),
        );
        let stream = rig.message_stream(&body).await;
        assert_eq!(stream.blocks.len(), 1, "{adapter:?}: {:?}", stream.blocks);
        let block = &stream.blocks[0];
        assert_eq!(block.kind(), "tool_use", "{adapter:?}");
        assert_eq!(block.start["name"], "get_weather");
        assert_eq!(block.start["input"], json!({}));
        let assembled: Value = serde_json::from_str(&block.partial_json).expect("whole JSON");
        assert_eq!(assembled, input, "{adapter:?}");
        assert_eq!(stream.delta["stop_reason"], "tool_use", "{adapter:?}");

        let body = with_tools(
            message("svc/sonnet", "Weather in Paris?", 200),
            json!([weather_tool()]),
        );
        let json = rig.gw.post_messages(&rig.gw.key, &body).await.expect_ok();
        assert_eq!(
            json["content"][0]["type"], "tool_use",
            "{adapter:?}: {json}"
        );
        assert_eq!(json["content"][0]["input"], input);
        assert_eq!(json["stop_reason"], "tool_use");

        let mut chat = chat_stream_body("svc/sonnet", "Weather in Paris?", Some(200));
        chat["tools"] = chat_tool();
        let chunks = rig.chat_stream(&chat).await;
        assert_eq!(chunks.tool_calls.len(), 1, "{adapter:?}");
        let (id, name, arguments) = &chunks.tool_calls[0];
        assert!(!id.is_empty());
        assert_eq!(name, "get_weather");
        assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), input);
        assert_eq!(chunks.finish_reason.as_deref(), Some("tool_calls"));
    }
}

/// The content of an empty answer, as the Messages API gives it.
fn one_empty_text_block() -> Value {
    json!([{"type": "text", "text": ""}])
}

#[tokio::test]
async fn an_empty_upstream_reply_is_one_empty_text_block_in_json_and_in_the_stream_billed_as_reported(
) {
    // An empty text block (as the Messages API streams an empty answer, and as a chat
    // upstream opens every answer) and no block at all; each billed its own usage:
    // Sonnet at $3 in and $15 out per MTok, 100,000 credits per USD, rounded up once.
    let replies = [
        ("an empty text block", Reply::text(""), 9, 20),
        ("no block", Reply::empty(), 0, 7),
    ];
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        for (what, reply, output_tokens, credits) in &replies {
            rig.mock.push((0..5).map(|_| reply.clone()));
            let case = format!("{adapter:?}, {what}");

            let json = rig
                .gw
                .post_messages(&rig.gw.key, &message("svc/sonnet", "Say nothing.", 100))
                .await
                .expect_ok();
            assert_eq!(json["content"], one_empty_text_block(), "{case}: {json}");
            assert_eq!(json["stop_reason"], "end_turn", "{case}");
            assert_eq!(json["usage"]["output_tokens"], *output_tokens, "{case}");
            assert_eq!(credits_of(&json), *credits, "{case}: {json}");

            let stream = rig
                .message_stream(&message_stream("svc/sonnet", "Say nothing.", 100))
                .await;
            assert_eq!(stream.blocks.len(), 1, "{case}: {:?}", stream.blocks);
            assert_eq!(stream.blocks[0].start, one_empty_text_block()[0], "{case}");
            assert_eq!(stream.text(), "", "{case}");
            assert_eq!(stream.usage["output_tokens"], *output_tokens, "{case}");
            assert_eq!(stream.credits(), *credits, "{case}");

            // Chat Completions answers an empty string, as it always did.
            let chat = rig
                .gw
                .chat(
                    &rig.gw.key,
                    &chat_body("svc/sonnet", "Say nothing.", Some(100)),
                )
                .await
                .expect_ok();
            assert_eq!(chat["choices"][0]["message"]["content"], "", "{case}");
            let chunks = rig
                .chat_stream(&chat_stream_body("svc/sonnet", "Say nothing.", Some(100)))
                .await;
            assert_eq!(chunks.content, "", "{case}");
            assert_eq!(chunks.finish_reason.as_deref(), Some("stop"), "{case}");

            // The Responses API answers one message with an empty output_text.
            let response = rig
                .gw
                .post_json(
                    "/v1/responses",
                    &rig.gw.key,
                    &json!({"model": "svc/sonnet", "input": "Say nothing."}),
                )
                .await
                .expect_ok();
            let output = &response["output"];
            assert_eq!(
                output.as_array().map(Vec::len),
                Some(1),
                "{case}: {response}"
            );
            assert_eq!(output[0]["type"], "message", "{case}");
            assert_eq!(output[0]["content"][0]["type"], "output_text", "{case}");
            assert_eq!(output[0]["content"][0]["text"], "", "{case}");
        }
        assert_eq!(rig.mock.request_count(), 10, "{adapter:?}");
    }
}

#[tokio::test]
async fn a_tool_result_round_trip_reaches_the_upstream_in_its_own_format() {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock.push([
            Reply::tool_call("get_weather", json!({"location": "Oslo"})),
            Reply::text("It is sunny in Oslo."),
        ]);
        let first = rig
            .gw
            .post_messages(
                &rig.gw.key,
                &with_tools(
                    message("svc/haiku", "Weather in Oslo?", 200),
                    json!([weather_tool()]),
                ),
            )
            .await
            .expect_ok();
        let call = first["content"][0].clone();
        let id = call["id"].as_str().expect("tool_use id").to_owned();
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
        let answer = rig.gw.post_messages(&rig.gw.key, &second).await.expect_ok();
        assert_eq!(response_text(&answer), "It is sunny in Oslo.");

        let sent = rig.mock.last_body();
        match adapter {
            Adapter::Anthropic | Adapter::Bedrock | Adapter::Vertex => {
                assert_eq!(sent["system"], "You are terse.");
                assert_eq!(sent["messages"][1]["content"][0]["type"], "tool_use");
                assert_eq!(
                    sent["messages"][2]["content"][0]["tool_use_id"],
                    id.as_str()
                );
            }
            Adapter::OpenAi | Adapter::AzureOpenAi => {
                let messages = sent["messages"].as_array().unwrap();
                let roles: Vec<&str> = messages
                    .iter()
                    .map(|m| m["role"].as_str().unwrap())
                    .collect();
                assert_eq!(
                    roles,
                    ["system", "user", "assistant", "tool", "user"],
                    "{sent}"
                );
                let calls = &messages[2]["tool_calls"];
                assert_eq!(calls[0]["id"], id.as_str());
                assert_eq!(calls[0]["function"]["name"], "get_weather");
                let args: Value =
                    serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
                        .unwrap();
                assert_eq!(args, json!({"location": "Oslo"}));
                assert_eq!(messages[3]["tool_call_id"], id.as_str());
                assert_eq!(messages[3]["content"], "sunny, 21C");
                assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
            }
        }
    }
}

/// Letters, digits, `_` and `-`: the tool call ids the Messages API takes.
fn messages_api_id(id: &Value) -> bool {
    id.as_str().is_some_and(|id| {
        !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    })
}

#[tokio::test]
async fn chat_tool_calls_carry_call_ids_and_any_id_sent_back_reaches_the_upstream_as_a_matching_pair(
) {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock.push([
            Reply::tool_call("get_weather", json!({"location": "Oslo"})),
            Reply::tool_call("get_weather", json!({"location": "Oslo"})),
        ]);
        let mut ask = chat_body("svc/haiku", "Weather in Oslo?", Some(200));
        ask["tools"] = chat_tool();
        let first = rig.gw.chat(&rig.gw.key, &ask).await.expect_ok();
        let call = first["choices"][0]["message"]["tool_calls"][0].clone();
        let id = call["id"].as_str().unwrap_or_default().to_owned();
        assert!(id.starts_with("call_"), "{adapter:?}: {first}");
        ask["stream"] = json!(true);
        let streamed = rig.chat_stream(&ask).await;
        assert!(
            streamed.tool_calls[0].0.starts_with("call_"),
            "{adapter:?}: {:?}",
            streamed.tool_calls
        );

        for client_id in [
            id.as_str(),
            "toolu_01XyZ",
            "functions.get_weather:0",
            "call 7",
        ] {
            let mut assistant = first["choices"][0]["message"].clone();
            assistant["tool_calls"][0]["id"] = json!(client_id);
            let mut second = chat_body("svc/haiku", "Weather in Oslo?", Some(200));
            second["tools"] = chat_tool();
            second["messages"] = json!([
                {"role": "user", "content": "Weather in Oslo?"},
                assistant,
                {"role": "tool", "tool_call_id": client_id, "content": "sunny, 21C"},
            ]);
            let answer = rig.gw.chat(&rig.gw.key, &second).await.expect_ok();
            let text = answer["choices"][0]["message"]["content"].as_str();
            assert_eq!(
                text,
                Some("Hello from upstream."),
                "{adapter:?} {client_id}"
            );

            let sent = rig.mock.last_body();
            let (call_id, result_id) = match adapter {
                Adapter::Anthropic | Adapter::Bedrock | Adapter::Vertex => (
                    sent["messages"][1]["content"][0]["id"].clone(),
                    sent["messages"][2]["content"][0]["tool_use_id"].clone(),
                ),
                Adapter::OpenAi | Adapter::AzureOpenAi => (
                    sent["messages"][1]["tool_calls"][0]["id"].clone(),
                    sent["messages"][2]["tool_call_id"].clone(),
                ),
            };
            assert_eq!(call_id, result_id, "{adapter:?} {client_id}: {sent}");
            assert!(messages_api_id(&call_id), "{adapter:?} {client_id}: {sent}");
            if messages_api_id(&json!(client_id)) {
                assert_eq!(call_id, client_id, "a safe id is passed on as it is");
            }
        }
    }
}

#[tokio::test]
async fn chat_reasoning_effort_is_a_thinking_budget_on_opus_and_left_out_on_models_without_thinking(
) {
    let rig = Rig::start(Adapter::Anthropic).await;
    let cases = [
        (
            "svc/opus",
            "low",
            Some(8_000),
            json!({"type": "enabled", "budget_tokens": 1024}),
        ),
        (
            "svc/opus",
            "medium",
            Some(8_000),
            json!({"type": "enabled", "budget_tokens": 4096}),
        ),
        (
            "svc/opus",
            "high",
            Some(8_000),
            json!({"type": "enabled", "budget_tokens": 7999}),
        ),
        (
            "svc/opus",
            "high",
            None,
            json!({"type": "enabled", "budget_tokens": 16384}),
        ),
        ("svc/opus", "low", Some(1_000), Value::Null),
        ("svc/opus", "none", Some(8_000), Value::Null),
        ("svc/sonnet", "high", Some(8_000), Value::Null),
        ("svc/kimi", "medium", None, Value::Null),
        ("svc/auto", "high", Some(8_000), Value::Null),
    ];
    for (model, effort, max_tokens, thinking) in cases {
        let mut body = chat_body(model, "Think first.", max_tokens);
        body["reasoning_effort"] = json!(effort);
        rig.gw.chat(&rig.gw.key, &body).await.expect_ok();
        let sent = rig.mock.last_body();
        assert_eq!(
            sent["thinking"], thinking,
            "{model} {effort} {max_tokens:?}"
        );
    }
    let mut unknown = chat_body("svc/opus", "Think first.", Some(8_000));
    unknown["reasoning_effort"] = json!("enormous");
    rig.gw
        .chat(&rig.gw.key, &unknown)
        .await
        .expect_invalid(&["reasoning_effort"]);

    let mut messages = message("svc/sonnet", "Think first.", 8_000);
    messages["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    rig.gw
        .post_messages(&rig.gw.key, &messages)
        .await
        .expect_ok();
    assert_eq!(rig.mock.last_body().get("thinking"), None);
}

#[tokio::test]
async fn an_omitted_temperature_reaches_a_chat_upstream_as_the_specs_1_and_an_anthropic_upstream_as_omitted(
) {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        // The spec's default: sent where the upstream's own default may differ.
        let default = match adapter {
            Adapter::Anthropic | Adapter::Bedrock | Adapter::Vertex => Value::Null,
            Adapter::OpenAi | Adapter::AzureOpenAi => json!(1.0),
        };
        let mut top_p_only = message("svc/sonnet", "hi", 50);
        top_p_only["top_p"] = json!(0.9);
        let mut explicit = message("svc/sonnet", "hi", 50);
        explicit["temperature"] = json!(0.3);
        let mut explicit_zero = chat_body("svc/sonnet", "hi", Some(50));
        explicit_zero["temperature"] = json!(0);
        let mut thinking = message("svc/opus", "hi", 4000);
        thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
        let cases = [
            (
                "/v1/messages",
                message("svc/sonnet", "hi", 50),
                default.clone(),
            ),
            ("/v1/messages", top_p_only, default.clone()),
            (
                "/v1/chat/completions",
                chat_body("svc/sonnet", "hi", Some(50)),
                default.clone(),
            ),
            (
                "/v1/responses",
                json!({"model": "svc/sonnet", "input": "hi"}),
                default.clone(),
            ),
            ("/v1/messages", explicit, json!(0.3)),
            ("/v1/chat/completions", explicit_zero, json!(0.0)),
            // A thinking model's server keeps the sampling it is tuned for while thinking.
            ("/v1/messages", thinking, Value::Null),
        ];
        let count = cases.len();
        for (path, body, sent) in cases {
            rig.gw.post_json(path, &rig.gw.key, &body).await.expect_ok();
            let upstream = rig.mock.last_body();
            assert_eq!(upstream["temperature"], sent, "{adapter:?} {path}: {body}");
        }
        assert_eq!(rig.mock.request_count(), count, "{adapter:?}");
    }
}

/// A 1x1 transparent PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

#[tokio::test]
async fn images_reach_the_upstream_in_its_own_format() {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock.push([Reply::text("A transparent pixel.")]);
        let body = json!({
            "model": "svc/sonnet",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                {"type": "text", "text": "What is this?"}
            ]}]
        });
        let answer = rig.gw.post_messages(&rig.gw.key, &body).await.expect_ok();
        assert_eq!(response_text(&answer), "A transparent pixel.");
        let sent = rig.mock.last_body();
        let part = &sent["messages"][0]["content"][0];
        match adapter {
            Adapter::Anthropic | Adapter::Bedrock | Adapter::Vertex => {
                assert_eq!(part["type"], "image");
                assert_eq!(part["source"]["data"], PNG);
            }
            Adapter::OpenAi | Adapter::AzureOpenAi => {
                assert_eq!(part["type"], "image_url");
                assert_eq!(
                    part["image_url"]["url"],
                    format!("data:image/png;base64,{PNG}").as_str()
                );
            }
        }
    }
}

#[tokio::test]
async fn thinking_on_opus_streams_before_the_answer_with_the_upstreams_signature() {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock
            .push([Reply::text("42.").thinking_first("Six times seven.", "sig-abc123")]);
        let mut body = message_stream("svc/opus", "What is 6*7?", 2000);
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
        let stream = rig.message_stream(&body).await;
        assert_eq!(stream.blocks.len(), 2, "{adapter:?}: {:?}", stream.blocks);
        assert_eq!(stream.blocks[0].kind(), "thinking");
        assert_eq!(stream.blocks[0].thinking, "Six times seven.");
        assert_eq!(stream.text(), "42.");
        match adapter {
            Adapter::Anthropic | Adapter::Bedrock | Adapter::Vertex => {
                assert_eq!(stream.blocks[0].signature, "sig-abc123");
                assert_eq!(rig.mock.last_body()["thinking"]["budget_tokens"], 1024);
            }
            // Chat completions carry no signature for reasoning.
            Adapter::OpenAi | Adapter::AzureOpenAi => assert_eq!(stream.blocks[0].signature, ""),
        }
    }
}

#[tokio::test]
async fn cache_reads_and_writes_are_reported_in_usage_and_billed() {
    let usage = MockUsage {
        input: 40,
        output: 9,
        cache_read: 1000,
        cache_write: 300,
    };
    // A prompt the gateway counts above the upstream's 1,340 tokens, with a cache breakpoint,
    // so the reservation covers the turn.
    let mut body = message_stream("svc/sonnet", "hi", 100);
    body["system"] = json!([{"type": "text", "text": words(1400),
        "cache_control": {"type": "ephemeral"}}]);
    // Anthropic: both counts, in message_start and in message_delta.
    let rig = Rig::start(Adapter::Anthropic).await;
    rig.mock.push([Reply::text("cached").usage(usage)]);
    let stream = rig.message_stream(&body).await;
    for place in [&stream.message["usage"], &stream.usage] {
        assert_eq!(place["input_tokens"], 40, "{place}");
        assert_eq!(place["cache_read_input_tokens"], 1000, "{place}");
        assert_eq!(place["cache_creation_input_tokens"], 300, "{place}");
    }
    assert_eq!(stream.usage["output_tokens"], 9);
    // Sonnet: $3 in, $15 out, $3.75 cache write, $0.30 cache read per MTok; 100,000 credits
    // per USD: (40*3 + 9*15 + 300*3.75 + 1000*0.30) / 10 = 168.
    assert_eq!(stream.credits(), 168);

    // OpenAI-compatible: cached prompt tokens are cache reads, out of input_tokens.
    let rig = Rig::start(Adapter::OpenAi).await;
    rig.mock.push([Reply::text("cached").usage(usage)]);
    body["stream"] = json!(false);
    let json = rig.gw.post_messages(&rig.gw.key, &body).await.expect_ok();
    assert_eq!(json["usage"]["input_tokens"], 40, "{json}");
    assert_eq!(json["usage"]["cache_read_input_tokens"], 1000);
    assert_eq!(json["usage"]["cache_creation_input_tokens"], 0);
    // No cache write: (40*3 + 9*15 + 1000*0.30) / 10 = 55.5, rounded up once per turn.
    assert_eq!(credits_of(&json), 56, "{json}");
}

#[tokio::test]
async fn no_response_names_the_provider_the_upstream_model_or_its_key() {
    // Every response read through the harness is checked (bodies, SSE data, headers); this
    // test drives each path that carries upstream data, including upstream error bodies that
    // name the provider and the model.
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock.push([
            Reply::text("fine"),
            Reply::text("fine"),
            Reply::status(400),
            Reply::status(500),
            Reply::text("fine").fault(Fault::MalformedAfter(3)),
        ]);
        rig.gw
            .post_messages(&rig.gw.key, &message("svc/kimi", "hi", 50))
            .await
            .expect_ok();
        rig.message_stream(&message_stream("svc/kimi", "hi", 50))
            .await;
        let rejected = rig
            .gw
            .post_messages(&rig.gw.key, &message("svc/kimi", "hi", 50))
            .await;
        rejected.expect_error(400, "invalid_request_error");
        let failed = rig
            .gw
            .chat(&rig.gw.key, &chat_body("svc/kimi", "hi", Some(50)))
            .await;
        failed.expect_error(502, "api_error");
        let broken = rig
            .gw
            .stream(
                "/v1/messages",
                &rig.gw.key,
                &message_stream("svc/kimi", "hi", 50),
            )
            .await;
        let events = broken.collect().await;
        assert_eq!(
            events.last().map(|e| e.name().to_owned()).as_deref(),
            Some("error")
        );
        let models = rig.gw.get("/v1/models", &rig.gw.key).await.expect_ok();
        // The five chat models and svc/embed.
        assert_eq!(models["data"].as_array().map(Vec::len), Some(6));
    }
}

#[tokio::test]
async fn claude_codes_mid_conversation_system_messages_are_folded_for_the_upstream() {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock.push([Reply::text("ok")]);
        let body = json!({
            "model": "svc/sonnet",
            "max_tokens": 100,
            "system": "You are a coding agent.",
            "messages": [
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": "Which folder?"},
                {"role": "system", "content": "The working directory is /src."},
                {"role": "user", "content": "this one"}
            ]
        });
        rig.gw.post_messages(&rig.gw.key, &body).await.expect_ok();
        let sent = rig.mock.last_body();
        let messages = sent["messages"].as_array().unwrap();
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        let folded = match adapter {
            Adapter::Anthropic | Adapter::Bedrock | Adapter::Vertex => {
                assert_eq!(roles, ["user", "assistant", "user"], "{sent}");
                messages[2]["content"][0]["text"].clone()
            }
            Adapter::OpenAi | Adapter::AzureOpenAi => {
                assert_eq!(roles, ["system", "user", "assistant", "user"], "{sent}");
                messages[3]["content"][0]["text"].clone()
            }
        };
        let folded = folded.as_str().unwrap_or_default();
        assert!(
            folded.contains("The working directory is /src."),
            "{adapter:?}: {sent}"
        );
    }
}

#[tokio::test]
async fn the_clients_anthropic_beta_features_reach_an_anthropic_upstream_and_no_other() {
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        rig.mock.push([Reply::text("ok"), Reply::text("ok")]);
        let body = message("svc/sonnet", "hi", 50);
        let single = rig
            .gw
            .request(reqwest::Method::POST, "/v1/messages", Some(&rig.gw.key))
            .header("anthropic-beta", "x,y")
            .json(&body);
        rig.gw.send(single).await.expect_ok();
        let repeated = rig
            .gw
            .request(reqwest::Method::POST, "/v1/messages", Some(&rig.gw.key))
            .header("anthropic-beta", "x")
            .header("anthropic-beta", "y")
            .json(&body);
        rig.gw.send(repeated).await.expect_ok();

        let received = rig.mock.received();
        assert_eq!(received.len(), 2);
        for request in &received {
            let betas: Vec<&str> = request
                .headers
                .get_all("anthropic-beta")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            match adapter {
                Adapter::Anthropic => {
                    assert_eq!(betas, ["x,y"], "one header, the features in order");
                    assert_eq!(
                        request.headers["anthropic-version"], "2023-06-01",
                        "the adapter's own API version"
                    );
                }
                Adapter::OpenAi | Adapter::AzureOpenAi => assert!(betas.is_empty(), "{betas:?}"),
                // Bedrock and Vertex refuse betas they do not offer: none is sent, in headers
                // or body.
                Adapter::Bedrock | Adapter::Vertex => {
                    assert!(betas.is_empty(), "{betas:?}");
                    assert!(request.body.get("anthropic_beta").is_none());
                }
            }
        }
    }
}
