//! The spec's Limits table: per-tier RPM / TPM / concurrent streams with their headers and
//! 429s, and the request-shape limits (stop_sequences, max_tokens, context window,
//! temperature / top_p, body size).

use std::time::Duration;

use e2e::*;
use reqwest::Method;
use serde_json::json;

const MIB: usize = 1024 * 1024;

/// Expects a 429 naming `dimension` and a delay in seconds, with Retry-After in 1..=60.
fn expect_rate_limited(resp: &Resp, dimension: &str) {
    let msg = resp.expect_error(429, "rate_limit_error");
    assert!(
        msg.contains(dimension),
        "429 message does not name {dimension:?}: {msg}"
    );
    assert!(
        mentions_seconds(&msg),
        "429 message names no delay in seconds: {msg}"
    );
    let retry_after = resp.retry_after();
    assert!(
        (1..=60).contains(&retry_after),
        "Retry-After {retry_after} not in 1..=60"
    );
    resp.rate_limit();
}

/// Sends `limit` count_tokens requests (all admitted, Remaining-Requests counting down to 0),
/// then expects the next one to be a 429 naming requests per minute.
async fn exhaust_rpm(gw: &Gateway, key: &str, limit: u64) {
    let body = count_body("svc/haiku", "hi");
    for i in 1..=limit {
        let resp = gw.count_tokens(key, &body).await;
        resp.expect_ok();
        let rl = resp.rate_limit();
        assert_eq!(rl.limit_requests, limit);
        assert_eq!(
            rl.remaining_requests,
            limit - i,
            "Remaining-Requests after request {i}"
        );
    }
    let resp = gw.count_tokens(key, &body).await;
    expect_rate_limited(&resp, "requests per minute");
    assert_eq!(resp.rate_limit().remaining_requests, 0);
}

#[tokio::test]
async fn every_tier_reports_the_spec_limits_in_its_headers() {
    let gw = Gateway::start().await;
    for (tier, rpm, tpm, streams) in TIERS {
        let key = gw.new_key(1_000_000, &KeySpec::tier(tier)).await;
        let rl = gw.get("/v1/models", &key.secret).await.rate_limit();
        assert_eq!(rl.tier, tier);
        assert_eq!(
            (rl.limit_requests, rl.limit_tokens, rl.limit_streams),
            (rpm, tpm, streams),
            "{tier}"
        );
        assert_eq!(
            (
                rl.remaining_requests,
                rl.remaining_tokens,
                rl.remaining_streams
            ),
            (rpm, tpm, streams)
        );
        let account = gw.account(&key.secret).await;
        assert_eq!(account["tier"], tier);
        assert_eq!(
            account["limits"],
            json!({"requests_per_minute": rpm, "input_tokens_per_minute": tpm, "concurrent_streams": streams})
        );
    }
}

#[tokio::test]
async fn free_key_gets_429_on_the_sixth_request_in_a_minute() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    gw.wait_for_roomy_window(&gw.key, 5).await;
    for i in 1..=5u64 {
        let resp = gw
            .post_messages(&gw.key, &message("svc/haiku", "hi", 16))
            .await;
        resp.expect_ok();
        assert_eq!(resp.rate_limit().remaining_requests, 5 - i);
    }
    let resp = gw
        .post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await;
    expect_rate_limited(&resp, "requests per minute");
    let reset = resp.rate_limit().reset_requests;
    assert!(
        resp.retry_after() <= reset.max(1),
        "Retry-After beyond the window reset {reset}"
    );
}

#[tokio::test]
async fn pay_as_you_go_key_gets_429_on_the_61st_request_in_a_minute() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.wait_for_roomy_window(&key.secret, 5).await;
    exhaust_rpm(&gw, &key.secret, 60).await;
}

#[tokio::test]
async fn high_volume_key_gets_429_on_the_301st_request_in_a_minute() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("high_volume")).await;
    gw.wait_for_roomy_window(&key.secret, 8).await;
    exhaust_rpm(&gw, &key.secret, 300).await;
}

