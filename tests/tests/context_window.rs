//! A conversation is bounded by its model's context window alone, as the spec says: a turn
//! whose input fits the window is served whatever its `max_tokens`, its generation capped to
//! the room the input leaves (the capped max_tokens is what the upstream is sent, and what the
//! reservation covers), and a generation that fills the window ends as the Messages API ends
//! it: `stop_reason: "model_context_window_exceeded"` (Messages, JSON and stream),
//! `finish_reason: "length"` (Chat Completions), `status: "incomplete"` with
//! `incomplete_details.reason: "max_output_tokens"` (Responses). The bill is the tokens
//! generated. The client's own max_tokens reached below the window still ends `max_tokens`,
//! and an input past the window alone is still a 400.
//!
//! The rule is the same at any size, so most tests run it on a route whose window is 2,000
//! tokens (svc/sonnet's, shrunk in the test's manifests) with small bodies; one runs the case
//! the spec's clients meet: a 190,000-token conversation with Claude Code's max_tokens of
//! 32,000 on a 200,000-token window, through the official Anthropic SDK (Claude Code's is in
//! `upstream_claude_code.rs`).

use e2e::books::RoutePrice;
use e2e::gateway::{unique_name, workspace_root};
use e2e::sse::{assemble_chat_stream, assemble_message_stream, assemble_response_stream};
use e2e::*;
use serde_json::{json, Value};

/// The window of svc/sonnet in these tests' manifests.
const WINDOW: u64 = 2_000;
/// What the client asks for: more than the window has room for beside the input below.
const ASKED: u64 = 1_500;
/// A reply longer than any room left: the upstream stops at the max_tokens it is sent.
const LONG_OUTPUT: u64 = 50_000;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Adapter {
    Anthropic,
    OpenAi,
    AzureOpenAi,
}

const ADAPTERS: [Adapter; 3] = [Adapter::Anthropic, Adapter::OpenAi, Adapter::AzureOpenAi];

