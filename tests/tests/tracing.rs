//! Tracing: with the standard `OTEL_*` variables pointing at an OTLP/HTTP receiver (http/json,
//! started here on loopback), every request is one span named by its route and keyed by the
//! message id the client got (`gen_ai.response.id`, also the `request-id` header), carrying
//! the key id, tier, virtual model, admission result, reserved and billed credits and the
//! upstream, with child spans for admission, reservation, the upstream call and settle; it
//! continues the caller's W3C trace; no span, and no JSON log line, holds a key or any text of
//! the prompt or the completion.

use e2e::otlp::Span;
use e2e::sse::assemble_message_stream;
use e2e::*;
use serde_json::Value;

const PROMPT: &str = "Describe the ultramarine heron nesting on quartz cliffs";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";

async fn traced_gateway(receiver: &OtlpReceiver) -> Gateway {
    Gateway::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("OTEL_SERVICE_NAME", "gateway-under-test")
        .arg("--log-format")
        .arg("json")
        .env("RUST_LOG", "debug")
        .start()
        .await
}

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")
}

/// Checks the request span of one message and its children; returns the request span.
async fn check_message_trace(
    receiver: &OtlpReceiver,
    gw: &Gateway,
    key: &ApiKey,
    message_id: &str,
    usage: &Value,
    stream: bool,
) -> Span {
    let span = receiver
        .wait_for(&format!("the span of {message_id}"), |s| {
            s.attr("gen_ai.response.id")
                .as_ref()
                .and_then(Value::as_str)
                == Some(message_id)
                && s.attr("svc.credits.billed").is_some()
        })
        .await;
    assert_eq!(span.name, "POST /v1/messages", "{}", span.raw);
    assert_eq!(
        span.trace_id, TRACE_ID,
        "the caller's trace goes on: {}",
        span.raw
    );
    assert_eq!(span.parent_span_id, PARENT_SPAN_ID, "{}", span.raw);
    assert_eq!(span.str_attr("svc.message_id"), message_id);
    assert_eq!(span.str_attr("gen_ai.operation.name"), "chat");
    assert_eq!(span.str_attr("gen_ai.request.model"), "svc/sonnet");
    assert_eq!(span.str_attr("svc.key_id"), key.id);
    assert_eq!(span.str_attr("svc.tier"), "pay_as_you_go");
    assert_eq!(span.str_attr("svc.admission"), "admitted");
    assert_eq!(span.attr("svc.stream"), Some(Value::Bool(stream)));
    assert_eq!(span.int_attr("http.response.status_code"), 200);
    let record = gw.message_record(message_id).await;
    assert_eq!(
        span.str_attr("svc.upstream"),
        record["upstream"].as_str().unwrap()
    );
    assert_eq!(
        span.int_attr("svc.credits.reserved"),
        record["reserved"].as_i64().unwrap()
    );
    assert_eq!(
        span.int_attr("svc.credits.billed"),
        usage["credits_consumed"].as_i64().unwrap()
    );
    assert_eq!(
        span.int_attr("gen_ai.usage.input_tokens"),
        usage["input_tokens"].as_i64().unwrap()
    );
    assert_eq!(
        span.int_attr("gen_ai.usage.output_tokens"),
        usage["output_tokens"].as_i64().unwrap()
    );
    assert_eq!(
        span.attr("gen_ai.response.finish_reasons"),
        Some(serde_json::json!([record["stop_reason"].as_str().unwrap()]))
    );

    let children = receiver.children(&span);
    let mut names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["admission", "reservation", "settle", "upstream call"],
        "{children:#?}"
    );
    let upstream = children.iter().find(|c| c.name == "upstream call").unwrap();
    assert!(upstream.int_attr("svc.upstream.time_to_first_token_ms") >= 0);
    span
}