#[tokio::test]
async fn count_tokens_counts_against_the_same_rpm_as_messages() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    gw.wait_for_roomy_window(&gw.key, 5).await;
    for _ in 0..3 {
        gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
            .await
            .expect_ok();
    }
    for _ in 0..2 {
        let resp = gw
            .count_tokens(&gw.key, &count_body("svc/haiku", "hi"))
            .await;
        assert!(
            resp.expect_ok()["input_tokens"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{resp}"
        );
    }
    expect_rate_limited(
        &gw.count_tokens(&gw.key, &count_body("svc/haiku", "hi"))
            .await,
        "requests per minute",
    );
    expect_rate_limited(
        &gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
            .await,
        "requests per minute",
    );
}

#[tokio::test]
async fn chat_completions_count_against_the_same_rpm() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    gw.wait_for_roomy_window(&gw.key, 5).await;
    for _ in 0..5 {
        gw.chat(&gw.key, &chat_body("svc/haiku", "hi", Some(16)))
            .await
            .expect_ok();
    }
    expect_rate_limited(
        &gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
            .await,
        "requests per minute",
    );
}

#[tokio::test]
async fn gets_do_not_count_against_rpm() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    for path in [
        "/v1/models",
        "/v1/models/svc/opus",
        "/v1/account",
        "/v1/usage",
    ] {
        for _ in 0..3 {
            let resp = gw.get(path, &gw.key).await;
            resp.expect_ok();
            assert_eq!(
                resp.rate_limit().remaining_requests,
                5,
                "{path} counted against RPM"
            );
        }
    }
    gw.wait_for_roomy_window(&gw.key, 5).await;
    for _ in 0..5 {
        gw.count_tokens(&gw.key, &count_body("svc/haiku", "hi"))
            .await
            .expect_ok();
    }
}

#[tokio::test]
async fn rate_limit_headers_are_on_every_authenticated_v1_response() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    let key = gw.key.clone();
    let mut responses = vec![
        ("GET /v1/models", gw.get("/v1/models", &key).await),
        (
            "GET /v1/models/svc/opus",
            gw.get("/v1/models/svc/opus", &key).await,
        ),
        ("GET /v1/account", gw.get("/v1/account", &key).await),
        ("GET /v1/usage", gw.get("/v1/usage", &key).await),
        (
            "404 GET /v1/models/svc/nope",
            gw.get("/v1/models/svc/nope", &key).await,
        ),
        ("404 GET /v1/nope", gw.get("/v1/nope", &key).await),
        ("405 GET /v1/messages", gw.get("/v1/messages", &key).await),
        (
            "POST /v1/messages",
            gw.post_messages(&key, &message("svc/haiku", "hi", 16))
                .await,
        ),
        (
            "POST count_tokens",
            gw.count_tokens(&key, &count_body("svc/haiku", "hi")).await,
        ),
        (
            "POST chat",
            gw.chat(&key, &chat_body("svc/haiku", "hi", Some(16))).await,
        ),
        (
            "400 POST /v1/messages",
            gw.post_messages(&key, &message("svc/nope", "hi", 16)).await,
        ),
    ];
    // Free tier: 5 requests per minute; keep going until the 429.
    let mut rate_limited = None;
    for _ in 0..8 {
        let resp = gw.count_tokens(&key, &count_body("svc/haiku", "hi")).await;
        if resp.status == 429 {
            rate_limited = Some(resp);
            break;
        }
    }
    responses.push((
        "429",
        rate_limited.expect("a free key is rate limited within 8 requests"),
    ));

    let broke = gw.new_key(0, &KeySpec::tier("free")).await;
    responses.push((
        "402",
        gw.post_messages(&broke.secret, &message("svc/haiku", "hi", 16))
            .await,
    ));
    let scoped = gw
        .new_key(
            1_000,
            &KeySpec::tier("pay_as_you_go").with_scopes(&["models"]),
        )
        .await;
    responses.push((
        "403 scope",
        gw.post_messages(&scoped.secret, &message("svc/haiku", "hi", 16))
            .await,
    ));

    let mut missing = Vec::new();
    for (what, resp) in &responses {
        match RateLimit::from_headers(&resp.headers) {
            Ok(rl) => {
                assert!(rl.remaining_requests <= rl.limit_requests, "{what}: {rl:?}");
                if resp.status != 429 {
                    assert!(
                        resp.header("retry-after").is_none(),
                        "{what}: Retry-After on a {}",
                        resp.status
                    );
                }
                assert!(
                    (1..=60).contains(&rl.reset_requests),
                    "{what}: Reset-Requests {rl:?}"
                );
            }
            Err(e) => missing.push(format!("{what}: {e} on {resp}")),
        }
    }
    assert!(
        missing.is_empty(),
        "responses without rate-limit headers:\n{}",
        missing.join("\n")
    );
    assert_eq!(responses[0].1.rate_limit().tier, "free");

    let payg = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let stream = gw
        .stream(
            "/v1/messages",
            &payg.secret,
            &message_stream("svc/haiku", "hi", 16),
        )
        .await;
    stream.expect_sse();
    assert_eq!(stream.rate_limit().tier, "pay_as_you_go");
    sse::assemble_message_stream(&stream.collect().await);
}