/// Sets svc/sonnet's context window (and its max_output_tokens, which may not exceed it) to
/// `window` in the manifest folder `dir`.
fn shrink_sonnet_window(dir: &std::path::Path, window: u64) {
    let path = dir.join("models.yaml");
    let routes = std::fs::read_to_string(&path).expect("read models.yaml");
    let shrunk: Vec<String> = routes
        .split("\n---")
        .map(|route| {
            if !route.lines().any(|l| l.trim() == "model: svc/sonnet") {
                return route.to_owned();
            }
            route
                .lines()
                .map(|l| {
                    let trimmed = l.trim_start();
                    let indent = &l[..l.len() - trimmed.len()];
                    if trimmed.starts_with("contextWindow:") {
                        format!("{indent}contextWindow: {window}")
                    } else if trimmed.starts_with("maxOutputTokens:") {
                        format!("{indent}maxOutputTokens: {window}")
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    assert!(
        shrunk.join("\n---") != routes,
        "svc/sonnet's window was not found in {}",
        path.display()
    );
    std::fs::write(&path, shrunk.join("\n---")).expect("write models.yaml");
}

/// A gateway whose every model is served by one mock upstream through `adapter`, svc/sonnet's
/// window shrunk to [`WINDOW`].
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
        };
        let manifests = RoutedManifests::new(&[upstream]);
        shrink_sonnet_window(&manifests.path, WINDOW);
        let gw = Gateway::builder().manifests(&manifests.path).start().await;
        Rig {
            mock,
            gw,
            _manifests: manifests,
        }
    }

    /// Queues a reply longer than any max_tokens of these tests.
    fn push_long_reply(&self) {
        let text = "A long answer that goes on. ".repeat(200);
        self.mock.push([Reply::text(&text).usage(MockUsage {
            input: 21,
            output: LONG_OUTPUT,
            ..MockUsage::default()
        })]);
    }

    /// The max_tokens the upstream was last sent (either wire format).
    fn sent_max_tokens(&self) -> u64 {
        let body = self.mock.last_body();
        body["max_completion_tokens"]
            .as_u64()
            .or_else(|| body["max_tokens"].as_u64())
            .unwrap_or_else(|| panic!("no max_tokens sent upstream: {body}"))
    }
}

/// The gateway's count of a request's input: what the window's room is worked out from.
async fn counted(gw: &Gateway, text: &str) -> u64 {
    let body = json!({"model": "svc/sonnet", "messages": [{"role": "user", "content": text}]});
    gw.count_tokens(&gw.key, &body).await.expect_ok()["input_tokens"]
        .as_u64()
        .expect("input_tokens")
}

/// The ledger row of `id` records the window's stop and bills the tokens generated: the
/// reservation covered the capped max_tokens, not the client's.
async fn assert_billed_generated(gw: &Gateway, id: &str, input: u64, cap: u64, told: u64) {
    let row = gw.message_record(id).await;
    let price = RoutePrice::of("svc/sonnet");
    assert_eq!(row["stop_reason"], "model_context_window_exceeded", "{row}");
    assert_eq!(row["usage"]["output_tokens"], cap, "{row}");
    assert_eq!(row["billed"], told, "the bill told is the row's: {row}");
    assert_eq!(
        row["billed"],
        price.credits(row["usage"]["input_tokens"].as_u64().unwrap_or(0), cap),
        "{row}"
    );
    assert_eq!(
        row["reserved"],
        price.credits(input, cap),
        "the reservation covers the capped max_tokens: {row}"
    );
}

#[tokio::test]
async fn a_turn_whose_input_fits_the_window_is_served_whatever_its_max_tokens_and_ends_at_the_window(
) {
    let text = words(1_200);
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        let gw = &rig.gw;
        let input = counted(gw, &text).await;
        let cap = WINDOW - input;
        assert!(cap < ASKED, "input {input}: the window must cap {ASKED}");

        rig.push_long_reply();
        let reply = gw
            .post_messages(&gw.key, &message("svc/sonnet", &text, ASKED))
            .await
            .expect_ok();
        assert_eq!(rig.sent_max_tokens(), cap, "{adapter:?}");
        assert_eq!(
            reply["stop_reason"], "model_context_window_exceeded",
            "{adapter:?}: {reply}"
        );
        assert_eq!(reply["usage"]["output_tokens"], cap, "{adapter:?}: {reply}");
        let id = reply["id"].as_str().expect("id");
        let told = credits_of(&reply);
        assert_billed_generated(gw, id, input, cap, told).await;

        rig.push_long_reply();
        let stream = gw
            .stream(
                "/v1/messages",
                &gw.key,
                &message_stream("svc/sonnet", &text, ASKED),
            )
            .await;
        stream.expect_sse();
        let stream = assemble_message_stream(&stream.collect().await);
        assert_eq!(rig.sent_max_tokens(), cap, "{adapter:?}");
        assert_eq!(
            stream.delta["stop_reason"], "model_context_window_exceeded",
            "{adapter:?}"
        );
        assert_eq!(stream.usage["output_tokens"], cap, "{adapter:?}");
        assert_billed_generated(gw, stream.id(), input, cap, stream.credits()).await;

        rig.push_long_reply();
        let chat = gw
            .chat(&gw.key, &chat_body("svc/sonnet", &text, Some(ASKED)))
            .await
            .expect_ok();
        assert_eq!(rig.sent_max_tokens(), cap, "{adapter:?}");
        assert_eq!(chat["choices"][0]["finish_reason"], "length", "{chat}");
        assert_eq!(chat["usage"]["completion_tokens"], cap, "{chat}");

        rig.push_long_reply();
        let chunks = gw
            .stream(
                "/v1/chat/completions",
                &gw.key,
                &chat_stream_body("svc/sonnet", &text, Some(ASKED)),
            )
            .await;
        chunks.expect_sse();
        let chunks = assemble_chat_stream(&chunks.collect().await);
        assert_eq!(chunks.finish_reason.as_deref(), Some("length"));

        for stream in [false, true] {
            rig.push_long_reply();
            let body = json!({"model": "svc/sonnet", "input": text, "max_output_tokens": ASKED,
                "stream": stream});
            let response = if stream {
                let events = gw.stream("/v1/responses", &gw.key, &body).await;
                events.expect_sse();
                assemble_response_stream(&events.collect().await).response
            } else {
                gw.post_json("/v1/responses", &gw.key, &body)
                    .await
                    .expect_ok()
            };
            assert_eq!(rig.sent_max_tokens(), cap, "{adapter:?}");
            assert_eq!(response["status"], "incomplete", "{response}");
            assert_eq!(
                response["incomplete_details"]["reason"], "max_output_tokens",
                "{response}"
            );
            assert_eq!(response["usage"]["output_tokens"], cap, "{response}");
        }
        assert_eq!(rig.mock.request_count(), 6, "{adapter:?}");
    }
}

#[tokio::test]
async fn the_clients_own_max_tokens_reached_below_the_window_still_ends_max_tokens() {
    let text = words(200);
    for adapter in ADAPTERS {
        let rig = Rig::start(adapter).await;
        let gw = &rig.gw;
        rig.push_long_reply();
        let reply = gw
            .post_messages(&gw.key, &message("svc/sonnet", &text, 100))
            .await
            .expect_ok();
        assert_eq!(rig.sent_max_tokens(), 100, "{adapter:?}");
        assert_eq!(reply["stop_reason"], "max_tokens", "{adapter:?}: {reply}");
        assert_eq!(reply["usage"]["output_tokens"], 100, "{adapter:?}");
        let row = gw.message_record(reply["id"].as_str().expect("id")).await;
        assert_eq!(row["stop_reason"], "max_tokens", "{row}");

        // The window leaves exactly what was asked: the client's max_tokens is the cap.
        let input = counted(gw, &text).await;
        rig.push_long_reply();
        let reply = gw
            .post_messages(&gw.key, &message("svc/sonnet", &text, WINDOW - input))
            .await
            .expect_ok();
        assert_eq!(rig.sent_max_tokens(), WINDOW - input, "{adapter:?}");
        assert_eq!(reply["stop_reason"], "max_tokens", "{adapter:?}: {reply}");
        assert_eq!(rig.mock.request_count(), 2, "{adapter:?}");
    }
}

#[tokio::test]
async fn an_input_past_the_window_alone_is_still_400_and_nothing_goes_upstream() {
    let rig = Rig::start(Adapter::Anthropic).await;
    let gw = &rig.gw;
    for max_tokens in [1, ASKED] {
        let resp = gw
            .post_messages(&gw.key, &message("svc/sonnet", &words(2_100), max_tokens))
            .await;
        let message = resp.expect_invalid_field("messages");
        assert!(message.contains("context window"), "{message}");
    }
    assert_eq!(rig.mock.request_count(), 0);
}

#[tokio::test]
async fn an_upstream_that_refuses_the_capped_turn_gives_the_spec_envelope() {
    // The upstream's own count of the input may be above the gateway's estimate, and an
    // upstream that admits no more than its window refuses the capped turn.
    let rig = Rig::start(Adapter::Anthropic).await;
    let gw = &rig.gw;
    rig.mock.push([Reply::status(400)]);
    gw.post_messages(&gw.key, &message("svc/sonnet", &words(1_200), ASKED))
        .await
        .expect_error(400, "invalid_request_error");
    assert_eq!(rig.mock.request_count(), 1);
}

/// The standalone manifests (the simulated provider) with svc/sonnet's window shrunk.
struct SimulatedManifests {
    path: std::path::PathBuf,
}

impl SimulatedManifests {
    fn new() -> SimulatedManifests {
        let path = std::env::temp_dir().join(unique_name("e2e-window-manifests"));
        std::fs::create_dir_all(&path).expect("create the manifest folder");
        let standalone = workspace_root().join("deploy").join("standalone");
        for file in ["tiers.yaml", "apikeys.yaml", "models.yaml"] {
            std::fs::copy(standalone.join(file), path.join(file)).expect("copy a manifest");
        }
        shrink_sonnet_window(&path, WINDOW);
        SimulatedManifests { path }
    }
}

impl Drop for SimulatedManifests {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[tokio::test]
async fn the_simulated_provider_stops_at_the_window_as_a_real_upstream_does() {
    let manifests = SimulatedManifests::new();
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    // The simulated reply repeats the user's text: longer than the room left.
    let text = words(1_200);
    let input = counted(&gw, &text).await;
    let cap = WINDOW - input;
    let reply = gw
        .post_messages(&gw.key, &message("svc/sonnet", &text, ASKED))
        .await
        .expect_ok();
    assert_eq!(
        reply["stop_reason"], "model_context_window_exceeded",
        "{reply}"
    );
    assert_eq!(reply["usage"]["input_tokens"], input);
    assert_eq!(reply["usage"]["output_tokens"], cap);
    let told = credits_of(&reply);
    assert_billed_generated(&gw, reply["id"].as_str().expect("id"), input, cap, told).await;

    let stream = gw
        .stream(
            "/v1/messages",
            &gw.key,
            &message_stream("svc/sonnet", &text, ASKED),
        )
        .await;
    stream.expect_sse();
    let stream = assemble_message_stream(&stream.collect().await);
    assert_eq!(stream.delta["stop_reason"], "model_context_window_exceeded");
    assert_eq!(stream.usage["output_tokens"], cap);
}

/// Claude Code's max_tokens, and the window of the routes it uses.
const CLAUDE_CODE_MAX_TOKENS: u64 = 32_000;
const FULL_WINDOW: u64 = 200_000;

#[tokio::test]
async fn a_190k_token_conversation_with_claude_codes_max_tokens_is_served_through_the_anthropic_sdk(
) {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    // High volume: 500,000 input tokens per minute, so TPM does not interfere.
    let key = gw.new_key(100_000_000, &KeySpec::tier("high_volume")).await;
    let text = words(190_000);
    let body = json!({"model": "svc/sonnet", "messages": [{"role": "user", "content": text}]});
    let input = gw.count_tokens(&key.secret, &body).await.expect_ok()["input_tokens"]
        .as_u64()
        .expect("input_tokens");
    assert!(
        input + CLAUDE_CODE_MAX_TOKENS > FULL_WINDOW && input < FULL_WINDOW,
        "input {input}"
    );
    let cap = FULL_WINDOW - input;
    mock.push([Reply::text("A long answer, cut.").usage(MockUsage {
        input,
        output: LONG_OUTPUT,
        ..MockUsage::default()
    })]);

    let script = r#"
import json, sys, anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0, timeout=120)
text = " ".join(["word"] * int(sys.argv[3]))
m = client.messages.create(model="svc/sonnet", max_tokens=int(sys.argv[4]),
    messages=[{"role": "user", "content": text}])
print(json.dumps({"id": m.id, "stop_reason": m.stop_reason,
    "output_tokens": m.usage.output_tokens,
    "credits": (m.usage.model_extra or {}).get("credits_consumed")}))
"#;
    let out = sdk_python()
        .args(["-c", script, &gw.api, &key.secret, "190000"])
        .arg(CLAUDE_CODE_MAX_TOKENS.to_string())
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .await
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reply: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "the SDK call failed: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            gw.logs()
        )
    });
    assert_eq!(reply["stop_reason"], "model_context_window_exceeded");
    assert_eq!(reply["output_tokens"], cap);
    assert_eq!(mock.request_count(), 1);
    assert_eq!(
        mock.last_body()["max_tokens"],
        cap,
        "the upstream got the cap"
    );
    let row = gw.message_record(reply["id"].as_str().expect("id")).await;
    let price = RoutePrice::of("svc/sonnet");
    assert_eq!(row["stop_reason"], "model_context_window_exceeded", "{row}");
    assert_eq!(row["usage"]["output_tokens"], cap, "{row}");
    assert_eq!(row["billed"], price.credits(input, cap), "{row}");
    assert_eq!(row["billed"], reply["credits"], "{row}");
}

/// The venv's Python, with the official `anthropic` SDK (`scripts/test` creates it).
fn sdk_python() -> tokio::process::Command {
    let python = workspace_root().join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test creates the venv with the anthropic SDK",
        python.display()
    );
    tokio::process::Command::new(python)
}
