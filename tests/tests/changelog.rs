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
