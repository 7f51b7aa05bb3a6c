//! Claude Code (npm `@anthropic-ai/claude-code`, installed by scripts/test) completes a
//! non-interactive session through the gateway on each upstream adapter: the mock upstream
//! calls its Bash tool, Claude Code runs it, sends the result back, and prints the answer.
//! Its requests are what real sessions send: a large system prompt, dozens of tools, beta
//! headers and `?beta=true`; the session's project has a large CLAUDE.md, which Claude Code
//! puts in its requests, so that they pass 100 KB as requests of big projects do.

use std::path::PathBuf;
use std::time::Duration;

use e2e::gateway::{unique_name, workspace_root};
use e2e::upstream::carries_tool_result;
use e2e::*;
use serde_json::json;

const ANSWER: &str = "Done: the marker file exists now.";

/// The size a request must reach, as the issue puts Claude Code's: "100 KB and more".
const LARGE_REQUEST: usize = 100 * 1024;

/// Project notes of about 120 KB, for the session's CLAUDE.md.
fn large_project_notes() -> String {
    let mut notes = String::from("# Project notes\n\n");
    for module in 0..400 {
        notes.push_str(&format!(
            "## Module {module}\n\nModule {module} owns the records of shard {module}: it \
             validates them on the way in, keeps an index by owner and by date, and answers \
             queries from the reporting service. Its tests live next to it; run them before \
             any change to the schema of shard {module}, and update its changelog entry.\n\n"
        ));
    }
    notes
}

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
        std::fs::write(work.join("CLAUDE.md"), large_project_notes()).expect("write CLAUDE.md");
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
        let largest = received.iter().map(|r| r.bytes).max().unwrap_or(0);
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
        assert!(
            largest >= LARGE_REQUEST,
            "a request of {largest} bytes; CLAUDE.md should have made one pass {LARGE_REQUEST}"
        );
        let betas: Vec<&str> = received
            .iter()
            .flat_map(|r| r.headers.get_all("anthropic-beta"))
            .filter_map(|v| v.to_str().ok())
            .collect();
        match provider {
            "anthropic" => assert!(
                !betas.is_empty(),
                "Claude Code's beta features reached the upstream"
            ),
            _ => assert!(betas.is_empty(), "{betas:?}"),
        }
        let _ = std::fs::remove_dir_all(&work);
    }
}
