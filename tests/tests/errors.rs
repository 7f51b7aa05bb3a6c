//! The spec's Errors table through a running gateway: every status the gateway itself produces,
//! each in the envelope `{"type":"error","error":{"type","message"}}`, and every 400 naming the
//! offending field. The router's own rules (401 without a valid key, 404, 405, 413, malformed
//! JSON, the usage query, 429) are checked in process, in `router.rs`; what stays here needs the
//! process or the stores behind it (a chunked body, hyper's header limit, revocation, scopes,
//! suspension, validation).

use std::time::Duration;

use e2e::*;
use reqwest::Method;
use serde_json::{json, Value};

const MIB: usize = 1024 * 1024;

fn valid() -> Value {
    message("svc/haiku", "hello there", 64)
}

/// `valid()` with `field` set to `value` (or removed when `value` is None).
fn with(field: &str, value: Option<Value>) -> Value {
    let mut body = valid();
    match value {
        Some(value) => body[field] = value,
        None => {
            body.as_object_mut().unwrap().remove(field);
        }
    }
    body
}

/// Posts `body` and expects a 400 about the field at `path`.
async fn expect_400(gw: &Gateway, body: &Value, path: &str) -> String {
    let resp = gw.post_messages(&gw.key, body).await;
    resp.expect_invalid_field(path)
}

// ----- 400 invalid_request_error -----

#[tokio::test]
async fn max_tokens_missing_zero_or_negative_is_400_naming_max_tokens() {
    let gw = Gateway::start().await;
    expect_400(&gw, &with("max_tokens", None), "max_tokens").await;
    expect_400(&gw, &with("max_tokens", Some(json!(0))), "max_tokens").await;
    expect_400(&gw, &with("max_tokens", Some(json!(-5))), "max_tokens").await;
}

#[tokio::test]
async fn max_tokens_above_the_models_max_output_tokens_is_400() {
    let gw = Gateway::start().await;
    for (model, _, max_output) in MODEL_LIMITS {
        let body = message(model, "hello", max_output + 1);
        let msg = expect_400(&gw, &body, "max_tokens").await;
        assert!(!msg.is_empty());
    }
}

#[tokio::test]
async fn an_empty_messages_array_is_400_naming_messages() {
    let gw = Gateway::start().await;
    expect_400(&gw, &with("messages", Some(json!([]))), "messages").await;
    expect_400(&gw, &with("messages", None), "messages").await;
}

#[tokio::test]
async fn messages_that_do_not_alternate_are_400() {
    let gw = Gateway::start().await;
    let body = with(
        "messages",
        Some(json!([
            {"role": "user", "content": "one"},
            {"role": "user", "content": "two"}
        ])),
    );
    let message = expect_400(&gw, &body, "messages[1].role").await;
    assert!(message.contains("alternate"), "{message}");
    let body = with(
        "messages",
        Some(json!([
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "assistant", "content": "three"},
            {"role": "user", "content": "four"}
        ])),
    );
    let message = expect_400(&gw, &body, "messages[2].role").await;
    assert!(message.contains("alternate"), "{message}");
}

#[tokio::test]
async fn messages_must_start_and_end_with_a_user_turn() {
    let gw = Gateway::start().await;
    let ends_with_assistant = with(
        "messages",
        Some(json!([
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"}
        ])),
    );
    let message = expect_400(&gw, &ends_with_assistant, "messages").await;
    assert!(message.contains("`user`"), "{message}");
    let only_assistant = with(
        "messages",
        Some(json!([{"role": "assistant", "content": "hi"}])),
    );
    let message = expect_400(&gw, &only_assistant, "messages[0].role").await;
    assert!(message.contains("`user`"), "{message}");
}

#[tokio::test]
async fn a_message_role_other_than_user_or_assistant_is_400() {
    let gw = Gateway::start().await;
    for role in ["tool", "bot", ""] {
        let body = with("messages", Some(json!([{"role": role, "content": "hi"}])));
        expect_400(&gw, &body, "messages[0].role").await;
    }
    // A system message is folded into `system` (as Claude Code sends them), leaving none.
    let body = with(
        "messages",
        Some(json!([{"role": "system", "content": "hi"}])),
    );
    expect_400(&gw, &body, "messages").await;
    let body = with("messages", Some(json!([{"content": "no role"}])));
    expect_400(&gw, &body, "messages[0].role").await;
}

#[tokio::test]
async fn more_than_four_stop_sequences_is_400_naming_stop_sequences() {
    let gw = Gateway::start().await;
    let body = with("stop_sequences", Some(json!(["a", "b", "c", "d", "e"])));
    expect_400(&gw, &body, "stop_sequences").await;
}

