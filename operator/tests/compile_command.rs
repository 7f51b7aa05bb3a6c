use std::path::PathBuf;
use std::process::{Command, Output};

use crds::config::{GatewayConfig, Route};

fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

fn operator(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_operator"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn compile(folder: &str, extra: &[&str]) -> GatewayConfig {
    let dir = repo_path(folder);
    let mut args = vec!["compile", "--manifests", dir.to_str().unwrap()];
    args.extend(extra);
    let output = operator(&args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_yaml::from_slice(&output.stdout).unwrap()
}

fn upstream_keys(config: &GatewayConfig) -> Vec<String> {
    config
        .models
        .values()
        .filter_map(|m| match &m.route {
            Route::Upstreams(upstreams) => Some(upstreams),
            Route::Auto { .. } => None,
        })
        .flatten()
        .filter_map(|u| u.api_key.as_ref().map(|k| k.expose().to_owned()))
        .collect()
}

#[test]
fn compile_prints_the_config_with_secrets_redacted() {
    let config = compile("deploy/examples", &[]);
    let keys = upstream_keys(&config);
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k == "<redacted>"), "{keys:?}");

    let standalone = compile("deploy/standalone", &[]);
    let seed = standalone.keys["key_example_enterprise"]
        .seed
        .as_ref()
        .unwrap();
    assert_eq!(seed.secret.expose(), "<redacted>");
}

#[test]
fn show_secrets_prints_them_and_keeps_the_version() {
    let shown = compile("deploy/examples", &["--show-secrets"]);
    assert!(upstream_keys(&shown)
        .iter()
        .all(|k| k.starts_with("PLACEHOLDER-")));
    assert_eq!(shown.version, compile("deploy/examples", &[]).version);
}

#[test]
fn invalid_folder_fails_with_the_reason_on_stderr() {
    let output = operator(&["compile", "--manifests", "/no/such/folder"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot list manifest folder /no/such/folder"),
        "{stderr}"
    );
}
