//! The public router's rules, checked in process: the gateway's real API service on the stores and
//! the simulated provider that `standalone` runs with (`gateway::startup::in_process`), called
//! with `tower::ServiceExt::oneshot`, no socket. Envelopes, statuses and headers are the
//! router's own; what only a process shows (connections, timeouts, shutdown, two pods) stays
//! in the process-level suites (`errors.rs`, `limits.rs`, `slow_clients.rs`, ...).

use std::net::SocketAddr;

use axum::body::Body;
use axum::http::{header, Method, Request};
use clap::Parser;
use e2e::bodies::{chat_body, chat_stream_body, count_body, message, message_stream};
use e2e::gateway::DEV_KEY;
use e2e::mentions_seconds;
use e2e::response::{RateLimit, RequestLimit, Resp};
use e2e::sse::{assemble_chat_stream, assemble_message_stream, SseStream};
use gateway::client_address::Peer;
use gateway::flags::{Cli, Command};
use serde_json::{json, Value};
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/standalone");
const SIXTEEN_MIB: usize = 16 * 1024 * 1024;

/// The public listener's service, boxed to have a name.
type Router =
    BoxCloneSyncService<Request<Body>, axum::response::Response, std::convert::Infallible>;

/// The service `standalone` serves, its dev key at the tier its $10 top-up gives, with `args`
/// added to the command line.
async fn router(args: &[&str]) -> Router {
    let mut line = vec![
        "gateway",
        "standalone",
        "--manifests",
        MANIFESTS,
        "--dev-key",
        DEV_KEY,
        "--simulated-chunk-delay-ms",
        "0",
    ];
    line.extend_from_slice(args);
    let Command::Standalone(args) = Cli::try_parse_from(line).expect("flags").command else {
        unreachable!("parsed as standalone");
    };
    let state = gateway::startup::in_process(&args.common)
        .await
        .expect("the standalone state builds");
    BoxCloneSyncService::new(gateway::api::service(
        state,
        gateway::edge::body_reader::BodyDeadline::default(),
    ))
}

/// A request, with the dev key when `key` says so.
fn request(method: Method, path: &str, key: Option<&str>, body: Option<&Value>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let body = match body {
        Some(json) => {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
            Body::from(json.to_string())
        }
        None => Body::empty(),
    };
    builder.body(body).expect("a valid request")
}

fn get(path: &str) -> Request<Body> {
    request(Method::GET, path, Some(DEV_KEY), None)
}

fn post(path: &str, body: &Value) -> Request<Body> {
    request(Method::POST, path, Some(DEV_KEY), Some(body))
}

/// A request as it arrives from a client at `peer` (the server sets the connection's address).
fn from_peer(mut req: Request<Body>, peer: &str) -> Request<Body> {
    let addr: SocketAddr = peer.parse().expect("a socket address");
    req.extensions_mut().insert(Peer(addr));
    req
}

async fn body_of(router: &Router, req: Request<Body>) -> (u16, header::HeaderMap, Vec<u8>) {
    let response = router.clone().oneshot(req).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .expect("the body reads");
    (parts.status.as_u16(), parts.headers, bytes.to_vec())
}

/// The whole answer, checked for provider names as every e2e answer is.
async fn send(router: &Router, req: Request<Body>) -> Resp {
    let (status, headers, body) = body_of(router, req).await;
    Resp::checked(
        status,
        headers,
        String::from_utf8(body).expect("UTF-8 body"),
    )
}

async fn stream(router: &Router, req: Request<Body>) -> SseStream {
    let (status, headers, body) = body_of(router, req).await;
    SseStream::from_body(status, headers, body)
}

// ----- authentication -----

#[tokio::test]
async fn a_v1_request_without_a_key_is_401_authentication_error() {
    let router = router(&[]).await;
    send(
        &router,
        request(
            Method::POST,
            "/v1/messages",
            None,
            Some(&message("svc/haiku", "hi", 16)),
        ),
    )
    .await
    .expect_error(401, "authentication_error");
    for path in ["/v1/models", "/v1/account", "/v1/usage"] {
        send(&router, request(Method::GET, path, None, None))
            .await
            .expect_error(401, "authentication_error");
    }
}

