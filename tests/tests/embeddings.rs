//! `POST /v1/embeddings`: the official `openai` Python SDK embeds through the gateway, as
//! floats and as base64 (its default), one input and a list of 100, on the simulated
//! `svc/embed` and routed to the mock upstream as `openai` and as `azure-openai`; each call's
//! ledger row bills its input tokens (the upstream's count where it reports one) at the
//! route's input price, output 0, and the balance drops by exactly that; a failed upstream
//! bills nothing and a throttled one falls back; a key without credits gets 402 before any
//! upstream call; RPM and TPM hold; a malformed body gets 400, never 500; an embeddings route
//! refuses the chat surfaces and a chat route refuses embeddings.

use std::collections::BTreeSet;

use e2e::gateway::workspace_root;
use e2e::upstream::{
    MockUpstream, Reply, RoutedManifests, UpstreamDef, AZURE_API_VERSION,
    MOCK_EMBEDDING_TOKENS_PER_INPUT, UPSTREAM_API_KEY, UPSTREAM_MODEL,
};
use e2e::*;
use serde_json::{json, Value};

const EMBED: &str = "svc/embed";

/// Runs the `openai` SDK: for each call of `calls` (`[encoding or null, dimensions or null,
/// input]`), `client.embeddings.create` with its raw response; returns, per call, the
/// `request-id` header (the ledger row's id), the model, the usage and the vectors (decoded
/// from base64 where it was asked for by name: the SDK decodes only its own default).
async fn sdk_embeddings(gw: &Gateway, key: &str, calls: &Value) -> Vec<Value> {
    let python = workspace_root().join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test creates the venv with the openai SDK",
        python.display()
    );
    let script = r#"
import base64, json, struct, sys, openai

def floats(embedding):
    # Asked for base64 by name, the SDK hands the text over as is: little-endian float32s.
    if isinstance(embedding, str):
        raw = base64.b64decode(embedding)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return list(embedding)

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)
out = []
for encoding, dimensions, text in json.loads(sys.argv[3]):
    extra = {}
    if encoding is not None:
        extra["encoding_format"] = encoding
    if dimensions is not None:
        extra["dimensions"] = dimensions
    raw = client.embeddings.with_raw_response.create(model="svc/embed", input=text, **extra)
    answer = raw.parse()
    out.append({
        "request_id": raw.headers.get("request-id"),
        "model": answer.model,
        "object": answer.object,
        "usage": answer.usage.model_dump(),
        "indexes": [d.index for d in answer.data],
        "vectors": [floats(d.embedding) for d in answer.data],
        "base64": [isinstance(d.embedding, str) for d in answer.data],
    })
print(json.dumps(out))
"#;
    let out = tokio::process::Command::new(python)
        .args(["-c", script, &gw.url(""), key, &calls.to_string()])
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .await
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "the SDK failed: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            gw.logs()
        )
    });
    parsed.as_array().cloned().expect("a list of answers")
}

/// The three calls every route is asked: one input as floats, the same input in the SDK's
/// default encoding (base64, which it decodes), and a list of 100 inputs.
fn three_calls(dimensions: u64) -> Value {
    let hundred: Vec<String> = (0..100).map(|i| format!("document number {i}")).collect();
    json!([
        ["float", dimensions, "The quick brown fox"],
        [null, dimensions, "The quick brown fox"],
        ["base64", dimensions, hundred],
    ])
}

/// The vectors as the f32s they are (a float's JSON text and its base64 bytes are the same
/// f32, not the same f64).
fn vectors(answer: &Value) -> Vec<Vec<f32>> {
    answer["vectors"]
        .as_array()
        .expect("vectors")
        .iter()
        .map(|v| {
            v.as_array()
                .expect("a vector")
                .iter()
                .map(|x| x.as_f64().expect("a number") as f32)
                .collect()
        })
        .collect()
}

