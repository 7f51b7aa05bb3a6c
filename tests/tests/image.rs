//! The image (`Containerfile`; `scripts/image` builds the same layout offline) run by podman as
//! the chart runs it: read-only root filesystem, user 65532, every capability dropped, host
//! network. The gateway answers its probes, serves a turn through its public port and stops with
//! exit code 0 on SIGTERM within the grace; `gateway migrate` migrates a database; the operator
//! (the image's other binary, run by `command` as the chart does) sweeps and is ready, reports
//! not ready while its database is down (and ready again once it is back), and stops cleanly
//! too.
//!
//! The image is built once per suite run by `scripts/test` (`GATEWAY_IMAGE`); without podman or
//! the image these tests fail under CI and skip elsewhere.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use e2e::kube::{Identity, KubeApi};
use e2e::podman::{self, Container};
use e2e::server::free_port_for_later;
use e2e::{
    message, poll_until, Gateway, MockUpstream, PostgresServer, RoutedManifests, Scrape,
    UpstreamDef, DEV_KEY,
};

/// The chart's grace for a gateway pod is longer; a stop that needs it all was a SIGKILL.
const GRACE_SECS: u32 = 30;

/// The `Uid:` and `CapEff:` lines of the container's first process, read on the host.
fn uid_and_capabilities(container: &Container) -> (String, String) {
    let out = podman::podman(&["inspect", "--format", "{{.State.Pid}}", &container.name]);
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("no /proc/{pid}/status of {}: {e}", container.name));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    (field("Uid:"), field("CapEff:"))
}

