//! What prompt caching is worth to a developer (issue 20): the usage report (`GET
//! /v1/usage`, the dashboard's usage page and CSV) shows the cached input and the credits that
//! cache reads saved against fresh input, per model and day, at the model's prices.

use e2e::*;
use serde_json::json;

#[tokio::test]
async fn the_usage_report_shows_cache_reads_and_the_credits_they_saved() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let usage = MockUsage {
        input: 40,
        output: 9,
        cache_read: 1000,
        cache_write: 300,
    };
    mock.push([
        Reply::text("cached").usage(usage),
        Reply::text("cached").usage(usage),
    ]);
    // A prompt the gateway counts above the upstream's 1,340 tokens, with a cache breakpoint,
    // so the reservation covers the turn.
    let mut body = message("svc/sonnet", "hi", 100);
    body["system"] = json!([{"type": "text", "text": words(1400),
        "cache_control": {"type": "ephemeral"}}]);
    for _ in 0..2 {
        gw.post_messages(&gw.key, &body).await.expect_ok();
    }

    let report = gw
        .get("/v1/usage?group_by=model", &gw.key)
        .await
        .expect_ok();
    let sonnet = report["data"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["model"] == "svc/sonnet"))
        .unwrap_or_else(|| panic!("no svc/sonnet row in {report}"));
    assert_eq!(sonnet["cache_read_input_tokens"], 2000, "{report}");
    assert_eq!(sonnet["cache_creation_input_tokens"], 600, "{report}");
    // Sonnet: $3 fresh input and $0.30 cache read per MTok, 100,000 credits per USD: each
    // cached token saves $2.70 per MTok, so 2,000 of them save 2000 * 2.7 / 10 = 540 credits.
    assert_eq!(sonnet["cache_read_credits_saved"], 540, "{report}");
    assert_eq!(
        report["totals"]["cache_read_credits_saved"], 540,
        "{report}"
    );
}