/// Every answer's row: an `embeddings` row of the key's, completed, billed its prompt tokens
/// (output 0) by `provider`; returns the credits billed in all.
async fn assert_rows_bill_the_input(gw: &Gateway, answers: &[Value], provider: &str) -> u64 {
    let mut billed = 0;
    for answer in answers {
        let id = answer["request_id"].as_str().expect("a request-id");
        let row = gw.message_record(id).await;
        assert_eq!(row["endpoint"], "embeddings", "{row}");
        assert_eq!(row["status"], "completed", "{row}");
        assert_eq!(row["model"], EMBED, "{row}");
        assert_eq!(row["provider"], provider, "{row}");
        assert_eq!(
            row["usage"]["input_tokens"], answer["usage"]["prompt_tokens"],
            "{row}"
        );
        assert_eq!(row["usage"]["output_tokens"], 0, "{row}");
        assert_eq!(row["stop_reason"], Value::Null, "{row}");
        let credits = row["billed"].as_u64().expect("billed");
        assert!(credits > 0, "an embeddings call is billed: {row}");
        billed += credits;
    }
    billed
}

async fn assert_usage_reports(gw: &Gateway, key: &str, answers: &[Value]) {
    let tokens: u64 = answers
        .iter()
        .map(|a| a["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens"))
        .sum();
    let report = gw.get("/v1/usage", key).await.expect_ok();
    let totals = &report["totals"];
    assert_eq!(totals["requests"], answers.len(), "{report}");
    assert_eq!(totals["input_tokens"], tokens, "{report}");
    assert_eq!(totals["output_tokens"], 0, "{report}");
    let models: BTreeSet<&str> = report["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|row| row["model"].as_str())
        .collect();
    assert_eq!(models, BTreeSet::from([EMBED]), "{report}");
}

#[tokio::test]
async fn the_openai_sdk_embeds_floats_base64_and_100_inputs_on_the_simulated_route_billed_per_input_token(
) {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let before = gw.balance(&key.secret).await;
    let answers = sdk_embeddings(&gw, &key.secret, &three_calls(64)).await;
    assert_eq!(answers.len(), 3);
    for answer in &answers {
        assert_eq!(answer["model"], EMBED, "{answer}");
        assert_eq!(answer["object"], "list", "{answer}");
        let usage = &answer["usage"];
        assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{usage}");
        assert_eq!(usage["prompt_tokens"], usage["total_tokens"], "{usage}");
        for v in vectors(answer) {
            assert_eq!(v.len(), 64, "the asked dimensions");
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-3, "a unit vector: {norm}");
        }
    }
    // The same text gets the same vector, whichever encoding carried it.
    assert_eq!(vectors(&answers[0]), vectors(&answers[1]));
    assert_eq!(answers[0]["base64"], json!([false]));
    assert!(answers[2]["base64"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b == true));
    let hundred = &answers[2];
    assert_eq!(hundred["indexes"], json!((0..100).collect::<Vec<_>>()));
    let distinct: BTreeSet<String> = vectors(hundred).iter().map(|v| format!("{v:?}")).collect();
    assert_eq!(distinct.len(), 100, "one vector per input");

    let billed = assert_rows_bill_the_input(&gw, &answers, "simulated").await;
    gw.wait_settled(&key.account_id).await;
    assert_eq!(
        before - gw.balance(&key.secret).await,
        billed as i64,
        "the balance drops by exactly what the rows billed"
    );
    assert_usage_reports(&gw, &key.secret, &answers).await;
}