#[tokio::test]
async fn remaining_requests_counts_down_and_reset_is_within_the_minute() {
    let gw = Gateway::start().await;
    gw.wait_for_roomy_window(&gw.key, 5).await;
    let first = gw
        .count_tokens(&gw.key, &count_body("svc/haiku", "hi"))
        .await
        .rate_limit();
    assert_eq!(
        (first.tier.as_str(), first.limit_requests),
        ("pay_as_you_go", 60)
    );
    let mut previous = first.remaining_requests;
    for _ in 0..3 {
        let rl = gw
            .count_tokens(&gw.key, &count_body("svc/haiku", "hi"))
            .await
            .rate_limit();
        assert_eq!(rl.remaining_requests, previous - 1);
        assert!(
            (1..=60).contains(&rl.reset_requests),
            "Reset-Requests {}",
            rl.reset_requests
        );
        previous = rl.remaining_requests;
    }
}

#[tokio::test]
async fn free_key_gets_429_once_a_minute_of_input_tokens_reaches_20000() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    gw.wait_for_roomy_window(&gw.key, 8).await;
    let body = message("svc/haiku", &words(6_000), 16);
    let mut admitted = 0;
    let mut rejection = None;
    for _ in 0..5 {
        let resp = gw.post_messages(&gw.key, &body).await;
        if resp.status == 429 {
            rejection = Some(resp);
            break;
        }
        admitted += resp.expect_ok()["usage"]["input_tokens"]
            .as_u64()
            .expect("input_tokens");
    }
    let rejection = rejection.expect("a free key is held to 20,000 input tokens per minute");
    expect_rate_limited(&rejection, "input tokens");
    // Requests start while the minute has room (under 20,000 used), so the last one admitted
    // may take the minute past the cap; then nothing more starts this minute.
    assert!(
        (20_000..26_000).contains(&admitted),
        "admitted {admitted} input tokens before the 429"
    );
    let rl = rejection.rate_limit();
    assert_eq!(rl.limit_tokens, 20_000);
    assert_eq!(rl.remaining_tokens, 0, "{rl:?}");
}

/// A conversation longer than the key's whole TPM but inside the model's context window: it
/// starts while the minute has room, and the next request waits for the window's end.
async fn a_long_conversation_starts_then_the_next_request_waits(gw: &Gateway) {
    gw.wait_for_roomy_window(&gw.key, 20).await;
    // pay_as_you_go: 100,000 TPM; svc/sonnet: a 200,000-token context window.
    let long = message("svc/sonnet", &words(110_000), 16);
    let resp = gw.post_messages(&gw.key, &long).await;
    let input = resp.expect_ok()["usage"]["input_tokens"]
        .as_u64()
        .expect("input_tokens");
    assert!(input > 100_000, "input_tokens {input}");
    assert_eq!(resp.rate_limit().remaining_tokens, 0);
    let next = gw
        .post_messages(&gw.key, &message("svc/sonnet", "and now?", 16))
        .await;
    expect_rate_limited(&next, "input tokens");
    let retry_after = next.retry_after();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    let reset = next.rate_limit().reset_tokens;
    assert!(
        reset.abs_diff(retry_after) <= 1,
        "Reset-Tokens {reset}, Retry-After {retry_after}"
    );
}

#[tokio::test]
async fn a_conversation_past_the_keys_tpm_but_inside_the_context_window_is_admitted_in_process() {
    let gw = Gateway::start().await;
    a_long_conversation_starts_then_the_next_request_waits(&gw).await;
}

