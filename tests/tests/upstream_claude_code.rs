//! Claude Code (npm `@anthropic-ai/claude-code`, installed by scripts/test) completes a
//! non-interactive session through the gateway on every virtual model: the mock upstream
//! calls its Bash tool, Claude Code runs it, sends the result back, and prints the answer.
//! Its requests are what real sessions send: a large system prompt, dozens of tools, beta
//! headers, `?beta=true` and `thinking` (asked for by default, whatever the model); the opus
//! session's project has a large CLAUDE.md, which Claude Code puts in its requests, so that
//! they pass 100 KB as requests of big projects do.
//!
//! Claude Code runs with its default settings, pointed at the gateway as the README says; the
//! one setting a user may need is `CLAUDE_CODE_MAX_OUTPUT_TOKENS` on a model whose output
//! limit is below the 32,000 tokens Claude Code asks for, and the 400 it gets otherwise says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::gateway::{unique_name, workspace_root};
use e2e::upstream::{carries_tool_result, Received};
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Adapter {
    Anthropic,
    OpenAi,
    AzureOpenAi,
    Bedrock,
}

/// One `claude -p` session through a gateway whose models are all served by a mock upstream
/// that plays the agent: it calls Bash to create a marker file, then answers.
struct Session {
    adapter: Adapter,
    model: &'static str,
    /// `CLAUDE_CODE_MAX_OUTPUT_TOKENS`, when the session sets it.
    max_output_tokens: Option<u32>,
    large_project: bool,
}

struct Outcome {
    success: bool,
    stdout: String,
    stderr: String,
    marker_created: bool,
    received: Vec<Received>,
    gateway_logs: String,
}

impl Outcome {
    fn context(&self) -> String {
        format!(
            "stdout={}\nstderr={}\n{}",
            self.stdout, self.stderr, self.gateway_logs
        )
    }

    /// The session ended with the answer after the tool ran and its result went upstream.
    fn assert_completed_the_tool_loop(&self, what: &str) {
        assert!(self.success, "{what}: claude -p failed: {}", self.context());
        assert!(self.stdout.contains(ANSWER), "{what}: {}", self.context());
        assert!(
            self.marker_created,
            "{what}: the Bash tool ran: {}",
            self.context()
        );
        assert!(
            self.received.iter().any(|r| carries_tool_result(&r.body)),
            "{what}: the tool result went back upstream: {}",
            self.context()
        );
    }
}

impl Session {
    fn on(model: &'static str, adapter: Adapter) -> Session {
        Session {
            adapter,
            model,
            max_output_tokens: None,
            large_project: false,
        }
    }

    fn max_output_tokens(mut self, tokens: u32) -> Session {
        self.max_output_tokens = Some(tokens);
        self
    }

    fn large_project(mut self) -> Session {
        self.large_project = true;
        self
    }

    async fn run(self) -> Outcome {
        let work = std::env::temp_dir().join(unique_name("e2e-claude-code"));
        std::fs::create_dir_all(work.join("home")).expect("create the session folder");
        if self.large_project {
            std::fs::write(work.join("CLAUDE.md"), large_project_notes()).expect("write CLAUDE.md");
        }
        let marker = work.join("marker");
        let provider = match self.adapter {
            Adapter::Anthropic => "anthropic",
            Adapter::OpenAi => "openai",
            Adapter::AzureOpenAi => "azure-openai",
            Adapter::Bedrock => "bedrock",
        };
        let input = json!({"command": format!("touch {}", marker.display()),
            "description": "Create the marker file"});
        let AgentUpstream { mock, gw, .. } =
            &AgentUpstream::start(provider, "Bash", input, ANSWER).await;
        let output = claude(&work, gw, self.model, self.max_output_tokens).await;
        let outcome = Outcome {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            marker_created: marker.exists(),
            received: mock.received(),
            gateway_logs: gw.logs(),
        };
        let _ = std::fs::remove_dir_all(&work);
        outcome
    }
}

/// `claude -p` as the README tells a user to point it at the gateway: base URL, key and model
/// names, nothing else of its settings changed (the variables below only keep it from calling
/// home, which this machine cannot).
async fn claude(
    work: &Path,
    gw: &Gateway,
    model: &str,
    max_output_tokens: Option<u32>,
) -> std::process::Output {
    let mut command = tokio::process::Command::new(claude_bin());
    command
        .args(["-p", "Create the marker file, then say so."])
        .args([
            "--model",
            model,
            "--allowedTools",
            "Bash",
            "--output-format",
            "text",
        ])
        .current_dir(work)
        .env("HOME", work.join("home"))
        .env("ANTHROPIC_BASE_URL", &gw.api)
        .env("ANTHROPIC_API_KEY", &gw.key)
        .env("ANTHROPIC_SMALL_FAST_MODEL", "svc/haiku")
        .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", "svc/haiku")
        .env("ANTHROPIC_DEFAULT_SONNET_MODEL", "svc/sonnet")
        .env("ANTHROPIC_DEFAULT_OPUS_MODEL", "svc/opus")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env_remove("CLAUDE_CODE_MAX_OUTPUT_TOKENS")
        .env_remove("MAX_THINKING_TOKENS")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(tokens) = max_output_tokens {
        command.env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", tokens.to_string());
    }
    tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("claude -p finished within 3 minutes")
        .expect("claude runs")
}

