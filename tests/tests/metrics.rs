//! Prometheus metrics on the admin listener's `/metrics`: after real traffic, the series
//! exist with the values the responses imply (requests by endpoint/model/status, tokens and
//! credits by model, latency histograms, 429s by dimension, open streams, Redis calls, the
//! config version in use).

use std::time::Duration;

use e2e::sse::assemble_message_stream;
use e2e::*;

fn usage_u64(body: &serde_json::Value, field: &str) -> f64 {
    body["usage"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("usage.{field} missing: {body}")) as f64
}

#[tokio::test]
async fn requests_are_counted_by_endpoint_model_and_status() {
    let gw = Gateway::start().await;
    for _ in 0..2 {
        gw.post_messages(&gw.key, &message("svc/sonnet", "Hello there", 16))
            .await
            .expect_ok();
    }
    gw.chat(&gw.key, &chat_body("svc/haiku", "Hello", Some(16)))
        .await
        .expect_ok();
    gw.post_messages(&gw.key, &message("svc/nope", "Hello", 16))
        .await
        .expect_status(400);
    gw.get("/v1/models/svc/opus", &gw.key).await.expect_ok();
    gw.get("/v1/models", "sk-svc-not-a-key")
        .await
        .expect_status(401);

    let m = gw.metrics().await;
    let requests = |endpoint: &str, model: &str, status: &str| {
        m.value(
            "gateway_requests_total",
            &[("endpoint", endpoint), ("model", model), ("status", status)],
        )
    };
    assert_eq!(requests("/v1/messages", "svc/sonnet", "200"), 2.0);
    assert_eq!(requests("/v1/chat/completions", "svc/haiku", "200"), 1.0);
    // An unknown model is no label value: the request is counted without one.
    assert_eq!(requests("/v1/messages", "", "400"), 1.0);
    assert_eq!(requests("/v1/models/{id}", "", "200"), 1.0);
    assert_eq!(requests("/v1/models", "", "401"), 1.0);
    assert!(!m.text.contains("svc/nope"), "{m}");
}

#[tokio::test]
async fn tokens_and_credits_by_model_equal_what_the_responses_reported() {
    let gw = Gateway::start().await;
    let first = gw
        .post_messages(&gw.key, &message("svc/opus", "Tell me a story", 64))
        .await
        .expect_ok();
    let second = gw
        .post_messages(&gw.key, &message("svc/opus", "And another one", 32))
        .await
        .expect_ok();

    let m = gw.metrics().await;
    let sum = |field: &str| usage_u64(&first, field) + usage_u64(&second, field);
    let tokens = |kind: &str| {
        m.value(
            "gateway_tokens_total",
            &[("model", "svc/opus"), ("type", kind)],
        )
    };
    assert_eq!(tokens("input"), sum("input_tokens"));
    assert_eq!(tokens("output"), sum("output_tokens"));
    assert_eq!(
        m.value("gateway_credits_billed_total", &[("model", "svc/opus")]),
        sum("credits_consumed")
    );
    let opus = [("model", "svc/opus")];
    assert_eq!(m.value("gateway_added_latency_seconds_count", &opus), 2.0);
    assert_eq!(
        m.value("gateway_time_to_first_token_seconds_count", &opus),
        2.0
    );
    assert!(m.value("gateway_time_to_first_token_seconds_sum", &opus) > 0.0);
    assert_eq!(
        m.value(
            "gateway_time_to_first_token_seconds_bucket",
            &[("model", "svc/opus"), ("le", "+Inf")]
        ),
        2.0
    );
}

#[tokio::test]
async fn an_open_stream_is_counted_in_flight_until_it_ends() {
    let gw = Gateway::builder().chunk_delay_ms(40).start().await;
    assert_eq!(
        gw.metrics().await.value("gateway_streams_in_flight", &[]),
        0.0
    );
    let mut stream = gw
        .stream(
            "/v1/messages",
            &gw.key,
            &message_stream("svc/sonnet", "Write a long answer", 64),
        )
        .await;
    let mut events = Vec::new();
    stream.read_until("content_block_delta", &mut events).await;
    assert_eq!(
        gw.metrics().await.value("gateway_streams_in_flight", &[]),
        1.0
    );
    events.extend(stream.collect().await);
    assemble_message_stream(&events);
    let m = gw.metrics().await;
    assert_eq!(m.value("gateway_streams_in_flight", &[]), 0.0);
    assert_eq!(
        m.value(
            "gateway_requests_total",
            &[
                ("endpoint", "/v1/messages"),
                ("model", "svc/sonnet"),
                ("status", "200")
            ]
        ),
        1.0
    );
}

