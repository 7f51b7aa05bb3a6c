//! Codex CLI (npm `@openai/codex`, the version scripts/test pins) completes a non-interactive
//! `codex exec` session through the gateway's Responses API (`POST /v1/responses`) on each
//! upstream adapter: the mock upstream calls Codex's shell tool as Codex offers it
//! (`exec_command` with `{"cmd": …}`), Codex runs the command in its sandbox, sends the output
//! back, and prints the answer.
//!
//! Codex is pointed at the gateway the way the README tells users: a provider in
//! `$CODEX_HOME/config.toml` with `wire_api = "responses"` and the key in an environment
//! variable. What Codex 0.169 sends is saved in `tests/fixtures/codex/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::gateway::{unique_name, workspace_root};
use e2e::upstream::{carries_tool_result, PROVIDERS};
use e2e::*;
use serde_json::json;

const ANSWER: &str = "Done: the marker file exists now.";

/// What the command prints; only its output (not the command line, which the conversation
/// also carries) contains it, so finding it upstream shows the output went back.
const PRINTED: &str = "made marker";

/// `$CODEX_BIN`, else the copy scripts/test installs under `.cache/codex`.
fn codex_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CODEX_BIN") {
        return PathBuf::from(bin);
    }
    let bin = workspace_root().join(".cache/codex/node_modules/.bin/codex");
    assert!(
        bin.exists(),
        "Codex is not installed at {}; run scripts/test (or \
         `npm install --prefix .cache/codex @openai/codex@0.169.0`)",
        bin.display()
    );
    bin
}

/// The provider block the README documents. Retries are off so that a refusal shows at once
/// instead of after Codex's backoff.
fn codex_config(api: &str) -> String {
    format!(
        "model = \"svc/sonnet\"\n\
         model_provider = \"svc\"\n\
         \n\
         [model_providers.svc]\n\
         name = \"svc gateway\"\n\
         base_url = \"{api}/v1\"\n\
         env_key = \"SVC_API_KEY\"\n\
         wire_api = \"responses\"\n\
         request_max_retries = 0\n\
         stream_max_retries = 0\n"
    )
}

async fn codex_exec(work: &Path, gw: &Gateway) -> std::process::Output {
    let codex_home = work.join("codex-home");
    let project = work.join("project");
    std::fs::create_dir_all(&codex_home).expect("create CODEX_HOME");
    std::fs::create_dir_all(&project).expect("create the project folder");
    std::fs::write(codex_home.join("config.toml"), codex_config(&gw.api))
        .expect("write config.toml");
    let mut command = tokio::process::Command::new(codex_bin());
    command
        .args([
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "--strict-config",
        ])
        // Commands run sandboxed, writing only inside the project (and /tmp), no network.
        .args(["--sandbox", "workspace-write", "--color", "never"])
        .arg("--cd")
        .arg(&project)
        .arg("Create the marker file with the shell, then say so.")
        .current_dir(&project)
        .env("HOME", work.join("home"))
        .env("CODEX_HOME", &codex_home)
        .env("SVC_API_KEY", &gw.key)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("codex exec finished within 3 minutes")
        .expect("codex runs")
}

#[tokio::test]
async fn codex_runs_its_shell_tool_and_gets_its_answer_through_each_adapter() {
    for provider in PROVIDERS {
        let work = std::env::temp_dir().join(unique_name("e2e-codex"));
        let marker = work.join("project").join("marker");
        let command = format!("touch {} && printf 'made %s\\n' marker", marker.display());
        let AgentUpstream { mock, gw, .. } =
            &AgentUpstream::start(provider, "exec_command", json!({ "cmd": command }), ANSWER)
                .await;

        let output = codex_exec(&work, gw).await;
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
        assert!(marker.exists(), "the shell tool ran: {}", context());
        let received = mock.received();
        let result_sent = received
            .iter()
            .any(|r| carries_tool_result(&r.body) && r.body.to_string().contains(PRINTED));
        assert!(
            result_sent,
            "the command's output went back upstream: {}",
            context()
        );
        let _ = std::fs::remove_dir_all(&work);
    }
}