/// The openai SDK through a gateway whose svc/embed is routed to the mock as `provider`.
async fn embeds_through_the_mock(upstream: fn(&MockUpstream) -> UpstreamDef, provider: &str) {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[upstream(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let before = gw.balance(&key.secret).await;
    let answers = sdk_embeddings(&gw, &key.secret, &three_calls(6)).await;
    for (answer, inputs) in answers.iter().zip([1u64, 1, 100]) {
        assert_eq!(answer["model"], EMBED, "{answer}");
        assert_eq!(
            answer["usage"]["prompt_tokens"],
            MOCK_EMBEDDING_TOKENS_PER_INPUT * inputs,
            "the upstream's count, not the gateway's: {answer}"
        );
        // The mock's vectors: each input's index and length, alternating.
        for (index, v) in vectors(answer).iter().enumerate() {
            assert_eq!(v.len(), 6);
            assert_eq!(v[0], index as f32, "{answer}");
        }
    }
    assert_eq!(vectors(&answers[0]), vectors(&answers[1]));
    assert_eq!(
        vectors(&answers[0])[0][1],
        "The quick brown fox".len() as f32
    );

    let received = mock.received();
    assert_eq!(received.len(), 3, "one upstream call per request");
    for request in &received {
        match provider {
            "azure-openai" => {
                assert_eq!(
                    request.path,
                    format!("/openai/deployments/{UPSTREAM_MODEL}/embeddings")
                );
                assert_eq!(request.query, format!("api-version={AZURE_API_VERSION}"));
                assert_eq!(request.headers["api-key"], UPSTREAM_API_KEY);
            }
            _ => {
                assert_eq!(request.path, "/v1/embeddings");
                assert_eq!(
                    request.headers["authorization"],
                    format!("Bearer {UPSTREAM_API_KEY}")
                );
            }
        }
        assert_eq!(request.body["model"], UPSTREAM_MODEL);
        assert_eq!(request.body["encoding_format"], "float");
        assert_eq!(request.body["dimensions"], 6);
    }
    assert_eq!(received[2].body["input"].as_array().unwrap().len(), 100);

    let billed = assert_rows_bill_the_input(&gw, &answers, provider).await;
    gw.wait_settled(&key.account_id).await;
    assert_eq!(before - gw.balance(&key.secret).await, billed as i64);
    assert_usage_reports(&gw, &key.secret, &answers).await;
}

#[tokio::test]
async fn the_openai_sdk_embeds_through_an_openai_upstream_billed_its_prompt_tokens() {
    embeds_through_the_mock(UpstreamDef::openai, "openai").await;
}

#[tokio::test]
async fn the_openai_sdk_embeds_through_an_azure_openai_upstream_billed_its_prompt_tokens() {
    embeds_through_the_mock(UpstreamDef::azure, "azure-openai").await;
}

fn embed_body(input: Value) -> Value {
    json!({"model": EMBED, "input": input})
}

#[tokio::test]
async fn a_throttled_upstream_falls_back_and_a_failed_call_bills_nothing() {
    let first = MockUpstream::start().await;
    let second = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[
        UpstreamDef::openai(&first).named("first").weight(1_000_000),
        UpstreamDef::openai(&second).named("second"),
    ]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;

    first.push([Reply::status(429)]);
    let resp = gw
        .post_json(
            "/v1/embeddings",
            &key.secret,
            &embed_body(json!("fall back")),
        )
        .await;
    let body = resp.expect_ok();
    assert_eq!(
        body["usage"]["prompt_tokens"],
        MOCK_EMBEDDING_TOKENS_PER_INPUT
    );
    assert_eq!(first.request_count(), 1, "the first upstream was tried");
    assert_eq!(second.request_count(), 1, "and the second served it");
    let id = resp.header("request-id").expect("request-id");
    let row = gw.message_record(&id).await;
    assert_eq!(row["upstream"], "second", "{row}");

    // Both fail (or the first is out of the plan while its 429 holds): nothing billed.
    let before = gw.balance(&key.secret).await;
    first.push([Reply::status(500)]);
    second.push([Reply::status(500)]);
    let resp = gw
        .post_json("/v1/embeddings", &key.secret, &embed_body(json!("no luck")))
        .await;
    assert!(resp.status >= 500, "an upstream failure: {resp}");
    let id = resp.header("request-id").expect("request-id");
    let row = gw.message_record(&id).await;
    assert_eq!(row["status"], "failed", "{row}");
    assert_eq!(row["billed"], 0, "{row}");
    gw.wait_settled(&key.account_id).await;
    assert_eq!(gw.balance(&key.secret).await, before);
}

#[tokio::test]
async fn a_key_without_credits_gets_402_and_no_upstream_is_called() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::openai(&mock)]);
    let gw = Gateway::builder().manifests(&manifests.path).start().await;
    let broke = gw.new_key(0, &KeySpec::api()).await;
    gw.post_json("/v1/embeddings", &broke.secret, &embed_body(json!("hi")))
        .await
        .expect_error(402, "insufficient_quota");
    assert_eq!(mock.request_count(), 0, "refused before any upstream call");
    // The route works for a key with credits, so the 402 was the balance's.
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    gw.post_json("/v1/embeddings", &key.secret, &embed_body(json!("hi")))
        .await
        .expect_ok();
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn embeddings_count_against_the_keys_requests_per_minute() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    gw.wait_for_roomy_window(&gw.key, 5).await;
    for i in 1..=5u64 {
        let resp = gw
            .post_json("/v1/embeddings", &gw.key, &embed_body(json!(["a", "b"])))
            .await;
        resp.expect_ok();
        assert_eq!(resp.rate_limit().remaining_requests, 5 - i);
    }
    gw.post_json("/v1/embeddings", &gw.key, &embed_body(json!("a")))
        .await
        .expect_rate_limited("requests per minute");
}

