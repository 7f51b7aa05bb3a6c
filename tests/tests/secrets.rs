//! Secrets at start-up: an empty or short admin token, webhook secret or responses secret, or a
//! dev key that does not look like a key, is refused before anything listens.

use std::process::Stdio;
use std::time::Duration;

use e2e::gateway::{gateway_bin, workspace_root};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// Generous: a refusal happens while parsing the command line, before anything starts.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// Runs the gateway with `args` and `envs` (and no other `GATEWAY_*` variable), expecting it
/// to exit on its own; returns its exit code and stderr.
async fn run_to_exit(args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(gateway_bin());
    cmd.args(args)
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("GATEWAY_") {
            cmd.env_remove(name);
        }
    }
    cmd.envs(envs.iter().copied());
    let mut child = cmd.spawn().expect("spawn the gateway");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let status = tokio::time::timeout(EXIT_WITHIN, child.wait())
        .await
        .unwrap_or_else(|_| panic!("gateway {args:?} did not refuse to start (still running)"))
        .expect("wait for the gateway");
    let mut text = String::new();
    stderr.read_to_string(&mut text).await.expect("read stderr");
    (status.code(), text)
}

const LOOPBACK: [&str; 4] = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];

async fn assert_refused(extra: &[&str], envs: &[(&str, &str)], flag: &str) {
    let mut args = vec!["standalone"];
    args.extend(LOOPBACK);
    args.extend(extra);
    let (code, stderr) = run_to_exit(&args, envs).await;
    assert_eq!(
        code,
        Some(2),
        "expected clap's usage error for {flag}: {stderr}"
    );
    assert!(stderr.contains(flag), "the refusal names {flag}: {stderr}");
    assert!(
        stderr.contains("at least"),
        "the refusal says why: {stderr}"
    );
}

#[tokio::test]
async fn an_empty_admin_token_is_refused_at_start() {
    assert_refused(&["--admin-token", ""], &[], "--admin-token").await;
    assert_refused(&[], &[("GATEWAY_ADMIN_TOKEN", "")], "--admin-token").await;
    assert_refused(&["--admin-token", "short-token"], &[], "--admin-token").await;
}

#[tokio::test]
async fn an_empty_payment_webhook_secret_is_refused_at_start() {
    assert_refused(
        &["--payment-webhook-secret", ""],
        &[],
        "--payment-webhook-secret",
    )
    .await;
    assert_refused(
        &[],
        &[("GATEWAY_PAYMENT_WEBHOOK_SECRET", "")],
        "--payment-webhook-secret",
    )
    .await;
}

#[tokio::test]
async fn a_short_responses_secret_is_refused_at_start() {
    assert_refused(&["--responses-secret", "abc"], &[], "--responses-secret").await;
}

#[tokio::test]
async fn a_dev_key_that_does_not_look_like_a_key_is_refused_at_start() {
    assert_refused(&["--dev-key", "K"], &[], "--dev-key").await;
    assert_refused(&["--dev-key", "sk-svc-1"], &[], "--dev-key").await;
    assert_refused(&[], &[("GATEWAY_DEV_KEY", "hunter2")], "--dev-key").await;
}

#[tokio::test]
async fn serve_refuses_an_empty_admin_token_too() {
    let mut args = vec!["serve", "--redis-url", "redis://127.0.0.1:1"];
    args.extend(LOOPBACK);
    args.extend(["--admin-token", ""]);
    let (code, stderr) = run_to_exit(&args, &[]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--admin-token"), "{stderr}");
}

