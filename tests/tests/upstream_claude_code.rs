//! Claude Code (npm `@anthropic-ai/claude-code`, installed by scripts/test) completes a
//! non-interactive session through the gateway on each upstream adapter: the mock upstream
//! calls its Bash tool, Claude Code runs it, sends the result back, and prints the answer.
//! Its requests are what real sessions send: a large system prompt, dozens of tools, beta
//! headers and `?beta=true`.

use std::path::PathBuf;
use std::time::Duration;

use e2e::gateway::{unique_name, workspace_root};
use e2e::upstream::carries_tool_result;
use e2e::*;
use serde_json::json;

const ANSWER: &str = "Done: the marker file exists now.";

/// `$CLAUDE_BIN`, else the copy scripts/test installs under `.cache/claude-code`.
fn claude_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CLAUDE_BIN") {
        return PathBuf::from(bin);
    }
    let bin = workspace_root().join(".cache/claude-code/node_modules/.bin/claude");
    assert!(
        bin.exists(),
        "Claude Code is not installed at {}; run scripts/test (or \
         `npm install --prefix .cache/claude-code @anthropic-ai/claude-code`)",
        bin.display()
    );
    bin
}

#[tokio::test]
async fn claude_code_runs_a_tool_and_gets_its_answer_through_each_adapter() {
    let claude = claude_bin();
    for provider in ["anthropic", "openai"] {
        let work = std::env::temp_dir().join(unique_name("e2e-claude-code"));
        std::fs::create_dir_all(work.join("home")).expect("create the session folder");
        let marker = work.join("marker");
        let mock = MockUpstream::serve(
            "127.0.0.1:0",
            Unscripted::Agent {
                tool: "Bash".to_owned(),
                input: json!({"command": format!("touch {}", marker.display()),
                    "description": "Create the marker file"}),
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

        let run = tokio::process::Command::new(&claude)
            .args(["-p", "Create the marker file, then say so."])
            .args([
                "--model",
                "svc/opus",
                "--allowedTools",
                "Bash",
                "--output-format",
                "text",
            ])
            .current_dir(&work)
            .env("HOME", work.join("home"))
            .env("ANTHROPIC_BASE_URL", &gw.api)
            .env("ANTHROPIC_API_KEY", &gw.key)
            .env("ANTHROPIC_MODEL", "svc/opus")
            .env("ANTHROPIC_SMALL_FAST_MODEL", "svc/haiku")
            .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", "svc/haiku")
            .env("ANTHROPIC_DEFAULT_SONNET_MODEL", "svc/sonnet")
            .env("ANTHROPIC_DEFAULT_OPUS_MODEL", "svc/opus")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(180), run)
            .await
            .expect("claude -p finished within 3 minutes")
            .expect("claude runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let context = || {
            format!(
                "{provider}: stdout={stdout}\nstderr={stderr}\n{}",
                gw.logs()
            )
        };

        assert!(output.status.success(), "{}", context());
        assert!(stdout.contains(ANSWER), "{}", context());
        assert!(marker.exists(), "the Bash tool ran: {}", context());
        let received = mock.received();
        assert!(
            received.iter().any(|r| carries_tool_result(&r.body)),
            "the tool result went back upstream: {}",
            context()
        );
        let largest = received
            .iter()
            .map(|r| r.body.to_string().len())
            .max()
            .unwrap_or(0);
        let tools = received
            .iter()
            .filter_map(|r| r.body["tools"].as_array().map(Vec::len))
            .max()
            .unwrap_or(0);
        eprintln!(
            "{provider}: {} upstream requests, largest {largest} bytes, up to {tools} tools",
            received.len()
        );
        assert!(
            tools >= 10,
            "Claude Code's tool set passed through: {tools}"
        );
        let _ = std::fs::remove_dir_all(&work);
    }
}
