//! Authentication and the headers and fields that SDKs (and Claude Code) send: Bearer and
//! x-api-key, anthropic-version / anthropic-beta, `?beta=true`, cache_control, metadata.

use e2e::*;
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn bearer_and_x_api_key_both_authenticate() {
    let gw = Gateway::start().await;
    let body = message("svc/haiku", "hello", 32);
    gw.post_messages(&gw.key, &body).await.expect_ok();

    let rb = gw
        .request(Method::POST, "/v1/messages", None)
        .header("x-api-key", &gw.key)
        .json(&body);
    let reply = gw.send(rb).await.expect_ok();
    assert_eq!(reply["model"], "svc/haiku");

    for path in ["/v1/models", "/v1/account", "/v1/usage"] {
        let rb = gw
            .request(Method::GET, path, None)
            .header("x-api-key", &gw.key);
        gw.send(rb).await.expect_ok();
    }
    let rb = gw
        .request(Method::POST, "/v1/chat/completions", None)
        .header("x-api-key", &gw.key)
        .json(&chat_body("svc/haiku", "hello", Some(32)));
    gw.send(rb).await.expect_ok();
}

#[tokio::test]
async fn an_invalid_x_api_key_is_401() {
    let gw = Gateway::start().await;
    let rb = gw
        .request(Method::GET, "/v1/models", None)
        .header("x-api-key", "sk-svc-not-a-real-key-000000000000000000");
    gw.send(rb).await.expect_error(401, "authentication_error");
}

#[tokio::test]
async fn anthropic_version_and_beta_headers_and_the_beta_query_are_accepted() {
    let gw = Gateway::start().await;
    let sdk_headers = |rb: reqwest::RequestBuilder| {
        rb.header("anthropic-version", "2023-06-01")
            .header(
                "anthropic-beta",
                "prompt-caching-2024-07-31,interleaved-thinking-2025-05-14",
            )
            .header("x-stainless-lang", "python")
    };
    let body = message("svc/haiku", "beta", 32);
    for path in ["/v1/messages?beta=true", "/v1/messages"] {
        let rb = sdk_headers(
            gw.request(Method::POST, path, None)
                .header("x-api-key", &gw.key),
        )
        .json(&body);
        assert_eq!(
            gw.send(rb).await.expect_ok()["model"],
            "svc/haiku",
            "{path}"
        );
    }
    let rb = sdk_headers(gw.request(
        Method::POST,
        "/v1/messages/count_tokens?beta=true",
        Some(&gw.key),
    ))
    .json(&count_body("svc/haiku", "beta"));
    gw.send(rb).await.expect_ok();
    let rb = sdk_headers(gw.request(Method::GET, "/v1/models?beta=true", Some(&gw.key)));
    gw.send(rb).await.expect_ok();

    let rb = sdk_headers(gw.request(Method::POST, "/v1/messages?beta=true", Some(&gw.key)))
        .json(&message_stream("svc/haiku", "beta", 32));
    let response = rb.send().await.expect("stream request");
    let stream = SseStream::new(response);
    stream.expect_sse();
    sse::assemble_message_stream(&stream.collect().await);
}

#[tokio::test]
async fn cache_control_on_blocks_and_metadata_are_accepted() {
    let gw = Gateway::start().await;
    let mut tool = weather_tool();
    tool["cache_control"] = json!({"type": "ephemeral"});
    let body = json!({
        "model": "svc/sonnet",
        "max_tokens": 64,
        "system": "You are terse.",
        "metadata": {"user_id": "user-1234"},
        "tools": [tool],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "first part", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "second part"}
            ]},
            {"role": "assistant", "content": [{"type": "text", "text": "noted"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral", "ttl": "5m"}}
            ]}
        ]
    });
    let reply = gw.post_messages(&gw.key, &body).await.expect_ok();
    assert!(response_text(&reply).ends_with("go on"), "{reply}");
    gw.count_tokens(
        &gw.key,
        &json!({"model": "svc/sonnet", "messages": body["messages"]}),
    )
    .await
    .expect_ok();
}

#[tokio::test]
async fn a_system_prompt_given_as_text_blocks_with_cache_control_is_accepted() {
    let gw = Gateway::start().await;
    let mut body = message("svc/haiku", "hello", 32);
    body["system"] = json!([
        {"type": "text", "text": "You are a helpful assistant.", "cache_control": {"type": "ephemeral"}}
    ]);
    gw.post_messages(&gw.key, &body).await.expect_ok();
}

#[tokio::test]
async fn the_seeded_enterprise_key_carries_its_custom_limits() {
    let gw = Gateway::start().await;
    let resp = gw.get("/v1/models", ENTERPRISE_KEY).await;
    resp.expect_ok();
    let rl = resp.rate_limit();
    assert_eq!(rl.tier, "enterprise");
    assert_eq!(
        (rl.limit_requests, rl.limit_tokens, rl.limit_streams),
        (120, 400_000, 8)
    );

    let account = gw.account(ENTERPRISE_KEY).await;
    assert_eq!(account["tier"], "enterprise");
    assert_eq!(
        account["limits"],
        json!({"requests_per_minute": 120, "input_tokens_per_minute": 400_000, "concurrent_streams": 8})
    );
    assert_eq!(account["credits"]["pool"], "apiCredits");
    assert_eq!(account["credits"]["balance"], 0);
    assert_eq!(account["key"]["id"], "key_example_enterprise");

    // example-corp holds no credits.
    let resp = gw
        .post_messages(ENTERPRISE_KEY, &message("svc/haiku", "hi", 16))
        .await;
    resp.expect_error(402, "insufficient_quota");
    assert_eq!(resp.rate_limit().limit_requests, 120);
}

#[tokio::test]
async fn the_account_endpoint_describes_the_calling_key() {
    let gw = Gateway::start().await;
    let key = gw
        .new_key(
            12_345,
            &KeySpec::tier("pay_as_you_go").with_scopes(&["account", "messages"]),
        )
        .await;
    let account = gw.account(&key.secret).await;
    assert_eq!(account["object"], "account");
    assert_eq!(account["id"], key.account_id.as_str());
    assert_eq!(account["status"], "active");
    assert_eq!(account["credits"]["pool"], "apiCredits");
    // The grant plus the $10 top-up that gave the key its tier.
    assert_eq!(account["credits"]["balance"], 12_345 + 1_000_000);
    assert_eq!(account["credits"]["reserved"], 0);
    assert_eq!(account["key"]["id"], key.id.as_str());
    assert_eq!(account["key"]["kind"], "api");
    assert_eq!(account["key"]["scopes"], json!(["account", "messages"]));
    let prefix = account["key"]["prefix"].as_str().expect("prefix");
    assert!(
        key.secret.starts_with(prefix) && prefix.len() < key.secret.len(),
        "prefix {prefix}"
    );
    assert!(
        !account.to_string().contains(&key.secret),
        "the secret is shown again: {account}"
    );
}
