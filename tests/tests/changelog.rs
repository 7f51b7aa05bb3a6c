//! The API changelog (spec, Versioning): `CHANGELOG.md`, newest first, served without sign-in at
//! `/developers/changelog`; the version it names first is the one every `/v1` answer reports in
//! its `Svc-Api-Version` header (errors included) and `GET /v1/models` in `api_version`.

use e2e::gateway::workspace_root;
use e2e::*;
use reqwest::Method;

/// The newest version the committed changelog names: its first `## vX.Y.Z` heading.
fn newest_in_changelog_file() -> String {
    let text =
        std::fs::read_to_string(workspace_root().join("CHANGELOG.md")).expect("read CHANGELOG.md");
    text.lines()
        .find_map(|l| l.strip_prefix("## v"))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("CHANGELOG.md names a version under a `## v` heading")
        .to_owned()
}

#[tokio::test]
async fn the_changelog_page_the_file_and_the_version_header_agree() {
    let gw = Gateway::start().await;
    let version = newest_in_changelog_file();

    let models = gw.get("/v1/models", DEV_KEY).await;
    assert_eq!(
        models.header("svc-api-version").as_deref(),
        Some(version.as_str())
    );
    assert_eq!(models.expect_ok()["api_version"], version.as_str());

    let page = gw
        .client()
        .get(gw.url("/developers/changelog"))
        .send()
        .await
        .expect("GET the changelog page");
    assert_eq!(page.status(), 200, "the changelog needs no sign-in");
    let html = page.text().await.expect("read the page");
    let first = html
        .find("<h2>")
        .expect("the page lists versions as headings");
    assert!(
        html[first..].starts_with(&format!("<h2>v{version} ")),
        "the page's newest entry is v{version}: {}",
        &html[first..(first + 80).min(html.len())]
    );
    assert!(html.contains("v0.1.0"), "the launch version is listed");
}

#[tokio::test]
async fn every_v1_answer_carries_the_api_version_errors_included() {
    let gw = Gateway::start().await;
    let version = newest_in_changelog_file();
    for (method, path, key) in [
        (Method::POST, "/v1/messages", None),
        (Method::GET, "/v1/no-such-path", Some(DEV_KEY)),
        (Method::POST, "/v1/messages", Some(DEV_KEY)),
        (Method::GET, "/v1/account", Some(DEV_KEY)),
    ] {
        let resp = gw.send(gw.request(method.clone(), path, key)).await;
        assert_eq!(
            resp.header("svc-api-version").as_deref(),
            Some(version.as_str()),
            "{method} {path} answered {} without the version",
            resp.status
        );
    }
}

/// `gateway --version` / `operator --version`: `NAME VERSION`, the version alone.
fn binary_version(bin: &std::path::Path) -> String {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} --version: {e}", bin.display()));
    assert!(out.status.success(), "{} --version failed", bin.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned()
}

/// `KEY: VALUE` of Chart.yaml, quotes dropped.
fn chart_field(key: &str) -> String {
    let chart = std::fs::read_to_string(workspace_root().join("charts/gateway/Chart.yaml"))
        .expect("read Chart.yaml");
    chart
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("Chart.yaml has no {key}"))
        .trim()
        .trim_matches('"')
        .to_owned()
}

/// One version for a release (docs/kubernetes.md, "Upgrade and rollback"): the crates (the
/// binaries' `--version`), the chart's `version` and `appVersion`, the API the gateway reports
/// and the image's tag are bumped together, so a platform pins one number.
#[tokio::test]
async fn the_binaries_the_chart_the_api_and_the_image_carry_one_version() {
    let gw = Gateway::start().await;
    let api = gw.get("/v1/models", DEV_KEY).await.expect_ok()["api_version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let operator = std::env::var_os("OPERATOR_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| gateway::gateway_bin().with_file_name("operator"));
    let image = podman::image();
    let tag = image.rsplit_once(':').map(|(_, t)| t.to_owned());
    let versions = [
        (
            "the gateway binary",
            binary_version(&gateway::gateway_bin()),
        ),
        ("the operator binary", binary_version(&operator)),
        (
            "the e2e crate (the workspace's)",
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
        ("the chart's version", chart_field("version")),
        ("the chart's appVersion", chart_field("appVersion")),
        ("the image's tag", tag.unwrap_or_default()),
    ];
    for (what, version) in &versions {
        assert_eq!(
            version, &api,
            "{what} is {version}, the API {api} (image {image}): bump them together"
        );
    }
}