#[tokio::test]
async fn a_malformed_authorization_header_is_401_and_never_echoes_the_key() {
    let router = router(&[]).await;
    for value in [
        "Basic dXNlcjpwYXNz".to_owned(),
        "Bearer".to_owned(),
        "Bearer   ".to_owned(),
        DEV_KEY.to_owned(),
        format!("Token {DEV_KEY}"),
        format!("Bearer {DEV_KEY} extra"),
    ] {
        let req = Request::get("/v1/models")
            .header(header::AUTHORIZATION, value)
            .body(Body::empty())
            .expect("a valid request");
        let message = send(&router, req)
            .await
            .expect_error(401, "authentication_error");
        assert!(
            !message.contains(DEV_KEY),
            "the 401 echoes the key: {message}"
        );
    }
}

#[tokio::test]
async fn an_unknown_key_is_401_and_the_x_api_key_header_authenticates_like_bearer() {
    let router = router(&[]).await;
    for key in [
        "sk-svc-0000000000000000000000000000000000000000",
        "nonsense",
        "sk-svc-",
    ] {
        send(&router, request(Method::GET, "/v1/models", Some(key), None))
            .await
            .expect_error(401, "authentication_error");
        let req = Request::get("/v1/models")
            .header("x-api-key", key)
            .body(Body::empty())
            .expect("a valid request");
        send(&router, req)
            .await
            .expect_error(401, "authentication_error");
    }
    let req = Request::get("/v1/models")
        .header("x-api-key", DEV_KEY)
        .body(Body::empty())
        .expect("a valid request");
    send(&router, req).await.expect_ok();
}

#[tokio::test]
async fn a_401_carries_the_client_addresses_rate_limit_headers() {
    let router = router(&[]).await;
    let req = from_peer(
        request(Method::GET, "/v1/models", None, None),
        "192.0.2.7:5000",
    );
    let resp = send(&router, req).await;
    resp.expect_error(401, "authentication_error");
    let limit = RequestLimit::from_headers(&resp.headers).expect("the address's headers");
    assert_eq!(limit.tier, "unauthenticated");
    assert_eq!(limit.remaining, limit.limit - 1, "{limit:?}");
}

#[tokio::test]
async fn an_address_past_its_unauthenticated_limit_is_429_for_wrong_keys_and_serves_a_valid_one() {
    let router = router(&["--unauthenticated-per-minute", "2"]).await;
    let peer = "192.0.2.8:5000";
    let unauthenticated = || from_peer(request(Method::GET, "/v1/models", None, None), peer);
    for _ in 0..2 {
        send(&router, unauthenticated())
            .await
            .expect_error(401, "authentication_error");
    }
    send(&router, unauthenticated())
        .await
        .expect_error(429, "rate_limit_error");
    let wrong_key = request(
        Method::GET,
        "/v1/models",
        Some("sk-svc-not-a-key-0000000000"),
        None,
    );
    let resp = send(&router, from_peer(wrong_key, peer)).await;
    resp.expect_error(429, "rate_limit_error");
    assert!(resp.header("retry-after").is_some(), "{resp}");
    // A valid key is served whatever its address's count: the address may be shared (an
    // ingress, a NAT) and one client's wrong keys must lock no other client out.
    send(&router, from_peer(get("/v1/models"), peer))
        .await
        .expect_ok();
    // Another address is not braked.
    send(&router, from_peer(get("/v1/models"), "192.0.2.9:5000"))
        .await
        .expect_ok();
}

// ----- paths and methods -----

#[tokio::test]
async fn an_unknown_v1_path_is_404_not_found_error_once_authenticated() {
    let router = router(&[]).await;
    for path in ["/v1/nope", "/v1/messages/nope", "/v1/completions"] {
        send(&router, get(path))
            .await
            .expect_error(404, "not_found_error");
        send(&router, request(Method::GET, path, None, None))
            .await
            .expect_error(401, "authentication_error");
    }
}

#[tokio::test]
async fn an_unknown_path_outside_v1_is_404_not_found_error() {
    let router = router(&[]).await;
    for path in ["/nope", "/v2/messages"] {
        send(&router, request(Method::GET, path, None, None))
            .await
            .expect_error(404, "not_found_error");
    }
}

