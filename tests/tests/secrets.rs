//! Secrets at start-up: an empty or short admin token, webhook secret or responses secret, or a
//! dev key that does not look like a key, is refused before anything listens; secrets the
//! operator supplied are never written to the logs.

use std::process::Stdio;
use std::time::Duration;

use e2e::gateway::{gateway_bin, workspace_root};
use e2e::{message, Gateway, RedisServer, ADMIN_TOKEN, DEV_KEY};
use reqwest::Method;
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

/// Every line `gw` wrote so far, stdout and stderr.
fn all_output(gw: &Gateway) -> String {
    gw.logs()
}

/// Exercises the paths that log: a turn, a refused key, a refused admin call.
async fn some_traffic(gw: &Gateway) {
    gw.post_messages(DEV_KEY, &message("svc/haiku", "hi", 8))
        .await
        .expect_ok();
    gw.post_messages(
        "sk-svc-wrong-0000000000000000000",
        &message("svc/haiku", "hi", 8),
    )
    .await
    .expect_status(401);
    let refused = gw
        .admin_send(
            gw.client()
                .get(format!("{}/admin/accounts/acct_nope", gw.admin))
                .bearer_auth("not-the-admin-token-at-all"),
        )
        .await;
    refused.expect_status(401);
}

fn assert_no_supplied_secret(output: &str) {
    assert!(
        !output.contains(ADMIN_TOKEN),
        "the admin token was written:\n{output}"
    );
    assert!(
        !output.contains(DEV_KEY),
        "the dev key was written:\n{output}"
    );
}

#[tokio::test]
async fn standalone_never_writes_a_secret_the_operator_supplied() {
    let gw = Gateway::start().await;
    some_traffic(&gw).await;
    assert!(gw.ready_line.starts_with("ready api="), "{}", gw.ready_line);
    assert_no_supplied_secret(&all_output(&gw));
}

#[tokio::test]
async fn serve_never_writes_a_secret_the_operator_supplied_and_its_json_logs_stay_json() {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .serve(&redis.url())
        .arg("--log-format")
        .arg("json")
        .start()
        .await;
    some_traffic(&gw).await;
    let output = all_output(&gw);
    assert_no_supplied_secret(&output);
    for line in output.lines() {
        if line.starts_with("--- std") || line.trim().is_empty() {
            continue; // the harness's own separators
        }
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "not one JSON object per line: {line:?}"
        );
    }
}

#[tokio::test]
async fn serve_creates_no_dev_account_unless_asked() {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .serve(&redis.url())
        .without_dev_key()
        .start()
        .await;
    let revoke = gw
        .admin_send(gw.admin_request(Method::DELETE, "/admin/keys/key_dev"))
        .await;
    revoke.expect_status(404);
    assert!(!gw.ready_line.contains("key="), "{}", gw.ready_line);
}

#[tokio::test]
async fn serve_refuses_to_start_without_an_admin_token() {
    let mut args = vec!["serve", "--redis-url", "redis://127.0.0.1:1"];
    args.extend(LOOPBACK);
    let (code, stderr) = run_to_exit(&args, &[]).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("--admin-token"), "{stderr}");
}

#[tokio::test]
async fn standalone_shows_the_secrets_it_generated_once_on_the_ready_line() {
    let gw = Gateway::builder()
        .without_admin_token()
        .without_dev_key()
        .start()
        .await;
    assert!(gw.key.starts_with("sk-svc-"), "{}", gw.ready_line);
    assert_ne!(gw.key, DEV_KEY);
    assert_ne!(gw.admin_token, ADMIN_TOKEN);
    // They work...
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 8))
        .await
        .expect_ok();
    gw.admin_get("/admin/accounts/acct_nope")
        .await
        .expect_status(404);
    // ...and appear nowhere but on the ready line.
    let output = all_output(&gw);
    assert_eq!(output.matches(&gw.key).count(), 1, "{output}");
    assert_eq!(output.matches(&gw.admin_token).count(), 1, "{output}");
}

#[tokio::test]
async fn standalone_warns_loudly_when_it_seeds_the_public_example_key() {
    // The default manifests (deploy/standalone) seed the example enterprise key.
    let gw = Gateway::start().await;
    let stderr = gw.stderr();
    assert!(
        stderr.contains("WARNING: seeding the public example key"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(e2e::ENTERPRISE_KEY),
        "the warning names the id, not the secret"
    );
}

#[tokio::test]
async fn a_refused_secret_flag_is_named_but_its_value_never_printed() {
    for (flag, value) in [
        ("--admin-token", "short-CANARY"),
        ("--payment-webhook-secret", "short-CANARY"),
        ("--responses-secret", "short-CANARY"),
        ("--dev-key", "short-CANARY"),
        ("--smtp-url", "smtpx://user:CANARY@host"),
    ] {
        let mut args = vec!["standalone"];
        args.extend(LOOPBACK);
        args.extend([flag, value]);
        let (code, stderr) = run_to_exit(&args, &[]).await;
        assert_eq!(code, Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(flag), "the refusal names {flag}: {stderr}");
        assert!(
            !stderr.contains("CANARY"),
            "the refused value of {flag} was printed: {stderr}"
        );
    }
}
