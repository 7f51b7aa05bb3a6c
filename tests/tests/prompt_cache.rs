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

/// A streamed and a JSON turn through `upstream` whose usage is `usage` (`one_hour` of its
/// writes to the 1-hour cache): each answer's `credits_consumed`, checked against the balance.
async fn billed(
    upstream: fn(&MockUpstream) -> UpstreamDef,
    usage: MockUsage,
    one_hour: u64,
) -> Vec<i64> {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[upstream(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let reply = Reply::text("cached").usage(usage).cache_write_1h(one_hour);
    mock.push([reply.clone(), reply]);
    // A prompt the gateway counts above the upstream's tokens, asking for the 1-hour cache,
    // so the reservation covers any split of its input between fresh and cached.
    let mut body = message("svc/sonnet", "hi", 100);
    body["system"] = json!([{"type": "text", "text": words(1400),
        "cache_control": {"type": "ephemeral", "ttl": "1h"}}]);
    let mut told = Vec::new();
    for stream in [false, true] {
        let before = gw.balance(&gw.key).await;
        let credits = if stream {
            body["stream"] = json!(true);
            let events = gw
                .stream("/v1/messages", &gw.key, &body)
                .await
                .collect()
                .await;
            i64::try_from(sse::assemble_message_stream(&events).credits()).unwrap_or(i64::MAX)
        } else {
            let answer = gw.post_messages(&gw.key, &body).await.expect_ok();
            answer["usage"]["credits_consumed"]
                .as_i64()
                .unwrap_or_else(|| panic!("no credits_consumed in {answer}"))
        };
        assert_eq!(
            before - gw.balance(&gw.key).await,
            credits,
            "stream: {stream}"
        );
        told.push(credits);
    }
    told
}

#[tokio::test]
async fn cache_writes_of_both_lifetimes_and_cache_reads_are_billed_at_their_prices() {
    let usage = MockUsage {
        input: 40,
        output: 9,
        cache_read: 1000,
        cache_write: 300,
    };
    // Anthropic reports writes by lifetime: 200 to the 5-minute cache at $3.75/M, 100 to the
    // 1-hour one at twice the $3 input (svc/sonnet sets no price of its own for them), 1,000
    // reads at $0.30/M, 40 fresh at $3/M and 9 out at $15/M; 100,000 credits per USD:
    // (120 + 135 + 750 + 600 + 300) / 10 = 190.5, rounded up once.
    assert_eq!(billed(UpstreamDef::anthropic, usage, 100).await, [191, 191]);
    // OpenAI-compatible upstreams report cached prompt tokens (reads) and no writes:
    // (120 + 135 + 300) / 10 = 55.5.
    assert_eq!(billed(UpstreamDef::openai, usage, 0).await, [56, 56]);
}
