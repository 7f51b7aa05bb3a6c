//! Cleartext HTTP/2 to an upstream (`http2: true` on a ModelRoute upstream): turns through
//! either adapter reach the upstream over HTTP/2, JSON and streamed; and more streams than one
//! HTTP/2 connection carries are all served at once, the gateway opening another connection
//! rather than queueing past the server's stream cap.

use std::time::Duration;

use axum::http::Version;
use e2e::upstream::MAX_HTTP2_STREAMS;
use e2e::*;
use futures::future::join_all;

/// A gateway routing every model to `upstream`, with the dev key allowed `streams` at once.
async fn gateway(upstream: UpstreamDef, streams: usize) -> (Gateway, RoutedManifests) {
    let manifests = RoutedManifests::new(&[upstream]);
    let grant = format!(
        "apiVersion: gateway.svc.dev/v1alpha1
kind: ApiKey
metadata:
  name: dev-many-streams
spec:
  keyId: key_dev
  tier: enterprise
  limits:
    requestsPerMinute: 100000
    inputTokensPerMinute: 100000000
    concurrentStreams: {streams}
"
    );
    std::fs::write(manifests.path.join("dev-grant.yaml"), grant).expect("write the grant");
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    (gw, manifests)
}

#[tokio::test]
async fn turns_reach_a_cleartext_http2_upstream_through_both_adapters() {
    for route in [UpstreamDef::anthropic, UpstreamDef::openai] {
        let mock = MockUpstream::start().await;
        let (gw, _manifests) = gateway(route(&mock).http2(), 5).await;
        mock.push([Reply::text("over h2"), Reply::text("streamed over h2")]);

        let answer = gw
            .post_messages(&gw.key, &message("svc/haiku", "hello", 50))
            .await
            .expect_ok();
        assert_eq!(response_text(&answer), "over h2");
        let events = gw
            .stream(
                "/v1/messages",
                &gw.key,
                &message_stream("svc/haiku", "hello", 50),
            )
            .await
            .collect()
            .await;
        assert_eq!(
            sse::assemble_message_stream(&events).text(),
            "streamed over h2"
        );

        let versions: Vec<Version> = mock.received().iter().map(|r| r.version).collect();
        assert_eq!(versions, [Version::HTTP_2, Version::HTTP_2]);
    }
}

#[tokio::test]
async fn more_streams_than_one_http2_connection_carries_are_served_at_once() {
    let streams = MAX_HTTP2_STREAMS as usize + 50;
    let mock = MockUpstream::start().await;
    let (gw, _manifests) = gateway(UpstreamDef::anthropic(&mock).http2(), streams).await;
    // Each lasts seconds: the streams overlap unless some wait for others to end.
    let slow = Reply::text("one two three four five six").chunk_delay(Duration::from_millis(400));
    mock.push(std::iter::repeat_n(slow, streams));

    let body = message_stream("svc/haiku", "hello", 50);
    let answers = join_all((0..streams).map(|_| async {
        let events = gw
            .stream("/v1/messages", &gw.key, &body)
            .await
            .collect()
            .await;
        sse::assemble_message_stream(&events).text()
    }))
    .await;

    assert!(answers
        .iter()
        .all(|text| text == "one two three four five six"));
    assert_eq!(
        mock.peak_open_streams(),
        streams,
        "streams waited for others past one connection's cap of {MAX_HTTP2_STREAMS}"
    );
}