#[tokio::test]
async fn temperature_and_top_p_outside_zero_to_one_are_400() {
    let gw = Gateway::start().await;
    for value in [json!(1.01), json!(-0.1), json!(2), json!(100)] {
        expect_400(
            &gw,
            &with("temperature", Some(value.clone())),
            "temperature",
        )
        .await;
        expect_400(&gw, &with("top_p", Some(value)), "top_p").await;
    }
}

#[tokio::test]
async fn thinking_on_a_model_without_thinking_is_accepted_and_left_out_of_the_turn() {
    let gw = Gateway::start().await;
    for model in ["svc/sonnet", "svc/haiku", "svc/kimi", "svc/auto"] {
        for thinking in [
            json!({"type": "enabled", "budget_tokens": 1024}),
            json!({"type": "enabled", "budget_tokens": 100_000}),
            json!({"type": "adaptive"}),
        ] {
            let mut body = message(model, "think about it", 4096);
            body["thinking"] = thinking.clone();
            let reply = gw.post_messages(&gw.key, &body).await.expect_ok();
            let kinds: Vec<&Value> = reply["content"]
                .as_array()
                .map(|c| c.iter().map(|b| &b["type"]).collect())
                .unwrap_or_default();
            assert_eq!(kinds, [&json!("text")], "{model} {thinking}: {reply}");
        }
    }
}

#[tokio::test]
async fn thinking_on_opus_keeps_its_rules() {
    let gw = Gateway::start().await;
    for (thinking, max_tokens) in [
        (json!({"type": "enabled", "budget_tokens": 1000}), 4096),
        (json!({"type": "enabled", "budget_tokens": 4096}), 4096),
    ] {
        let mut body = message("svc/opus", "think about it", max_tokens);
        body["thinking"] = thinking;
        expect_400(&gw, &body, "thinking.budget_tokens").await;
    }
}

#[tokio::test]
async fn max_tokens_above_a_models_limit_says_what_to_do_and_names_claude_codes_setting_to_claude_code(
) {
    let gw = Gateway::start().await;
    let body = message("svc/haiku", "hello", 32_000);
    let message = expect_400(&gw, &body, "max_tokens").await;
    assert!(message.contains("lower max_tokens to 8192"), "{message}");
    assert!(!message.contains("CLAUDE_CODE"), "{message}");
    let mut claude_code = body;
    claude_code["system"] = json!([{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}]);
    let message = expect_400(&gw, &claude_code, "max_tokens").await;
    assert!(
        message.contains("CLAUDE_CODE_MAX_OUTPUT_TOKENS=8192"),
        "{message}"
    );
}

#[tokio::test]
async fn input_past_the_models_context_window_is_400() {
    let gw = Gateway::start().await;
    // svc/kimi has a context window of 131,072 tokens; this is ~140,000.
    let body = message("svc/kimi", &words(140_000), 16);
    let message = expect_400(&gw, &body, "messages").await;
    assert!(message.contains("context window"), "{message}");
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_400() {
    let gw = Gateway::start().await;
    for body in [
        json!([]),
        json!("text"),
        json!(42),
        json!(null),
        json!(true),
    ] {
        gw.post_messages(&gw.key, &body)
            .await
            .expect_error(400, "invalid_request_error");
    }
}

#[tokio::test]
async fn wrong_json_types_are_400_naming_the_field() {
    let gw = Gateway::start().await;
    let cases = [
        ("model", json!(5)),
        ("max_tokens", json!("ten")),
        ("max_tokens", json!(10.5)),
        ("messages", json!("hello")),
        ("messages", json!({"role": "user"})),
        ("system", json!(12)),
        ("temperature", json!("hot")),
        ("top_p", json!([0.5])),
        ("stop_sequences", json!("STOP")),
        ("stop_sequences", json!([1, 2])),
        ("stream", json!("yes")),
        ("tools", json!("get_weather")),
        ("metadata", json!("user-1")),
    ];
    for (field, value) in cases {
        expect_400(&gw, &with(field, Some(value)), field).await;
    }
    let bad_content = with("messages", Some(json!([{"role": "user", "content": 42}])));
    expect_400(&gw, &bad_content, "messages[0].content").await;
}

#[tokio::test]
async fn count_tokens_and_chat_completions_validate_too() {
    let gw = Gateway::start().await;
    gw.count_tokens(&gw.key, &count_body("svc/nope", "hi"))
        .await
        .expect_invalid_field("model");
    gw.count_tokens(&gw.key, &json!({"model": "svc/haiku"}))
        .await
        .expect_invalid_field("messages");
    gw.chat(&gw.key, &chat_body("svc/nope", "hi", Some(16)))
        .await
        .expect_invalid_field("model");
    gw.chat(&gw.key, &json!({"model": "svc/haiku", "messages": "hi"}))
        .await
        .expect_invalid_field("messages");
    gw.chat(&gw.key, &chat_body("svc/haiku", "hi", Some(8193)))
        .await
        .expect_invalid(&["max_tokens"]);
}

// ----- 401 authentication_error -----

#[tokio::test]
async fn a_revoked_key_is_401_within_seconds() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.get("/v1/models", &key.secret).await.expect_ok();
    gw.revoke(&key.id).await;
    poll_until(
        "the revoked key to be refused",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (gw.get("/v1/models", &key.secret).await.status == 401).then_some(()) },
    )
    .await;
    gw.post_messages(&key.secret, &valid())
        .await
        .expect_error(401, "authentication_error");
}

