//! The `vertex` upstream: Claude on Google Vertex AI, served through a route to the mock
//! upstream playing Vertex and Google's token endpoints (`crate::vertex` in the harness: its
//! token endpoint verifies the service account's RS256 JWT, its audience, scope and expiry,
//! and Vertex refuses a missing, unknown or expired bearer token with 401). The usage Vertex
//! reports is what the client sees and the ledger bills (naming `vertex`); the token is
//! fetched once and shared by the turns, concurrent ones included; a quota (429
//! `RESOURCE_EXHAUSTED`) or an overload (503) falls back to the next upstream; a refused key
//! or token is the gateway's own 502, never a 500, naming neither Vertex nor its error; with
//! no key file the token comes from the metadata server (GKE Workload Identity).

use e2e::sse::{assemble_chat_stream, assemble_message_stream};
use std::time::Duration;

use e2e::upstream::{Fault, Received};
use e2e::vertex::{assertion, key_file, ANTHROPIC_VERSION, MODEL_ID, PROJECT, REGION};
use e2e::*;
use serde_json::json;

/// Weight that makes an upstream the first choice in all but one draw in a million.
const FIRST: u32 = 1_000_000;

/// What every call the gateway makes to Vertex looks like: the streaming endpoint of the
/// route's project, region and model, a bearer token, the Messages body without `model`.
fn assert_vertex_call(request: &Received) {
    assert_eq!(
        request.path,
        format!(
            "/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/\
             {MODEL_ID}:streamRawPredict"
        )
    );
    let authorization = request.headers["authorization"]
        .to_str()
        .unwrap_or_default();
    assert!(
        authorization.starts_with("Bearer ya29.mock-"),
        "{authorization}"
    );
    assert_eq!(request.headers["accept"], "text/event-stream");
    assert_eq!(request.body["anthropic_version"], ANTHROPIC_VERSION);
    assert_eq!(request.body["stream"], true);
    assert!(request.body.get("model").is_none(), "{}", request.body);
}

#[tokio::test]
async fn both_endpoints_answer_through_a_vertex_route_in_json_and_streams_on_one_token_and_bill_vertexs_usage(
) {
    let pg = PostgresServer::start().await;
    let mock = MockUpstream::start().await;
    let url = pg.url();
    let turn_by_turn = |b: GatewayBuilder| b.database(&url).arg("--allotment-turns").arg("0");
    let cluster = Cluster::start_on(
        ManifestDir::cluster_routed(&[UpstreamDef::vertex(&mock)]),
        &[&turn_by_turn],
    )
    .await;
    let gw = &cluster.pods[0];
    let reply = "Paris is the capital of France.";
    let usages = [(41, 7), (42, 8), (43, 9), (44, 10)];
    mock.push(usages.iter().map(|&(input, output)| {
        Reply::text(reply).usage(MockUsage {
            input,
            output,
            ..MockUsage::default()
        })
    }));

    let json = gw
        .post_messages(&gw.key, &message("svc/sonnet", "Capital of France?", 100))
        .await
        .expect_ok();
    assert_eq!(response_text(&json), reply);
    assert_eq!(json["model"], "svc/sonnet");
    assert_eq!(
        (
            &json["usage"]["input_tokens"],
            &json["usage"]["output_tokens"]
        ),
        (&json!(41), &json!(7)),
        "{json}"
    );

    let stream = gw
        .stream(
            "/v1/messages",
            &gw.key,
            &message_stream("svc/sonnet", "Capital of France?", 100),
        )
        .await;
    stream.expect_sse();
    let stream = assemble_message_stream(&stream.collect().await);
    assert_eq!(stream.text(), reply);
    assert_eq!(stream.delta["stop_reason"], "end_turn");
    assert_eq!(stream.usage["output_tokens"], 8);

    let chat = gw
        .chat(
            &gw.key,
            &chat_body("svc/sonnet", "Capital of France?", Some(100)),
        )
        .await
        .expect_ok();
    assert_eq!(chat["choices"][0]["message"]["content"], reply);
    assert_eq!(chat["usage"]["prompt_tokens"], 43, "{chat}");

    let mut body = chat_stream_body("svc/sonnet", "Capital of France?", Some(100));
    body["stream_options"] = json!({"include_usage": true});
    let chunks = gw.stream("/v1/chat/completions", &gw.key, &body).await;
    chunks.expect_sse();
    let chunks = assemble_chat_stream(&chunks.collect().await);
    assert_eq!(chunks.content, reply);
    let usage = chunks.usage.as_ref().expect("the usage chunk");
    assert_eq!(usage["completion_tokens"], 10, "{usage}");

    let received = mock.received();
    assert_eq!(received.len(), 4, "one upstream call per turn");
    received.iter().for_each(assert_vertex_call);
    assert_eq!(mock.refused_count(), 0, "every token was accepted");
    assert_eq!(
        mock.token_grants(),
        (1, 0),
        "one token from the key file's token_uri served the four turns"
    );
    let tokens: std::collections::HashSet<_> = received
        .iter()
        .map(|r| r.headers["authorization"].clone())
        .collect();
    assert_eq!(tokens.len(), 1, "the same token each turn");

    poll_until(
        "every turn settled",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let open = pg
                .query_i64("SELECT count(*) FROM message_rows WHERE status = 'reserved'")
                .await;
            (open == 0).then_some(())
        },
    )
    .await;
    assert_eq!(
        pg.query(
            "SELECT string_agg(DISTINCT provider, ',') || ' ' || sum(input_tokens) || ' ' \
             || sum(output_tokens) FROM message_rows"
        )
        .await,
        "vertex 170 34"
    );
}