#[tokio::test]
async fn embeddings_input_tokens_count_against_the_keys_tokens_per_minute() {
    let gw = Gateway::builder().dev_top_up_usd("0").start().await;
    gw.wait_for_roomy_window(&gw.key, 8).await;
    // Two inputs of about 3,000 tokens each: under the 8,192 one input may have.
    let body = embed_body(json!([words(3_000), words(3_000)]));
    let mut admitted = 0;
    let mut rejection = None;
    for _ in 0..5 {
        let resp = gw.post_json("/v1/embeddings", &gw.key, &body).await;
        if resp.status == 429 {
            rejection = Some(resp);
            break;
        }
        admitted += resp.expect_ok()["usage"]["prompt_tokens"]
            .as_u64()
            .expect("prompt_tokens");
    }
    let rejection = rejection.expect("a free key is held to 20,000 input tokens per minute");
    rejection.expect_rate_limited("input tokens");
    assert!(
        (20_000..28_000).contains(&admitted),
        "admitted {admitted} input tokens before the 429"
    );
}

#[tokio::test]
async fn a_malformed_embeddings_request_gets_400_naming_its_field_never_500() {
    let gw = Gateway::start().await;
    let cases = [
        (json!({"input": "a"}), "model"),
        (json!({"model": EMBED}), "input"),
        (embed_body(json!(5)), "input"),
        (embed_body(json!([])), "input"),
        (embed_body(json!(["a", ""])), "input[1]"),
        (embed_body(json!([1, 2, 3])), "input"),
        (embed_body(json!([[1, 2], [3]])), "input"),
        (embed_body(json!(["a", 1])), "input"),
        (embed_body(json!(vec!["a"; 2049])), "input"),
        (embed_body(json!(words(9_000))), "input[0]"),
        (
            json!({"model": EMBED, "input": "a", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (
            json!({"model": EMBED, "input": "a", "dimensions": 0}),
            "dimensions",
        ),
        (
            json!({"model": EMBED, "input": "a", "dimensions": -3}),
            "dimensions",
        ),
        (
            json!({"model": EMBED, "input": "a", "user": "u".repeat(300)}),
            "user",
        ),
        (json!({"model": "svc/nope", "input": "a"}), "model"),
    ];
    for (body, field) in cases {
        let resp = gw.post_json("/v1/embeddings", &gw.key, &body).await;
        let message = resp.expect_invalid_field(field);
        assert!(!message.is_empty(), "{body}");
    }
    let not_json = gw
        .send(
            gw.request(reqwest::Method::POST, "/v1/embeddings", Some(&gw.key))
                .header("content-type", "application/json")
                .body("{\"model\": "),
        )
        .await;
    not_json.expect_error(400, "invalid_request_error");
}

#[tokio::test]
async fn an_embeddings_route_refuses_the_chat_surfaces_and_a_chat_route_refuses_embeddings() {
    let gw = Gateway::start().await;
    gw.post_messages(&gw.key, &message(EMBED, "hi", 16))
        .await
        .expect_invalid_field("model");
    gw.chat(&gw.key, &chat_body(EMBED, "hi", Some(16)))
        .await
        .expect_invalid_field("model");
    gw.post_json(
        "/v1/responses",
        &gw.key,
        &json!({"model": EMBED, "input": "hi"}),
    )
    .await
    .expect_invalid_field("model");
    let refused = gw
        .post_json(
            "/v1/embeddings",
            &gw.key,
            &json!({"model": "svc/opus", "input": "hi"}),
        )
        .await
        .expect_invalid_field("model");
    assert!(refused.contains("does not serve embeddings"), "{refused}");
    // The listing shows which model serves embeddings.
    let embed = gw.get("/v1/models/svc/embed", &gw.key).await.expect_ok();
    assert_eq!(embed["capabilities"]["embeddings"], true, "{embed}");
}
