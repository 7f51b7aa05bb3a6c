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
use serde_json::{json, Value};

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
    Gemini,
    Vertex,
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
            Adapter::Gemini => "gemini",
            Adapter::Vertex => "vertex",
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
    let mut command = claude_command(work, &gw.api, &gw.key);
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
        .stdin(std::process::Stdio::null());
    if let Some(tokens) = max_output_tokens {
        command.env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", tokens.to_string());
    }
    tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("claude -p finished within 3 minutes")
        .expect("claude runs")
}

/// Claude Code pointed at the gateway at `api` with `key`, run in `work`.
fn claude_command(work: &Path, api: &str, key: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(claude_bin());
    command
        .current_dir(work)
        .env("HOME", work.join("home"))
        .env("ANTHROPIC_BASE_URL", api)
        .env("ANTHROPIC_API_KEY", key)
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
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn claude_code_on_opus_runs_a_tool_and_gets_its_answer_through_each_adapter() {
    for adapter in [
        Adapter::Anthropic,
        Adapter::OpenAi,
        Adapter::AzureOpenAi,
        Adapter::Bedrock,
        Adapter::Gemini,
        Adapter::Vertex,
    ] {
        let outcome = Session::on("svc/opus", adapter).large_project().run().await;
        let what = format!("svc/opus via {adapter:?}");
        outcome.assert_completed_the_tool_loop(&what);
        let received = &outcome.received;
        let largest = received.iter().map(|r| r.bytes).max().unwrap_or(0);
        let tools = received
            .iter()
            .filter_map(|r| {
                let tools = r.body["tools"].as_array()?;
                // Gemini's are one list of function declarations.
                Some(match tools[..] {
                    [ref one] if one.get("functionDeclarations").is_some() => {
                        one["functionDeclarations"].as_array().map_or(0, Vec::len)
                    }
                    _ => tools.len(),
                })
            })
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
            // Bedrock and Vertex refuse betas they do not offer: none is sent.
            Adapter::OpenAi
            | Adapter::AzureOpenAi
            | Adapter::Bedrock
            | Adapter::Gemini
            | Adapter::Vertex => {
                assert!(betas.is_empty(), "{betas:?}")
            }
        }
        if matches!(
            adapter,
            Adapter::Anthropic | Adapter::Bedrock | Adapter::Vertex
        ) {
            // The thinking Claude Code asks for by default is applied where the model has it
            // (and so is what the other models' sessions have left out).
            assert!(
                received.iter().any(|r| r.body.get("thinking").is_some()),
                "Claude Code's thinking reached svc/opus's upstream: {}",
                outcome.context()
            );
        }
        if adapter == Adapter::Gemini {
            assert!(
                received
                    .iter()
                    .any(|r| r.body["generationConfig"].get("thinkingConfig").is_some()),
                "Claude Code's thinking reached svc/opus's upstream as thinkingConfig: {}",
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

/// Claude Code's default max_tokens, and the window of svc/sonnet.
const CLAUDE_CODE_MAX_TOKENS: u64 = 32_000;
const SONNET_WINDOW: u64 = 200_000;

/// A conversation of about 190,000 tokens with Claude Code's max_tokens of 32,000 on a
/// 200,000-token window: served (not a 400 for input plus max_tokens past the window), the
/// upstream sent the room left as max_tokens, the answer ended with
/// `model_context_window_exceeded` and billed the tokens generated, and Claude Code handles
/// that stop reason as it does with the Anthropic API (it asks the model to go on, and the
/// session completes).
#[tokio::test]
async fn claude_code_with_a_conversation_near_the_whole_window_is_served_to_the_windows_end() {
    let work = std::env::temp_dir().join(unique_name("e2e-claude-code-window"));
    std::fs::create_dir_all(work.join("home")).expect("create the session folder");
    let unscripted = Unscripted::FillsTheWindowOnce {
        min_bytes: 500_000,
        output: 50_000,
        answer: ANSWER.to_owned(),
        given: Default::default(),
    };
    let mock = MockUpstream::serve("127.0.0.1:0", unscripted, true).await;
    let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    // High volume: 500,000 input tokens per minute hold the session's two long turns.
    let key = gw.new_key(100_000_000, &KeySpec::tier("high_volume")).await;

    let mut command = claude_command(&work, &gw.api, &key.secret);
    command
        .args(["-p", "--model", "svc/sonnet"])
        .args(["--output-format", "stream-json", "--verbose"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("claude runs");
    let prompt = format!(
        "Summarize these notes in one line.\n\n{}",
        words(CONVERSATION_WORDS)
    );
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(prompt.as_bytes())
            .await
            .expect("write the prompt");
    }
    let output = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("claude -p finished within 5 minutes")
        .expect("claude runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let context = format!(
        "stdout={stdout}\nstderr={}\n{}",
        String::from_utf8_lossy(&output.stderr),
        gw.logs()
    );
    let _ = std::fs::remove_dir_all(&work);

    let received = mock.received();
    let capped: Vec<u64> = received
        .iter()
        .filter(|r| r.bytes >= 500_000)
        .filter_map(|r| r.body["max_tokens"].as_u64())
        .collect();
    eprintln!(
        "{} upstream requests; the long ones sent max_tokens {capped:?}",
        received.len()
    );
    let first = *capped
        .first()
        .unwrap_or_else(|| panic!("no long request went upstream: {context}"));
    // The input (the window less the room) is past 168,000 tokens, where input plus Claude
    // Code's max_tokens passes the window, and the room is the window's rest.
    assert!(
        0 < first && first < CLAUDE_CODE_MAX_TOKENS,
        "the upstream was sent the room the ~190k input left ({first}): {context}"
    );
    let input = SONNET_WINDOW - first;
    assert!(
        (185_000..195_000).contains(&input),
        "a conversation of about 190,000 tokens ({input}): {context}"
    );
    // The ledger rows of the session's answers: the first long one ended at the window.
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut ids: Vec<String> = lines
        .iter()
        .filter(|l| l["type"] == "assistant")
        .filter_map(|l| l["message"]["id"].as_str().map(str::to_owned))
        .collect();
    ids.dedup();
    let mut window_rows = Vec::new();
    for id in &ids {
        let row = gw.message_record(id).await;
        if row["stop_reason"] == "model_context_window_exceeded" {
            window_rows.push(row);
        }
    }
    assert_eq!(window_rows.len(), 1, "{ids:?}: {context}");
    let row = &window_rows[0];
    assert_eq!(row["usage"]["output_tokens"], first, "{row}");
    let billed_input = row["usage"]["input_tokens"].as_u64().unwrap_or(0);
    let price = books::RoutePrice::of("svc/sonnet");
    assert_eq!(row["billed"], price.credits(billed_input, first), "{row}");
    // Claude Code took the stop in its stride: the session ended with the answer.
    assert!(output.status.success(), "claude -p failed: {context}");
    let result = lines
        .iter()
        .find(|l| l["type"] == "result")
        .unwrap_or_else(|| panic!("no result line: {context}"));
    assert_eq!(result["is_error"], false, "{result}");
    assert!(
        result["result"]
            .as_str()
            .unwrap_or_default()
            .contains(ANSWER),
        "{result}"
    );
}

/// The prompt's size: with Claude Code's own system prompt and tools, about 190,000 tokens.
const CONVERSATION_WORDS: usize = 165_000;