#[tokio::test]
async fn concurrent_first_turns_share_one_token_request() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::vertex(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let body = message("svc/haiku", "hello", 50);
    let turns = (0..8).map(|_| gw.post_messages(&gw.key, &body));
    for answer in futures::future::join_all(turns).await {
        answer.expect_ok();
    }
    assert_eq!(mock.request_count(), 8);
    assert_eq!(
        mock.token_grants(),
        (1, 0),
        "the waiting turns took the one fetched"
    );
}

#[tokio::test]
async fn a_token_is_replaced_once_its_reported_lifetime_is_nearly_over() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::vertex(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    // A token said to expire at once is never reused: each turn asks for another.
    mock.report_token_lifetime(0);
    for _ in 0..2 {
        gw.post_messages(&gw.key, &message("svc/haiku", "hello", 50))
            .await
            .expect_ok();
    }
    assert_eq!(mock.token_grants(), (2, 0));
    // One that lives an hour serves the next turns.
    mock.report_token_lifetime(3599);
    for _ in 0..3 {
        gw.post_messages(&gw.key, &message("svc/haiku", "hello", 50))
            .await
            .expect_ok();
    }
    assert_eq!(mock.token_grants(), (3, 0));
    let tokens: Vec<_> = mock
        .received()
        .iter()
        .map(|r| r.headers["authorization"].clone())
        .collect();
    assert_eq!(tokens.len(), 5);
    assert_ne!(tokens[0], tokens[1], "the short-lived token was replaced");
    assert!(
        tokens[2..].iter().all(|t| *t == tokens[2]),
        "the hour's token was kept"
    );
}

#[tokio::test]
async fn a_vertex_quota_or_overload_falls_back_to_the_next_upstream_and_is_a_529_when_none_is_left()
{
    // RESOURCE_EXHAUSTED (whose retry-after keeps Vertex out of the plans a while: a gateway
    // each), UNAVAILABLE, and an overloaded_error event before the first block.
    for throttle in [
        Reply::status(429),
        Reply::status(503),
        Reply::text("unused").fault(Fault::OverloadedAfter(0)),
    ] {
        let vertex = MockUpstream::start().await;
        let next = MockUpstream::start().await;
        let manifests = RoutedManifests::new(&[
            UpstreamDef::vertex(&vertex).named("vertex").weight(FIRST),
            UpstreamDef::anthropic(&next).named("next"),
        ]);
        let gw = Gateway::builder().manifests(&manifests.path).start().await;
        vertex.push([throttle.clone()]);
        next.push([Reply::text("from the next upstream")]);
        let answer = gw
            .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
            .await
            .expect_ok();
        assert_eq!(
            response_text(&answer),
            "from the next upstream",
            "{throttle:?}"
        );
        assert_eq!(
            vertex.request_count(),
            1,
            "Vertex was tried first: {throttle:?}"
        );
        assert_eq!(
            next.request_count(),
            1,
            "then the next upstream: {throttle:?}"
        );
        vertex.received().iter().for_each(assert_vertex_call);
    }

    for status in [429, 503] {
        let alone = MockUpstream::start().await;
        let manifests = RoutedManifests::new(&[UpstreamDef::vertex(&alone)]);
        let gw = Gateway::builder().manifests(&manifests.path).start().await;
        alone.push([Reply::status(status)]);
        let refused = gw
            .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
            .await;
        refused.expect_error(529, "overloaded_error");
        let text = refused.text.to_lowercase();
        for word in ["vertex", "google", "resource_exhausted", "unavailable"] {
            assert!(!text.contains(word), "the error names {word:?}: {text}");
        }
        assert_eq!(alone.request_count(), 1, "{status}");
    }
}