/// Polls the operator's `/readyz` status and `gateway_operator_sweep_failing` until they are
/// `want`, after at least one good sweep; the scrape then.
async fn operator_state(
    client: &reqwest::Client,
    metrics: &str,
    what: &str,
    want: (u16, f64),
) -> Scrape {
    poll_until(
        what,
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async move {
            let ready = client
                .get(format!("http://{metrics}/readyz"))
                .send()
                .await
                .ok()?
                .status()
                .as_u16();
            let text = client
                .get(format!("http://{metrics}/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            let scrape = Scrape::parse(&text);
            let failing = scrape.get("gateway_operator_sweep_failing", &[])?;
            let swept = scrape.get("gateway_operator_sweeps_total", &[])? >= 1.0;
            (swept && (ready, failing) == want).then_some(scrape)
        },
    )
    .await
}

fn run(line: &[OsString], args: &[&str]) -> std::process::Output {
    std::process::Command::new(&line[0])
        .args(&line[1..])
        .args(args)
        .output()
        .expect("run podman")
}

#[tokio::test]
async fn the_image_serves_a_turn_read_only_as_65532_without_capabilities_and_stops_on_sigterm() {
    if !podman::image_available() {
        return;
    }
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
    let (container, launcher) = Container::run_command(&[], &[&manifests.path], None);
    let mut gw = Gateway::builder()
        .manifests(&manifests.path)
        .launched_by(launcher)
        .start()
        .await;
    assert_eq!(
        uid_and_capabilities(&container),
        (
            "65532 65532 65532 65532".to_owned(),
            "0000000000000000".to_owned()
        ),
        "the gateway runs as 65532 with no capability"
    );

    let live = gw
        .client()
        .get(format!("{}/livez", gw.admin))
        .send()
        .await
        .expect("GET /livez");
    assert_eq!(live.status(), 200, "{}", gw.logs());
    let reply = gw
        .post_messages(DEV_KEY, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    assert_eq!(reply["content"][0]["text"], "Hello from upstream.");
    assert_eq!(mock.request_count(), 1, "the turn reached the upstream");

    let stop = container.stop(GRACE_SECS);
    assert!(
        stop.status.success(),
        "podman stop: {}",
        String::from_utf8_lossy(&stop.stderr)
    );
    gw.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        container.exit_code(),
        "0",
        "SIGTERM ends the gateway cleanly (137 would be podman's SIGKILL after the grace)\n{}",
        gw.logs()
    );
}

#[tokio::test]
async fn gateway_migrate_in_the_image_migrates_the_database() {
    if !podman::image_available() {
        return;
    }
    let pg = PostgresServer::start().await;
    let url = pg.url();
    let (_container, line) = Container::run_command(&[("DATABASE_URL", &url)], &[], None);
    let out = run(&line, &["migrate"]);
    assert!(
        out.status.success(),
        "gateway migrate in the image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"migrated":true}"#
    );
    assert!(
        pg.query_i64("SELECT count(*) FROM _sqlx_migrations WHERE success")
            .await
            > 0,
        "no migration was recorded"
    );
}

#[tokio::test]
async fn the_operator_in_the_image_is_not_ready_while_its_sweep_fails_and_stops_on_sigterm() {
    if !podman::image_available() {
        return;
    }
    let Some(api) = KubeApi::start_with_gateway_resources().await else {
        return;
    };
    let mut pg = PostgresServer::start().await;
    pg.gateway_cli(&["migrate"]).await.expect("migrate");
    let kubeconfig = api.kubeconfig(Identity::Operator);
    let kubeconfig_path = kubeconfig.to_str().expect("a UTF-8 path");
    let metrics = format!("127.0.0.1:{}", free_port_for_later());
    let (container, line) = Container::run_command(
        &[("KUBECONFIG", kubeconfig_path)],
        &[Path::new(kubeconfig_path)],
        Some("/usr/local/bin/operator"),
    );
    let url = pg.url();
    let mut cmd = tokio::process::Command::new(&line[0]);
    cmd.args(&line[1..])
        .args(["run", "--namespace", e2e::kube::NAMESPACE])
        .args(["--identity", "operator-0", "--metrics-listen", &metrics])
        .args(["--database-url", &url, "--sweep-interval", "2s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut operator = cmd.spawn().expect("run podman");
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let logs = || {
        let out = podman::podman(&["logs", &container.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    operator_state(
        &client,
        &metrics,
        "the operator to be ready after a sweep",
        (200, 0.0),
    )
    .await;

    pg.stop().await;
    let scrape = operator_state(
        &client,
        &metrics,
        "a failed sweep to make it not ready",
        (503, 1.0),
    )
    .await;
    assert!(scrape.get("gateway_operator_sweep_failures_total", &[]) >= Some(1.0));
    // The chart's alerts and dashboard query only series the operator exports.
    let alerted: Vec<String> = e2e::helm::alerted_metric_names()
        .into_iter()
        .filter(|n| n.starts_with("gateway_operator_"))
        .collect();
    assert!(!alerted.is_empty(), "no operator series alerted on");
    for name in &alerted {
        assert!(
            scrape.declares(name),
            "the chart's alerts or dashboard query {name}, which the operator does not export:\n{scrape}"
        );
    }
    pg.restart().await;
    operator_state(
        &client,
        &metrics,
        "a good sweep to make it ready again",
        (200, 0.0),
    )
    .await;

    let stop = container.stop(GRACE_SECS);
    assert!(
        stop.status.success(),
        "podman stop: {}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let _ = tokio::time::timeout(Duration::from_secs(10), operator.wait()).await;
    assert_eq!(
        container.exit_code(),
        "0",
        "SIGTERM ends the operator cleanly (137 would be podman's SIGKILL after the grace)\n{}",
        logs()
    );
}

/// `scripts/release` to a local registry (Debian's docker-registry): the image is pushed with
/// its OCI labels and pulls back by digest, where it runs as that version; the chart pulls back
/// as an OCI artifact at the same version and renders the image by that digest; the SBOM lists
/// the crates the binaries link, each by its purl.
#[tokio::test]
async fn a_release_pushes_the_labelled_image_its_sbom_and_the_chart_and_both_pull_back_by_version_and_digest(
) {
    if !podman::image_available() {
        return;
    }
    let registry = e2e::registry::Registry::start().await;
    let root = e2e::gateway::workspace_root();
    let out_dir = std::env::temp_dir().join(e2e::gateway::unique_name("e2e-release"));
    let bin_dir = e2e::gateway::gateway_bin()
        .parent()
        .expect("the binaries' folder")
        .to_path_buf();
    let released = std::process::Command::new(root.join("scripts/release"))
        .arg(registry.host())
        .arg(&bin_dir)
        .env("PLAIN_HTTP", "1")
        .env("OUT", &out_dir)
        .current_dir(&root)
        .output()
        .expect("run scripts/release");
    assert!(
        released.status.success(),
        "scripts/release failed:\n{}\nregistry:\n{}",
        String::from_utf8_lossy(&released.stderr),
        registry.logs()
    );
    let stdout = String::from_utf8_lossy(&released.stdout);
    let release: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("no release.json line ({e}): {stdout}"));
    let field = |name: &str| release[name].as_str().unwrap_or_default().to_owned();
    let version = podman::app_version();
    assert_eq!(field("version"), version);
    let digest = field("image_digest");
    assert!(digest.starts_with("sha256:"), "{release}");

    // The image, pulled by digest as a cluster pinning it would.
    let by_digest = format!("{}/svc-gateway@{digest}", registry.host());
    assert_eq!(field("image_by_digest"), by_digest);
    let pulled = podman::podman(&["pull", "--tls-verify=false", &by_digest]);
    assert!(
        pulled.status.success(),
        "podman pull {by_digest}: {}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    let ran = podman::podman(&["run", "--rm", "--network", "host", &by_digest, "--version"]);
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout).trim(),
        format!("gateway {version}"),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let labels = podman::podman(&[
        "image",
        "inspect",
        "--format",
        "{{json .Labels}}",
        &by_digest,
    ]);
    let labels: serde_json::Value =
        serde_json::from_slice(&labels.stdout).expect("the image's labels as JSON");
    for (label, want) in [
        ("org.opencontainers.image.version", version.as_str()),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
    ] {
        assert_eq!(labels[label], want, "{labels}");
    }
    for label in [
        "org.opencontainers.image.source",
        "org.opencontainers.image.revision",
    ] {
        assert!(
            labels[label].as_str().is_some_and(|v| !v.is_empty()),
            "no {label}: {labels}"
        );
    }
    let _ = podman::podman(&["rmi", "--force", &by_digest]);

    // The chart, pulled from the registry at the release's version, renders that digest.
    let helm = |args: &[&str]| {
        let out = std::process::Command::new(root.join(".cache/venv/bin/helm"))
            .args(args)
            .current_dir(&out_dir)
            .output()
            .expect("run helm");
        assert!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let reference = format!("oci://{}/charts/gateway", registry.host());
    assert_eq!(field("chart"), reference);
    std::fs::create_dir_all(out_dir.join("pulled")).expect("a folder for the pulled chart");
    helm(&[
        "pull",
        &reference,
        "--version",
        &version,
        "--plain-http",
        "-d",
        "pulled",
    ]);
    let package = format!("pulled/gateway-{version}.tgz");
    assert!(helm(&["show", "chart", &package]).contains(&format!("appVersion: {version}")));
    let repository = format!("gateway.image.repository={}/svc-gateway", registry.host());
    let pinned = format!("gateway.image.digest={digest}");
    let rendered = helm(&[
        "template",
        "gw",
        &package,
        "--set",
        &repository,
        "--set",
        &pinned,
    ]);
    assert!(
        rendered.contains(&format!("image: {by_digest}")),
        "the chart does not render the image by its digest"
    );

    // The SBOM: CycloneDX, this version, every linked crate by its purl.
    let sbom: serde_json::Value =
        serde_json::from_slice(&std::fs::read(field("sbom")).expect("read the SBOM"))
            .expect("the SBOM is JSON");
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["metadata"]["component"]["version"], version.as_str());
    let purls: Vec<&str> = sbom["components"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["purl"].as_str())
        .collect();
    assert!(purls.len() > 100, "{} components", purls.len());
    for linked in [
        "pkg:cargo/axum@",
        "pkg:cargo/sqlx-core@",
        "pkg:cargo/kube-client@",
    ] {
        assert!(
            purls.iter().any(|p| p.starts_with(linked)),
            "{linked} is not in the SBOM"
        );
    }
    assert!(
        !purls.iter().any(|p| p.starts_with("pkg:cargo/proptest@")),
        "a test-only crate is in the SBOM"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}