fn assert_no_secret_or_text(receiver: &OtlpReceiver, key: &ApiKey, completion: &str) {
    for body in receiver.raw() {
        assert!(!body.contains(&key.secret), "a key in the export: {body}");
        assert!(
            !body.contains("ultramarine"),
            "prompt text in the export: {body}"
        );
        assert!(
            !body.contains(completion),
            "completion text in the export: {body}"
        );
    }
}

#[tokio::test]
async fn a_message_is_one_span_keyed_by_its_id_with_steps_as_children() {
    let receiver = OtlpReceiver::start().await;
    let gw = traced_gateway(&receiver).await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let resp = gw
        .send(
            gw.request(reqwest::Method::POST, "/v1/messages", Some(&key.secret))
                .header("traceparent", traceparent())
                .json(&message("svc/sonnet", PROMPT, 64)),
        )
        .await;
    let body = resp.expect_ok();
    let id = body["id"].as_str().unwrap();
    assert_eq!(resp.header("request-id").as_deref(), Some(id));
    check_message_trace(&receiver, &gw, &key, id, &body["usage"], false).await;
    assert_no_secret_or_text(&receiver, &key, &response_text(&body));
}

#[tokio::test]
async fn a_streamed_message_is_one_span_that_ends_with_the_stream() {
    let receiver = OtlpReceiver::start().await;
    let gw = traced_gateway(&receiver).await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let rb = gw
        .request(reqwest::Method::POST, "/v1/messages", Some(&key.secret))
        .header("traceparent", traceparent())
        .json(&message_stream("svc/sonnet", PROMPT, 64));
    let response = rb.send().await.expect("stream request");
    let request_id = response
        .headers()
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let stream = assemble_message_stream(&SseStream::new(response).collect().await);
    assert_eq!(request_id.as_deref(), Some(stream.id()));
    let usage = {
        let mut usage = stream.usage.clone();
        usage["input_tokens"] = stream.message["usage"]["input_tokens"].clone();
        usage
    };
    check_message_trace(&receiver, &gw, &key, stream.id(), &usage, true).await;
    assert_no_secret_or_text(&receiver, &key, &stream.text());
}

#[tokio::test]
async fn an_answer_without_a_message_has_a_req_id_found_in_its_span() {
    let receiver = OtlpReceiver::start().await;
    let gw = traced_gateway(&receiver).await;
    let resp = gw.get("/v1/models", &gw.key).await;
    resp.expect_ok();
    let id = resp.header("request-id").expect("request-id header");
    assert!(id.starts_with("req_"), "{id}");
    let span = receiver
        .wait_for("the span of the models call", |s| {
            s.attr("svc.request_id").as_ref().and_then(Value::as_str) == Some(id.as_str())
        })
        .await;
    assert_eq!(span.name, "GET /v1/models");
    assert_eq!(span.str_attr("svc.key_id"), "key_dev");
}

#[tokio::test]
async fn json_logs_are_one_object_a_line_without_keys_or_text() {
    let receiver = OtlpReceiver::start().await;
    let gw = traced_gateway(&receiver).await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let body = gw
        .post_messages(&key.secret, &message("svc/sonnet", PROMPT, 64))
        .await
        .expect_ok();
    gw.post_messages(&key.secret, &message("svc/nope", PROMPT, 64))
        .await
        .expect_status(400);
    gw.get(
        "/v1/models",
        "sk-svc-0123456789012345678901234567890123456789",
    )
    .await
    .expect_status(401);
    let completion = response_text(&body);
    let logs = gw.stderr();
    assert!(!logs.trim().is_empty());
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let entry: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(
            entry["level"].is_string() && entry["fields"].is_object(),
            "{line}"
        );
        assert!(!line.contains(&key.secret), "a key in the logs: {line}");
        assert!(
            !line.contains("0123456789012345678901234567890123456789"),
            "{line}"
        );
        assert!(
            !line.contains("ultramarine"),
            "prompt text in the logs: {line}"
        );
        assert!(
            !line.contains(&completion),
            "completion text in the logs: {line}"
        );
    }
}