#[tokio::test]
async fn claude_code_on_opus_runs_a_tool_and_gets_its_answer_through_each_adapter() {
    for adapter in [
        Adapter::Anthropic,
        Adapter::OpenAi,
        Adapter::AzureOpenAi,
        Adapter::Bedrock,
    ] {
        let outcome = Session::on("svc/opus", adapter).large_project().run().await;
        let what = format!("svc/opus via {adapter:?}");
        outcome.assert_completed_the_tool_loop(&what);
        let received = &outcome.received;
        let largest = received.iter().map(|r| r.bytes).max().unwrap_or(0);
        let tools = received
            .iter()
            .filter_map(|r| r.body["tools"].as_array().map(Vec::len))
            .max()
            .unwrap_or(0);
        eprintln!(
            "{what}: {} upstream requests, largest {largest} bytes, up to {tools} tools",
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
        match adapter {
            Adapter::Anthropic => assert!(
                !betas.is_empty(),
                "Claude Code's beta features reached the upstream"
            ),
            // Bedrock refuses betas it does not offer: none is sent.
            Adapter::OpenAi | Adapter::AzureOpenAi | Adapter::Bedrock => {
                assert!(betas.is_empty(), "{betas:?}")
            }
        }
        if matches!(adapter, Adapter::Anthropic | Adapter::Bedrock) {
            // The thinking Claude Code asks for by default is applied where the model has it
            // (and so is what the other models' sessions have left out).
            assert!(
                received.iter().any(|r| r.body.get("thinking").is_some()),
                "Claude Code's thinking reached svc/opus's upstream: {}",
                outcome.context()
            );
        }
    }
}

#[tokio::test]
async fn claude_code_on_sonnet_completes_a_session_with_its_thinking_left_out() {
    let outcome = Session::on("svc/sonnet", Adapter::Anthropic).run().await;
    outcome.assert_completed_the_tool_loop("svc/sonnet");
    assert!(
        outcome
            .received
            .iter()
            .all(|r| r.body.get("thinking").is_none()),
        "svc/sonnet has no thinking: none was sent upstream: {}",
        outcome.context()
    );
}

#[tokio::test]
async fn claude_code_on_auto_completes_a_session() {
    let outcome = Session::on("svc/auto", Adapter::OpenAi).run().await;
    outcome.assert_completed_the_tool_loop("svc/auto");
}

#[tokio::test]
async fn claude_code_on_haiku_completes_a_session_with_its_output_tokens_set_to_haikus_limit() {
    let outcome = Session::on("svc/haiku", Adapter::OpenAi)
        .max_output_tokens(8_192)
        .run()
        .await;
    outcome.assert_completed_the_tool_loop("svc/haiku");
}

#[tokio::test]
async fn claude_code_on_kimi_completes_a_session_with_its_output_tokens_set_to_kimis_limit() {
    let outcome = Session::on("svc/kimi", Adapter::Anthropic)
        .max_output_tokens(16_384)
        .run()
        .await;
    outcome.assert_completed_the_tool_loop("svc/kimi");
    assert!(
        outcome
            .received
            .iter()
            .all(|r| r.body.get("thinking").is_none()),
        "svc/kimi has no thinking: none was sent upstream: {}",
        outcome.context()
    );
}

#[tokio::test]
async fn claude_code_asking_more_output_than_haiku_allows_is_told_to_set_claude_code_max_output_tokens(
) {
    let outcome = Session::on("svc/haiku", Adapter::OpenAi).run().await;
    let printed = format!("{}\n{}", outcome.stdout, outcome.stderr);
    assert!(
        !outcome.success || !outcome.stdout.contains(ANSWER),
        "Claude Code's default max_tokens is above svc/haiku's 8,192: {}",
        outcome.context()
    );
    assert!(
        printed.contains("CLAUDE_CODE_MAX_OUTPUT_TOKENS=8192"),
        "the 400 tells the user what to set: {}",
        outcome.context()
    );
    assert!(
        outcome.received.is_empty(),
        "nothing went upstream: {}",
        outcome.context()
    );
}
