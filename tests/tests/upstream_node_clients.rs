//! Node applications run a tool round trip through the gateway unchanged, through each
//! upstream adapter: the mock upstream calls the application's `get_weather` tool, the
//! application sends its result back, and the answer arrives. The clients (in `tests/node/`,
//! written as applications would, on the npm versions scripts/test pins):
//! - `official_sdks.cjs`: the official SDKs (`openai`, `@anthropic-ai/sdk`) on the Messages,
//!   chat completions and Responses APIs, the second turn through each SDK's stream helper,
//!   and a wrong key raising each SDK's authentication error;
//! - `ai_sdk_agent.cjs`: the Vercel AI SDK (`ai` with `@ai-sdk/openai` and
//!   `@ai-sdk/anthropic`) on the three interfaces it speaks (the OpenAI provider's default
//!   Responses API, its `.chat()` chat completions, the Anthropic provider's Messages API),
//!   with `generateText` and `streamText`.

use std::path::PathBuf;
use std::time::Duration;

use e2e::gateway::workspace_root;
use e2e::upstream::{carries_tool_result, PROVIDERS};
use e2e::*;
use serde_json::{json, Value};

const ANSWER: &str = "It is sunny and 21 degrees in Paris.";
const INTERFACES: [&str; 3] = ["messages", "chat", "responses"];
/// What the tool returns; finding it upstream shows the SDK sent the result back.
const TOOL_RESULT: &str = "Sunny and 21 degrees in Paris";

/// `$NODE_CLIENTS`, else the packages scripts/test installs under `.cache/node-clients`.
fn node_modules() -> PathBuf {
    let modules = std::env::var_os("NODE_CLIENTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache/node-clients/node_modules"));
    assert!(
        ["ai", "openai", "@anthropic-ai/sdk"]
            .iter()
            .all(|package| modules.join(package).exists()),
        "the Node clients are not installed at {}; run scripts/test",
        modules.display()
    );
    modules
}

/// Runs a client of `tests/node/` once with `args` after the gateway's URL: its JSON report.
async fn node(gw: &Gateway, client: &str, args: &[&str]) -> Value {
    let script = workspace_root().join("tests/node").join(client);
    let run = format!("{client} {}", args.join(" "));
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .arg(gw.api.as_str())
        .args(args)
        .env("NODE_PATH", node_modules())
        .env("SVC_API_KEY", &gw.key)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the client finished within 2 minutes")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .unwrap_or_else(|| {
            panic!(
                "{run}: no report; stdout={stdout} stderr={}\n{}",
                String::from_utf8_lossy(&output.stderr),
                gw.logs()
            )
        });
    assert!(output.status.success(), "{run}: {report}\n{}", gw.logs());
    report
}

#[tokio::test]
async fn the_official_sdks_make_a_tool_round_trip_and_raise_their_own_errors_through_each_adapter()
{
    for provider in PROVIDERS {
        let AgentUpstream { mock, gw, .. } = &weather_agent(provider).await;
        for api in INTERFACES {
            let seen = mock.received().len();
            let report = node(gw, "official_sdks.cjs", &[api]).await;
            let context = format!("{provider} adapter, {api}: {report}");
            assert_eq!(
                report["model"],
                json!(["svc/sonnet", "svc/sonnet"]),
                "{context}"
            );
            let stops = match api {
                "messages" => ["tool_use", "end_turn"],
                "chat" => ["tool_calls", "stop"],
                _ => ["completed", "completed"],
            };
            assert_eq!(report["stop"], json!(stops), "{context}");
            assert_eq!(
                report["call"],
                json!({"name": "get_weather", "input": {"city": "Paris"}}),
                "{context}"
            );
            assert_eq!(report["text"], ANSWER, "{context}");
            assert_eq!(report["final"], ANSWER, "{context}");
            // Each SDK's stream helper builds its own usage object (the Anthropic one keeps
            // only the fields it knows), so the tokens are what all three carry.
            let usage = &report["usage"];
            assert!(
                [&usage["output_tokens"], &usage["completion_tokens"]]
                    .iter()
                    .any(|n| n.as_u64().is_some_and(|n| n > 0)),
                "{context}"
            );
            assert_eq!(report["refused"], "AuthenticationError", "{context}");
            assert!(
                mock.received()[seen..]
                    .iter()
                    .any(|r| carries_tool_result(&r.body)
                        && r.body.to_string().contains(TOOL_RESULT)),
                "the tool's result went back upstream: {context}"
            );
        }
    }
}

/// A gateway routing every model through `provider` to a mock upstream that calls
/// `get_weather` for Paris, then answers [`ANSWER`].
async fn weather_agent(provider: &str) -> AgentUpstream {
    AgentUpstream::start(provider, "get_weather", json!({"city": "Paris"}), ANSWER).await
}

#[tokio::test]
async fn the_ai_sdk_runs_a_tool_loop_on_every_interface_and_mode_through_each_adapter() {
    for provider in PROVIDERS {
        let AgentUpstream { mock, gw, .. } = &weather_agent(provider).await;
        for api in INTERFACES {
            for mode in ["generate", "stream"] {
                let seen = mock.received().len();
                let report = node(gw, "ai_sdk_agent.cjs", &[api, mode]).await;
                let context = format!("{provider} adapter, {api} {mode}: {report}");
                assert_eq!(report["errors"], json!([]), "{context}");
                assert_eq!(report["executed"], json!(["Paris"]), "{context}");
                assert_eq!(report["text"], ANSWER, "{context}");
                assert_eq!(report["finishReason"], "stop", "{context}");
                assert_eq!(report["steps"], 2, "{context}");
                for count in ["inputTokens", "outputTokens"] {
                    assert!(
                        report["usage"][count].as_u64().is_some_and(|n| n > 0),
                        "{count}: {context}"
                    );
                }
                let received = mock.received();
                assert!(
                    received[seen..].iter().any(|r| carries_tool_result(&r.body)
                        && r.body.to_string().contains(TOOL_RESULT)),
                    "the tool's result went back upstream: {context}"
                );
            }
        }
    }
}