// ----- 402 insufficient_quota -----

#[tokio::test]
async fn an_account_short_of_credits_gets_402_insufficient_quota() {
    let gw = Gateway::start().await;
    for credits in [0, 1] {
        // Free: a paid tier's top-up would fund the account.
        let key = gw.new_key(credits, &KeySpec::tier("free")).await;
        gw.post_messages(&key.secret, &valid())
            .await
            .expect_error(402, "insufficient_quota");
        gw.chat(&key.secret, &chat_body("svc/haiku", "hi", Some(64)))
            .await
            .expect_error(402, "insufficient_quota");
    }
}

// ----- 403 permission_error -----

#[tokio::test]
async fn a_cli_key_on_v1_is_403_permission_error() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::cli()).await;
    gw.post_messages(&key.secret, &valid())
        .await
        .expect_error(403, "permission_error");
    gw.get("/v1/models", &key.secret)
        .await
        .expect_error(403, "permission_error");
}

#[tokio::test]
async fn a_suspended_account_is_403_permission_error() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    gw.post_messages(&key.secret, &valid()).await.expect_ok();
    gw.suspend(&key.account_id).await;
    poll_until(
        "the suspension to apply",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (gw.get("/v1/models", &key.secret).await.status == 403).then_some(()) },
    )
    .await;
    gw.post_messages(&key.secret, &valid())
        .await
        .expect_error(403, "permission_error");
    gw.resume(&key.account_id).await;
    poll_until(
        "the resumption to apply",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (gw.get("/v1/models", &key.secret).await.status == 200).then_some(()) },
    )
    .await;
    gw.post_messages(&key.secret, &valid()).await.expect_ok();
}

#[tokio::test]
async fn a_key_scoped_to_chat_is_403_on_messages_but_allowed_on_chat() {
    let gw = Gateway::start().await;
    let key = gw
        .new_key(
            1_000_000,
            &KeySpec::tier("pay_as_you_go").with_scopes(&["chat"]),
        )
        .await;
    gw.post_messages(&key.secret, &valid())
        .await
        .expect_error(403, "permission_error");
    gw.count_tokens(&key.secret, &count_body("svc/haiku", "hi"))
        .await
        .expect_error(403, "permission_error");
    gw.chat(&key.secret, &chat_body("svc/haiku", "hi", Some(16)))
        .await
        .expect_ok();
}

// ----- 413 request_too_large -----

/// A valid `/v1/messages` body padded with JSON whitespace to exactly `len` bytes.
fn padded_body(len: usize) -> Vec<u8> {
    let head =
        br#"{"model":"svc/haiku","max_tokens":16,"messages":[{"role":"user","content":"hi"}]"#;
    let mut body = Vec::with_capacity(len);
    body.extend_from_slice(head);
    body.resize(len - 1, b' ');
    body.push(b'}');
    body
}

#[tokio::test]
async fn a_chunked_body_over_16_mib_without_content_length_is_413() {
    let gw = Gateway::start().await;
    let body = padded_body(16 * MIB + 1);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(256 * 1024).map(|c| Ok(c.to_vec())).collect();
    let rb = gw
        .request(Method::POST, "/v1/messages", Some(&gw.key))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)));
    gw.send(rb).await.expect_error(413, "request_too_large");
}

// ----- 431 -----

#[tokio::test]
async fn an_oversized_header_block_is_431_in_the_error_envelope() {
    let gw = Gateway::start().await;
    let rb = gw
        .request(Method::GET, "/v1/models", Some(&gw.key))
        .header("x-padding", "a".repeat(100 * 1024));
    let refused = gw.send(rb).await;
    let message = refused.expect_error(431, "invalid_request_error");
    assert!(message.contains("header"), "{message}");
    // The key's rate-limit headers, as on every `/v1` answer.
    assert_eq!(refused.rate_limit().tier, "pay_as_you_go");
    // The dashboard's forms are held to the same bound.
    let rb = gw
        .request(Method::GET, "/developers/sign-in", None)
        .header("x-padding", "a".repeat(100 * 1024));
    assert_eq!(gw.send(rb).await.status, 431);
    // A large but ordinary header block is still served.
    let rb = gw
        .request(Method::GET, "/v1/models", Some(&gw.key))
        .header("cookie", "a".repeat(16 * 1024));
    gw.send(rb).await.expect_ok();
}