#[tokio::test]
async fn a_key_or_token_google_refuses_is_the_gateways_502_never_a_500_and_a_refused_token_is_replaced(
) {
    // A key file whose key is not the service account's: the token endpoint refuses the
    // JWT's signature, and Vertex is never called.
    let mock = MockUpstream::start().await;
    let wrong = key_file(&format!("{}/token", mock.url), true);
    let manifests =
        RoutedManifests::new(&[UpstreamDef::vertex(&mock).google_key_file(Some(wrong))]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    for stream in [false, true] {
        let mut body = message("svc/haiku", "hello", 50);
        body["stream"] = json!(stream);
        let refused = gw.post_messages(&gw.key, &body).await;
        refused.expect_error(502, "api_error");
        let text = refused.text.to_lowercase();
        for word in [
            "vertex",
            "google",
            "invalid_grant",
            "signature",
            "jwt",
            "oauth",
        ] {
            assert!(!text.contains(word), "the error names {word:?}: {text}");
        }
    }
    assert_eq!(mock.token_refusals(), 2, "the mock refused both signatures");
    assert_eq!(mock.token_grants(), (0, 0));
    assert_eq!(mock.request_count(), 0, "no call without a token");

    // A token Vertex stops taking (expired, revoked): that turn is a 502, the next one gets
    // a new token.
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::vertex(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    mock.push([Reply::text("first")]);
    gw.post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
        .expect_ok();
    mock.expire_tokens();
    let refused = gw
        .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await;
    refused.expect_error(502, "api_error");
    assert!(!refused.text.to_lowercase().contains("unauthenticated"));
    assert_eq!(mock.refused_count(), 1, "Vertex refused the expired token");
    mock.push([Reply::text("with a new token")]);
    let json = gw
        .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
        .await
        .expect_ok();
    assert_eq!(response_text(&json), "with a new token");
    assert_eq!(
        mock.token_grants(),
        (2, 0),
        "one token, then its replacement"
    );
}

#[tokio::test]
async fn with_no_key_file_the_token_comes_from_the_metadata_server() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::vertex(&mock).google_key_file(None)]);
    let host = mock.url.trim_start_matches("http://").to_owned();
    let gw = Gateway::builder()
        .manifests(&manifests.path)
        .env("GCE_METADATA_HOST", &host)
        .start()
        .await;
    for text in ["first from Workload Identity", "second"] {
        mock.push([Reply::text(text)]);
        let json = gw
            .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
            .await
            .expect_ok();
        assert_eq!(response_text(&json), text);
    }
    mock.received().iter().for_each(assert_vertex_call);
    assert_eq!(
        mock.token_grants(),
        (0, 1),
        "one metadata token for both turns"
    );
}

#[tokio::test]
async fn the_mocks_token_endpoint_refuses_an_expired_or_wrongly_signed_assertion() {
    let mock = MockUpstream::start().await;
    let token_uri = format!("{}/token", mock.url);
    let client = reqwest::Client::new();
    let ask = |jwt: String| {
        let client = client.clone();
        let token_uri = token_uri.clone();
        async move {
            let body = format!(
                "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={jwt}"
            );
            let response = client
                .post(&token_uri)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .expect("the mock answers");
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            (status, body)
        }
    };
    let (status, body) = ask(assertion(&token_uri, -10, false)).await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("invalid_grant")),
        "expired: {body}"
    );
    let (status, body) = ask(assertion(&token_uri, 3000, true)).await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("invalid_grant")),
        "wrong key: {body}"
    );
    let (status, body) = ask(assertion(
        "https://oauth2.googleapis.com/token",
        3000,
        false,
    ))
    .await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("invalid_grant")),
        "audience: {body}"
    );
    assert_eq!(mock.token_refusals(), 3);
    let (status, body) = ask(assertion(&token_uri, 3000, false)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["access_token"]
        .as_str()
        .is_some_and(|t| t.starts_with("ya29.")));
    assert_eq!(mock.token_grants(), (1, 0));
}
