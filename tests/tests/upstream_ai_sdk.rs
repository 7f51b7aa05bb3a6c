//! The Vercel AI SDK (npm `ai` with its `@ai-sdk/openai` and `@ai-sdk/anthropic` providers, the
//! versions scripts/test pins) runs an agent's tool loop through the gateway unchanged, on each
//! of the three interfaces it speaks (the OpenAI provider's default Responses API, its
//! `.chat()` chat completions, and the Anthropic provider's Messages API), with
//! `generateText` and `streamText`, through each upstream adapter: the mock upstream calls the
//! application's `get_weather` tool, the SDK runs it and sends its result back, and the answer
//! arrives. The client is `tests/node/ai_sdk_agent.cjs`, written as an application would.

use std::path::PathBuf;
use std::time::Duration;

use e2e::gateway::workspace_root;
use e2e::upstream::carries_tool_result;
use e2e::*;
use serde_json::{json, Value};

const ANSWER: &str = "It is sunny and 21 degrees in Paris.";
/// What the tool returns; finding it upstream shows the SDK sent the result back.
const TOOL_RESULT: &str = "Sunny and 21 degrees in Paris";

/// `$AI_SDK_MODULES`, else the packages scripts/test installs under `.cache/ai-sdk`.
fn node_modules() -> PathBuf {
    let modules = std::env::var_os("AI_SDK_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache/ai-sdk/node_modules"));
    assert!(
        modules.join("ai").exists(),
        "the AI SDK is not installed at {}; run scripts/test",
        modules.display()
    );
    modules
}

/// Runs the client once: its JSON report.
async fn agent(gw: &Gateway, api: &str, mode: &str) -> Value {
    let script = workspace_root().join("tests/node/ai_sdk_agent.cjs");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .args([gw.api.as_str(), api, mode])
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
                "{api} {mode}: no report; stdout={stdout} stderr={}\n{}",
                String::from_utf8_lossy(&output.stderr),
                gw.logs()
            )
        });
    assert!(
        output.status.success(),
        "{api} {mode}: {report}\n{}",
        gw.logs()
    );
    report
}

#[tokio::test]
async fn the_ai_sdk_runs_a_tool_loop_on_every_interface_and_mode_through_each_adapter() {
    for provider in ["anthropic", "openai"] {
        let mock = MockUpstream::serve(
            "127.0.0.1:0",
            Unscripted::Agent {
                tool: "get_weather".to_owned(),
                input: json!({"city": "Paris"}),
                answer: ANSWER.to_owned(),
            },
            true,
        )
        .await;
        let upstream = match provider {
            "anthropic" => UpstreamDef::anthropic(&mock),
            _ => UpstreamDef::openai(&mock),
        };
        let manifests = RoutedManifests::new(&[upstream]);
        let gw = Gateway::builder().manifests(&manifests.path).start().await;
        for api in ["responses", "chat", "messages"] {
            for mode in ["generate", "stream"] {
                let seen = mock.received().len();
                let report = agent(&gw, api, mode).await;
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
