//! The official `anthropic` Python SDK, from the venv `scripts/test` creates.

use crate::gateway::workspace_root;

/// Calls /v1/messages through the official Python SDK; returns the message id, or the HTTP
/// status the SDK raised.
pub async fn sdk_call(base_url: &str, key: &str) -> Result<String, u16> {
    let python = workspace_root().join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test creates the venv with the anthropic SDK",
        python.display()
    );
    let script = r#"
import sys, anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
try:
    m = client.messages.create(model="svc/haiku", max_tokens=64,
        messages=[{"role": "user", "content": "Hello from a test"}])
    print("ok", m.id)
except anthropic.APIStatusError as e:
    print("status", e.status_code)
"#;
    let out = tokio::process::Command::new(python)
        .args(["-c", script, base_url, key])
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .await
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["ok", id] => Ok(id.to_string()),
        ["status", code] => Err(code.parse().expect("status code")),
        _ => panic!(
            "SDK call failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
