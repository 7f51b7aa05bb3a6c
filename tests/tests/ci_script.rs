//! `scripts/test` under CI (issue 52): what CI tests is what that run builds, each test once.
//! A preset binary, image or client folder (`GATEWAY_BIN`, `OPERATOR_BIN`, `HELM_BIN`,
//! `KUBE_APISERVER_BIN`, `CLAUDE_BIN`, `CODEX_BIN`, `GATEWAY_IMAGE`, `NODE_CLIENTS`, any other
//! `*_BIN`) would be tested instead, and nextest's variables (`NEXTEST_RETRIES`,
//! `NEXTEST_PROFILE`, any `NEXTEST_*`) retry a flaky failure away: each is refused before
//! anything runs, like the knobs that shrink the suite. `--check-env` stops after the
//! refusals, so a refusal that broke cannot start the whole suite from a test.

use std::process::Command;

use e2e::gateway::workspace_root;

/// `CI=true [name=value] scripts/test --check-env`, in an environment without any variable
/// the script refuses (nextest sets its own `NEXTEST_*` in a test's environment, and
/// `scripts/test` its `*_BIN`): exit code and stderr.
fn check_env(preset: Option<(&str, &str)>) -> (Option<i32>, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(workspace_root().join("scripts/test"))
        .arg("--check-env")
        .env("CI", "true");
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.ends_with("_BIN")
            || name.starts_with("NEXTEST")
            || [
                "GATEWAY_IMAGE",
                "NODE_CLIENTS",
                "SKIP_PYTHON",
                "PROPTEST_CASES",
            ]
            .contains(&name.as_ref())
        {
            cmd.env_remove(name.as_ref());
        }
    }
    if let Some((name, value)) = preset {
        cmd.env(name, value);
    }
    let out = cmd.output().expect("bash runs scripts/test");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn under_ci_scripts_test_refuses_every_preset_binary_and_every_nextest_variable() {
    let (code, stderr) = check_env(None);
    assert_eq!(code, Some(0), "nothing preset, nothing refused: {stderr}");
    let presets = [
        ("GATEWAY_BIN", "/usr/bin/true"),
        ("OPERATOR_BIN", "/usr/bin/true"),
        ("HELM_BIN", "/usr/bin/true"),
        ("KUBE_APISERVER_BIN", "/usr/bin/true"),
        ("CLAUDE_BIN", "/usr/bin/true"),
        ("CODEX_BIN", "/usr/bin/true"),
        ("ANY_NEW_BIN", "/usr/bin/true"),
        ("GATEWAY_IMAGE", "localhost/preset:latest"),
        ("NODE_CLIENTS", "/tmp"),
        ("NEXTEST_RETRIES", "3"),
        ("NEXTEST_PROFILE", "lenient"),
        ("NEXTEST_HIDE_PROGRESS_BAR", "1"),
    ];
    let mut refused = 0;
    for (name, value) in presets {
        let (code, stderr) = check_env(Some((name, value)));
        assert_eq!(code, Some(2), "{name} under CI: {stderr}");
        assert!(
            stderr.contains(&format!("{name} is set")),
            "{name}: the refusal names it: {stderr}"
        );
        refused += 1;
    }
    assert_eq!(refused, presets.len());
}

#[test]
fn the_nextest_configuration_retries_no_test() {
    let path = workspace_root().join(".config/nextest.toml");
    let config = std::fs::read_to_string(&path).unwrap_or_default();
    let retries: Vec<&str> = config
        .lines()
        .filter(|l| l.trim_start().starts_with("retries"))
        .collect();
    assert!(retries.is_empty(), "{}: {retries:?}", path.display());
}