#[tokio::test]
async fn a_wrong_method_is_405_in_the_envelope() {
    let router = router(&[]).await;
    for (method, path) in [
        (Method::GET, "/v1/messages"),
        (Method::GET, "/v1/chat/completions"),
        (Method::POST, "/v1/models"),
        (Method::DELETE, "/v1/messages"),
    ] {
        let body = (method == Method::POST).then(|| json!({}));
        send(&router, request(method, path, Some(DEV_KEY), body.as_ref()))
            .await
            .expect_error(405, "invalid_request_error");
    }
}

// ----- bodies -----

#[tokio::test]
async fn a_body_over_16_mib_is_413_request_too_large() {
    let router = router(&[]).await;
    for path in [
        "/v1/messages",
        "/v1/chat/completions",
        "/v1/messages/count_tokens",
        "/webhooks/payments",
    ] {
        let req = Request::post(path)
            .header(header::AUTHORIZATION, format!("Bearer {DEV_KEY}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(vec![b' '; SIXTEEN_MIB + 1]))
            .expect("a valid request");
        send(&router, req)
            .await
            .expect_error(413, "request_too_large");
    }
}

#[tokio::test]
async fn malformed_json_is_400_invalid_request_error() {
    let router = router(&[]).await;
    for raw in [
        "{",
        "{\"model\": }",
        "{\"model\": \"svc/haiku\",}",
        "not json",
        "",
        "[1, 2",
        "\u{0}",
    ] {
        let req = Request::post("/v1/messages")
            .header(header::AUTHORIZATION, format!("Bearer {DEV_KEY}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(raw))
            .expect("a valid request");
        send(&router, req)
            .await
            .expect_error(400, "invalid_request_error");
    }
}

#[tokio::test]
async fn a_body_without_a_json_content_type_is_400() {
    let router = router(&[]).await;
    let raw = message("svc/haiku", "hi", 16).to_string();
    for content_type in [Some("text/plain"), None] {
        let mut req = Request::post("/v1/messages")
            .header(header::AUTHORIZATION, format!("Bearer {DEV_KEY}"));
        if let Some(content_type) = content_type {
            req = req.header(header::CONTENT_TYPE, content_type);
        }
        let req = req.body(Body::from(raw.clone())).expect("a valid request");
        send(&router, req)
            .await
            .expect_error(400, "invalid_request_error");
    }
}

#[tokio::test]
async fn an_unknown_model_in_a_body_is_400_naming_model() {
    let router = router(&[]).await;
    let mut without_model = message("svc/haiku", "hi", 16);
    without_model
        .as_object_mut()
        .expect("an object")
        .remove("model");
    for (path, body) in [
        ("/v1/messages", message("svc/nope", "hi", 16)),
        ("/v1/messages", message("claude-3-haiku", "hi", 16)),
        ("/v1/messages", without_model),
        ("/v1/messages/count_tokens", count_body("svc/nope", "hi")),
        (
            "/v1/chat/completions",
            chat_body("svc/nope", "hi", Some(16)),
        ),
    ] {
        send(&router, post(path, &body))
            .await
            .expect_invalid(&["model"]);
    }
}

#[tokio::test]
async fn an_unknown_model_id_on_the_models_endpoint_is_404() {
    let router = router(&[]).await;
    for path in ["/v1/models/svc/nope", "/v1/models/nope"] {
        let message = send(&router, get(path))
            .await
            .expect_error(404, "not_found_error");
        assert!(message.contains("model"), "{message}");
    }
}

#[tokio::test]
async fn an_oversized_header_block_is_431_in_the_envelope() {
    let router = router(&[]).await;
    let req = Request::get("/v1/models")
        .header(header::AUTHORIZATION, format!("Bearer {DEV_KEY}"))
        .header("x-padding", "a".repeat(gateway::api::MAX_HEADER_BYTES))
        .body(Body::empty())
        .expect("a valid request");
    send(&router, req)
        .await
        .expect_error(431, "invalid_request_error");
}

// ----- headers -----

#[tokio::test]
async fn every_v1_answer_carries_the_api_version_header_errors_included() {
    let router = router(&[]).await;
    for req in [
        get("/v1/models"),
        get("/v1/nope"),
        request(Method::GET, "/v1/models", None, None),
        request(Method::GET, "/v1/messages", Some(DEV_KEY), None),
        post("/v1/messages", &message("svc/nope", "hi", 16)),
    ] {
        let what = format!("{} {}", req.method(), req.uri());
        let resp = send(&router, req).await;
        assert_eq!(
            resp.header("svc-api-version").as_deref(),
            Some(gateway::version::API_VERSION),
            "{what}: {resp}"
        );
    }
}

#[tokio::test]
async fn every_authenticated_v1_answer_carries_the_rate_limit_headers() {
    let router = router(&[]).await;
    for req in [
        get("/v1/models"),
        get("/v1/models/svc/opus"),
        get("/v1/account"),
        get("/v1/usage"),
        get("/v1/models/svc/nope"),
        get("/v1/nope"),
        get("/v1/messages"),
        post("/v1/messages", &message("svc/haiku", "hi", 16)),
        post("/v1/messages", &message("svc/nope", "hi", 16)),
        post("/v1/messages/count_tokens", &count_body("svc/haiku", "hi")),
        post(
            "/v1/chat/completions",
            &chat_body("svc/haiku", "hi", Some(16)),
        ),
    ] {
        let what = format!("{} {}", req.method(), req.uri());
        let resp = send(&router, req).await;
        let limits = RateLimit::from_headers(&resp.headers)
            .unwrap_or_else(|e| panic!("{what}: {e} on {resp}"));
        assert_eq!(limits.tier, "pay_as_you_go", "{what}");
        assert!(
            limits.remaining_requests <= limits.limit_requests,
            "{what}: {limits:?}"
        );
        assert!(resp.header("retry-after").is_none(), "{what}: {resp}");
    }
}

#[tokio::test]
async fn a_key_past_its_requests_per_minute_gets_429_with_retry_after_and_its_headers() {
    let router = router(&["--dev-top-up-usd", "0"]).await;
    let count = || post("/v1/messages/count_tokens", &count_body("svc/haiku", "hi"));
    for _ in 0..5 {
        send(&router, count()).await.expect_ok();
    }
    let resp = send(&router, count()).await;
    let message = resp.expect_error(429, "rate_limit_error");
    assert!(message.contains("requests per minute"), "{message}");
    assert!(mentions_seconds(&message), "names no delay: {message}");
    assert!((1..=60).contains(&resp.header_u64("retry-after")), "{resp}");
    let limits = resp.rate_limit();
    assert_eq!(
        (limits.tier.as_str(), limits.remaining_requests),
        ("free", 0)
    );
}

#[tokio::test]
async fn every_answer_carries_a_request_id_and_a_turns_is_its_message_id() {
    let router = router(&[]).await;
    for req in [
        get("/v1/models"),
        request(Method::GET, "/v1/models", None, None),
        request(Method::GET, "/nope", None, None),
    ] {
        let resp = send(&router, req).await;
        let id = resp.header("request-id").expect("a request-id");
        assert!(id.starts_with("req_"), "{id}");
    }
    let resp = send(
        &router,
        post("/v1/messages", &message("svc/haiku", "hi", 16)),
    )
    .await;
    let body = resp.expect_ok();
    assert_eq!(resp.header("request-id").as_deref(), body["id"].as_str());
    let resp = send(
        &router,
        post(
            "/v1/chat/completions",
            &chat_body("svc/haiku", "hi", Some(16)),
        ),
    )
    .await;
    let body = resp.expect_ok();
    assert_eq!(resp.header("request-id").as_deref(), body["id"].as_str());
}

// ----- answers -----

#[tokio::test]
async fn a_message_answers_with_the_requested_virtual_model_and_a_msg_id() {
    let router = router(&[]).await;
    let body = send(
        &router,
        post("/v1/messages", &message("svc/haiku", "hi", 16)),
    )
    .await
    .expect_ok();
    assert_eq!(body["type"], "message");
    assert_eq!(body["model"], "svc/haiku");
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert!(
        body["usage"]["credits_consumed"].as_u64().is_some(),
        "{body}"
    );
}

#[tokio::test]
async fn a_streamed_message_is_an_event_stream_in_the_messages_event_order() {
    let router = router(&[]).await;
    let stream = stream(
        &router,
        post("/v1/messages", &message_stream("svc/haiku", "hi", 16)),
    )
    .await;
    stream.expect_sse();
    assert_eq!(stream.rate_limit().tier, "pay_as_you_go");
    let events = stream.collect().await;
    let assembled = assemble_message_stream(&events);
    assert!(!assembled.text().is_empty());
}

#[tokio::test]
async fn a_streamed_chat_completion_is_an_event_stream_ending_with_done() {
    let router = router(&[]).await;
    let stream = stream(
        &router,
        post(
            "/v1/chat/completions",
            &chat_stream_body("svc/haiku", "hi", Some(16)),
        ),
    )
    .await;
    stream.expect_sse();
    let events = stream.collect().await;
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    assemble_chat_stream(&events);
}

#[tokio::test]
async fn count_tokens_answers_only_the_input_token_count() {
    let router = router(&[]).await;
    let body = send(
        &router,
        post(
            "/v1/messages/count_tokens",
            &count_body("svc/haiku", "hello there"),
        ),
    )
    .await
    .expect_ok();
    let fields: Vec<&String> = body.as_object().expect("an object").keys().collect();
    assert_eq!(fields, ["input_tokens"]);
    assert!(
        body["input_tokens"].as_u64().is_some_and(|n| n > 0),
        "{body}"
    );
}

#[tokio::test]
async fn the_models_listing_has_the_five_virtual_ids_with_their_limits() {
    let router = router(&[]).await;
    let body = send(&router, get("/v1/models")).await.expect_ok();
    let data = body["data"].as_array().expect("data");
    let ids: Vec<&str> = data.iter().filter_map(|m| m["id"].as_str()).collect();
    for id in [
        "svc/auto",
        "svc/opus",
        "svc/sonnet",
        "svc/kimi",
        "svc/haiku",
    ] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    for model in data {
        assert!(model["context_window"].as_u64().is_some(), "{model}");
        assert!(model["max_output_tokens"].as_u64().is_some(), "{model}");
    }
}

#[tokio::test]
async fn a_turn_the_balance_cannot_cover_is_402_insufficient_quota() {
    let router = router(&["--dev-top-up-usd", "0", "--dev-credits", "0"]).await;
    send(
        &router,
        post("/v1/messages", &message("svc/haiku", "hi", 16)),
    )
    .await
    .expect_error(402, "insufficient_quota");
}

#[tokio::test]
async fn a_malformed_usage_query_is_400_naming_the_parameter() {
    let router = router(&[]).await;
    for (query, fields) in [
        ("start_date=yesterday", &["start_date"][..]),
        ("end_date=2026-13-40", &["end_date"]),
        ("group_by=week", &["group_by"]),
        (
            "start_date=2026-05-09&end_date=2026-05-01",
            &["start_date", "end_date"],
        ),
    ] {
        send(&router, get(&format!("/v1/usage?{query}")))
            .await
            .expect_invalid(fields);
    }
}

// ----- outside /v1 -----

#[tokio::test]
async fn a_payment_webhook_without_a_valid_signature_is_401_in_the_envelope() {
    let router = router(&["--payment-webhook-secret", "whsec-router-test"]).await;
    let body = json!({ "type": "top_up.succeeded" });
    send(
        &router,
        request(Method::POST, "/webhooks/payments", None, Some(&body)),
    )
    .await
    .expect_error(401, "authentication_error");
}

#[tokio::test]
async fn a_signed_out_visitor_is_sent_to_sign_in_and_pages_forbid_framing_and_caching() {
    let router = router(&[]).await;
    let resp = send(
        &router,
        request(Method::GET, "/developers/keys", None, None),
    )
    .await;
    assert_eq!(resp.status, 303, "{resp}");
    assert_eq!(
        resp.header("location").as_deref(),
        Some("/developers/sign-in")
    );
    let resp = send(
        &router,
        request(Method::GET, "/developers/sign-in", None, None),
    )
    .await;
    resp.expect_status(200);
    let csp = resp.header("content-security-policy").unwrap_or_default();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(resp.header("cache-control").as_deref(), Some("no-store"));
}