#[tokio::test]
async fn rate_limit_rejections_are_counted_by_dimension() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    gw.wait_for_roomy_window(&gw.key, 5).await;
    for _ in 0..5 {
        gw.count_tokens(&gw.key, &count_body("svc/haiku", "hi"))
            .await
            .expect_ok();
    }
    for _ in 0..2 {
        gw.count_tokens(&gw.key, &count_body("svc/haiku", "hi"))
            .await
            .expect_status(429);
    }
    let m = gw.metrics().await;
    assert_eq!(
        m.value("gateway_rate_limited_total", &[("dimension", "requests")]),
        2.0
    );
    // Every dimension is exported from the start, at 0 until it refuses.
    assert_eq!(
        m.get("gateway_rate_limited_total", &[("dimension", "streams")]),
        Some(0.0)
    );
}

#[tokio::test]
async fn the_config_version_in_use_is_an_info_series() {
    let gw = Gateway::start().await;
    let m = gw.metrics().await;
    let info: Vec<_> = m
        .samples
        .iter()
        .filter(|s| s.name == "gateway_config_info")
        .collect();
    assert_eq!(info.len(), 1, "{m}");
    assert_eq!(info[0].value, 1.0);
    assert!(!info[0].labels["version"].is_empty(), "{m}");
}

#[tokio::test]
async fn metrics_need_no_admin_token_but_the_admin_api_still_does() {
    let gw = Gateway::start().await;
    let scrape = gw.admin_unauthenticated("/metrics").await;
    scrape.expect_status(200);
    assert!(
        scrape
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{scrape}"
    );
    assert!(scrape.text.ends_with("# EOF\n"));
    gw.admin_unauthenticated("/admin/accounts/acct_x")
        .await
        .expect_status(401);
}

#[tokio::test]
async fn redis_calls_are_timed_and_failures_counted() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .serve(&redis.url())
        .redis_timeout_ms(200)
        .start()
        .await;
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    let m = gw.metrics().await;
    let admit = [("store", "redis"), ("op", "admit")];
    // One admission call per turn: the request count, the input tokens and the stream slot
    // together, once the body is tokenized. A JSON turn's token correction rides on the next
    // admission (or a flush within a second), so it takes no call of its own.
    assert_eq!(
        m.value("gateway_store_call_duration_seconds_count", &admit),
        1.0
    );
    let finish = [("store", "redis"), ("op", "finish")];
    assert!(
        m.get("gateway_store_call_duration_seconds_count", &finish)
            .is_none_or(|n| n <= 1.0),
        "at most one flush of the turn's token correction"
    );
    assert_eq!(m.get("gateway_store_call_errors_total", &admit), Some(0.0));

    redis.stop().await;
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_status(503);
    let m = gw.metrics().await;
    assert_eq!(m.value("gateway_store_call_errors_total", &admit), 1.0);
    // The failed calls were timed too, and each gave up at its timeout (200 ms), not hung: the
    // bound is a generous multiple of it.
    let timed = m.value("gateway_store_call_duration_seconds_sum", &admit);
    assert!(
        timed > 0.0 && timed < Duration::from_secs(10).as_secs_f64(),
        "admission calls timed at {timed} s in all"
    );
}

/// The chart's alerts and dashboard (tests/python/test_chart_alerts.py) query only series a
/// pod exports: each `gateway_*` name they use but the operator's is declared by a `serve`
/// gateway on Redis and Postgres after a turn served and one its upstream failed (which opens
/// that upstream's breaker); the operator's are checked in image.rs.
#[tokio::test]
async fn every_gateway_series_the_charts_alerts_and_dashboard_query_is_exported() {
    let names: Vec<String> = helm::alerted_metric_names()
        .into_iter()
        .filter(|n| !n.starts_with("gateway_operator_"))
        .collect();
    let (redis, pg) = (RedisServer::start().await, PostgresServer::start().await);
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
    let gw = Gateway::builder()
        .serve(&redis.url())
        .database(&pg.url())
        .manifests(&manifests.path)
        .arg("--breaker-failures")
        .arg("1")
        .start()
        .await;
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    mock.push([Reply::status(500)]);
    let failed = gw
        .post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await;
    assert_ne!(
        failed.status, 200,
        "the upstream's failure reached the client: {failed}"
    );
    let m = gw.metrics().await;
    let missing: Vec<&String> = names.iter().filter(|n| !m.declares(n)).collect();
    assert!(
        missing.is_empty(),
        "the chart's alerts or dashboard query {missing:?}, which the gateway does not export:\n{m}"
    );
}