#[tokio::test]
async fn a_conversation_past_the_keys_tpm_but_inside_the_context_window_is_admitted_in_redis() {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder().serve(&redis.url()).start().await;
    a_long_conversation_starts_then_the_next_request_waits(&gw).await;
}

#[tokio::test]
async fn free_key_has_one_concurrent_stream() {
    let gw = Gateway::builder()
        .dev_top_up_usd("0")
        .chunk_delay_ms(150)
        .start()
        .await;
    gw.wait_for_roomy_window(&gw.key, 10).await;
    let body = message_stream("svc/haiku", &words(40), 256);
    let mut first = gw.stream("/v1/messages", &gw.key, &body).await;
    first.expect_sse();
    let mut seen = Vec::new();
    first.read_until("content_block_delta", &mut seen).await;

    let second = gw.stream("/v1/messages", &gw.key, &body).await;
    let second = second.into_resp().await;
    expect_rate_limited(&second, "concurrent streams");
    assert_eq!(second.rate_limit().remaining_streams, 0);
    assert_eq!(second.rate_limit().limit_streams, 1);

    // The limit is on streams only: a non-streaming call goes through meanwhile.
    gw.post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();

    let rest = first.collect().await;
    seen.extend(rest);
    sse::assemble_message_stream(&seen);

    let mut third = gw.stream("/v1/messages", &gw.key, &body).await;
    if third.status == 429 {
        // The slot is released when the first stream settles, right after its last event.
        tokio::time::sleep(Duration::from_millis(300)).await;
        third = gw.stream("/v1/messages", &gw.key, &body).await;
    }
    third.expect_sse();
    sse::assemble_message_stream(&third.collect().await);
}

#[tokio::test]
async fn four_stop_sequences_are_accepted() {
    let gw = Gateway::start().await;
    let mut body = message("svc/haiku", "hello", 64);
    body["stop_sequences"] = json!(["zzz1", "zzz2", "zzz3", "zzz4"]);
    gw.post_messages(&gw.key, &body).await.expect_ok();
}

#[tokio::test]
async fn max_tokens_equal_to_the_models_max_output_tokens_is_accepted() {
    let gw = Gateway::start().await;
    for (model, _, max_output) in MODEL_LIMITS {
        let resp = gw
            .post_messages(&gw.key, &message(model, "hello", max_output))
            .await;
        assert_eq!(resp.expect_ok()["model"], model);
    }
}

#[tokio::test]
async fn a_conversation_just_inside_the_context_window_is_accepted() {
    let gw = Gateway::start().await;
    // High volume: 500,000 input tokens per minute, so TPM does not interfere.
    let key = gw.new_key(10_000_000, &KeySpec::tier("high_volume")).await;
    let body = message("svc/kimi", &words(120_000), 16);
    let resp = gw.post_messages(&key.secret, &body).await;
    let input = resp.expect_ok()["usage"]["input_tokens"].as_u64().unwrap();
    assert!((100_000..131_072).contains(&input), "input_tokens {input}");
}

#[tokio::test]
async fn temperature_and_top_p_of_exactly_0_and_1_are_accepted() {
    let gw = Gateway::start().await;
    for value in [0.0, 1.0, 0.5] {
        let mut body = message("svc/haiku", "hello", 16);
        body["temperature"] = json!(value);
        gw.post_messages(&gw.key, &body).await.expect_ok();
        let mut body = message("svc/haiku", "hello", 16);
        body["top_p"] = json!(value);
        gw.post_messages(&gw.key, &body).await.expect_ok();
    }
}

#[tokio::test]
async fn a_body_of_exactly_16_mib_is_accepted() {
    let gw = Gateway::start().await;
    let head =
        br#"{"model":"svc/haiku","max_tokens":16,"messages":[{"role":"user","content":"hi"}]"#;
    let mut body = Vec::with_capacity(16 * MIB);
    body.extend_from_slice(head);
    body.resize(16 * MIB - 1, b' ');
    body.push(b'}');
    let rb = gw
        .request(Method::POST, "/v1/messages", Some(&gw.key))
        .header("content-type", "application/json")
        .body(body);
    gw.send(rb).await.expect_ok();
}
