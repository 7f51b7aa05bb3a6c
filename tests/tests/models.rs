//! Models: the listing and single-model records, and the rule that every response names the
//! virtual model id requested, never an upstream provider (checked by the harness on every
//! response; swept here over every endpoint and model).

use std::collections::BTreeSet;

use e2e::sse::{assemble_chat_stream, assemble_message_stream};
use e2e::*;
use serde_json::{json, Value};

/// A 1x1 PNG.
const TINY_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// The spec's five virtual chat models, and `svc/embed`, which serves `/v1/embeddings` only
/// and says so in its capabilities (it generates nothing: no max_output_tokens).
#[tokio::test]
async fn the_listing_has_the_five_virtual_ids_with_context_window_and_max_output_tokens_and_svc_embed(
) {
    let gw = Gateway::start().await;
    let list = gw.get("/v1/models", &gw.key).await.expect_ok();
    assert_eq!(list["object"], "list");
    assert_eq!(list["has_more"], false);
    let data = list["data"].as_array().expect("data array");
    let ids: BTreeSet<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    let expected: BTreeSet<&str> = MODELS.into_iter().chain(["svc/embed"]).collect();
    assert_eq!(ids, expected, "{list}");
    assert_eq!(data.len(), 6);
    assert_eq!(list["first_id"], data[0]["id"]);
    assert_eq!(list["last_id"], data[5]["id"]);
    for model in data {
        assert_eq!(model["object"], "model", "{model}");
        assert_eq!(model["type"], "model", "{model}");
        for field in ["display_name", "owned_by"] {
            assert!(model[field].is_string(), "{field} missing: {model}");
        }
        assert!(model["created"].is_i64(), "created: {model}");
        assert!(model["created_at"].is_string(), "created_at: {model}");
        assert!(model["capabilities"].is_object(), "capabilities: {model}");
        let context = model["context_window"].as_u64().expect("context_window");
        let max_output = model["max_output_tokens"]
            .as_u64()
            .expect("max_output_tokens");
        if model["id"] == "svc/embed" {
            assert_eq!(model["capabilities"]["embeddings"], true, "{model}");
            assert_eq!((context, max_output), (8192, 0), "{model}");
            continue;
        }
        assert!(model["capabilities"].get("embeddings").is_none(), "{model}");
        assert!(max_output > 0 && max_output < context, "{model}");
    }
    for (id, context, max_output) in MODEL_LIMITS {
        let model = data.iter().find(|m| m["id"] == id).unwrap();
        assert_eq!(model["context_window"], context, "{id}");
        assert_eq!(model["max_output_tokens"], max_output, "{id}");
    }
}

#[tokio::test]
async fn each_model_is_served_at_its_slashed_id_as_in_the_listing() {
    let gw = Gateway::start().await;
    let list = gw.get("/v1/models", &gw.key).await.expect_ok();
    for listed in list["data"].as_array().unwrap() {
        let id = listed["id"].as_str().unwrap();
        let one = gw
            .get(&format!("/v1/models/{id}"), &gw.key)
            .await
            .expect_ok();
        assert_eq!(&one, listed, "GET /v1/models/{id}");
    }
    let opus = gw.get("/v1/models/svc/opus", &gw.key).await.expect_ok();
    assert_eq!(opus["context_window"], 200_000);
    assert_eq!(opus["max_output_tokens"], 32_000);
    assert_eq!(opus["capabilities"]["thinking"], true, "{opus}");
    let kimi = gw.get("/v1/models/svc/kimi", &gw.key).await.expect_ok();
    assert_eq!(kimi["capabilities"]["vision"], false, "{kimi}");
}

#[tokio::test]
async fn every_response_carries_the_requested_virtual_model_id() {
    let gw = Gateway::start().await;
    for model in MODELS {
        let reply = gw
            .post_messages(&gw.key, &message(model, "which model", 64))
            .await
            .expect_ok();
        assert_eq!(reply["model"], model);
        assert!(response_text(&reply).ends_with("You said: which model"));

        let stream = gw
            .stream(
                "/v1/messages",
                &gw.key,
                &message_stream(model, "which model", 64),
            )
            .await;
        let stream = assemble_message_stream(&stream.collect().await);
        assert_eq!(stream.message["model"], model);

        let chat = gw
            .chat(&gw.key, &chat_body(model, "which model", Some(64)))
            .await
            .expect_ok();
        assert_eq!(chat["model"], model);

        let stream = gw
            .stream(
                "/v1/chat/completions",
                &gw.key,
                &chat_stream_body(model, "which model", Some(64)),
            )
            .await;
        let chat = assemble_chat_stream(&stream.collect().await);
        assert!(chat.chunks.iter().all(|c| c["model"] == model), "{model}");
    }
}

#[tokio::test]
async fn support_traces_a_message_id_to_its_provider_which_clients_never_see() {
    let gw = Gateway::start().await;
    let concrete = ["svc/opus", "svc/sonnet", "svc/kimi", "svc/haiku"];
    for model in MODELS {
        let reply = gw
            .post_messages(&gw.key, &message(model, "trace me", 64))
            .await
            .expect_ok();
        let row = gw.message_record(reply["id"].as_str().unwrap()).await;
        assert_eq!(row["model"], model, "{row}");
        assert!(
            row["endpoint"]
                .as_str()
                .is_some_and(|e| e.ends_with("messages")),
            "{row}"
        );
        assert_eq!(row["stream"], false, "{row}");
        for field in [
            "provider",
            "upstream",
            "upstream_model",
            "status",
            "key_id",
            "account_id",
        ] {
            assert!(
                row[field].as_str().is_some_and(|v| !v.is_empty()),
                "{field} missing: {row}"
            );
        }
        let served = row["served_model"].as_str().expect("served_model");
        assert!(concrete.contains(&served), "served_model {served}: {row}");
        if model != "svc/auto" {
            assert_eq!(served, model);
        }
        assert_eq!(
            row["usage"]["output_tokens"], reply["usage"]["output_tokens"],
            "{row}"
        );
    }
}

#[tokio::test]
async fn no_response_on_any_endpoint_names_an_upstream_provider() {
    // The harness checks every body, SSE payload and header value; this walks every surface,
    // including errors, so that check sees all of them.
    let gw = Gateway::start().await;
    let key = gw.key.clone();
    for path in [
        "/v1/models",
        "/v1/models/svc/auto",
        "/v1/account",
        "/v1/usage",
        "/v1/usage?group_by=model",
    ] {
        gw.get(path, &key).await.expect_ok();
    }
    let mut bodies: Vec<Value> = vec![
        message("svc/auto", "x", 16),
        message("svc/nope", "x", 16),
        message("svc/haiku", "x", 100_000),
        json!({"model": "svc/haiku"}),
    ];
    let mut thinking = message("svc/sonnet", "x", 4_096);
    thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    bodies.push(thinking);
    for body in &bodies {
        let replies = [
            gw.post_messages(&key, body).await,
            gw.chat(&key, body).await,
            gw.count_tokens(&key, body).await,
        ];
        for resp in replies {
            assert!(resp.status < 500, "{resp}");
        }
    }
    gw.get("/v1/models/svc/nope", &key).await.expect_status(404);
    gw.post_messages("sk-svc-unknown", &bodies[0])
        .await
        .expect_status(401);
    let broke = gw.new_key(0, &KeySpec::tier("free")).await;
    gw.post_messages(&broke.secret, &bodies[0])
        .await
        .expect_status(402);
    let usage = gw
        .get("/v1/usage?group_by=day,model", &key)
        .await
        .expect_ok();
    assert_eq!(usage["object"], "usage", "{usage}");
}

fn image_message(model: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": TINY_PNG}},
            {"type": "text", "text": "describe the picture"}
        ]}]
    })
}

#[tokio::test]
async fn images_are_accepted_by_vision_models_and_refused_by_kimi() {
    let gw = Gateway::start().await;
    for model in ["svc/opus", "svc/sonnet", "svc/haiku", "svc/auto"] {
        let reply = gw
            .post_messages(&gw.key, &image_message(model))
            .await
            .expect_ok();
        assert_eq!(reply["model"], model);
    }
    gw.post_messages(&gw.key, &image_message("svc/kimi"))
        .await
        .expect_invalid(&["image", "vision", "svc/kimi"]);
}

#[tokio::test]
async fn usage_reports_the_turns_by_model_with_their_credits() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let mut total = 0;
    for model in ["svc/haiku", "svc/haiku", "svc/opus"] {
        total += credits_of(
            &gw.post_messages(&key.secret, &message(model, "count me", 32))
                .await
                .expect_ok(),
        );
    }
    let usage = gw
        .get("/v1/usage?group_by=model", &key.secret)
        .await
        .expect_ok();
    assert_eq!(usage["group_by"], json!(["model"]), "{usage}");
    assert_eq!(usage["totals"]["requests"], 3, "{usage}");
    assert_eq!(usage["totals"]["credits"], total, "{usage}");
    let rows = usage["data"].as_array().expect("data");
    let haiku = rows
        .iter()
        .find(|r| r["model"] == "svc/haiku")
        .expect("svc/haiku row");
    assert_eq!(haiku["requests"], 2, "{usage}");
    let opus = rows
        .iter()
        .find(|r| r["model"] == "svc/opus")
        .expect("svc/opus row");
    assert_eq!(opus["requests"], 1, "{usage}");
}

#[tokio::test]
async fn usage_defaults_to_the_last_30_days_by_day_and_model() {
    let gw = Gateway::start().await;
    gw.post_messages(&gw.key, &message("svc/haiku", "today", 16))
        .await
        .expect_ok();
    let usage = gw.get("/v1/usage", &gw.key).await.expect_ok();
    assert_eq!(usage["group_by"], json!(["day", "model"]), "{usage}");
    let start = usage["start_date"].as_str().expect("start_date");
    let end = usage["end_date"].as_str().expect("end_date");
    assert!(
        start < end && start.len() == 10 && end.len() == 10,
        "{usage}"
    );
    let rows = usage["data"].as_array().expect("data");
    assert_eq!(rows.len(), 1, "{usage}");
    assert_eq!(rows[0]["model"], "svc/haiku");
    assert_eq!(rows[0]["date"].as_str(), Some(end), "today's row: {usage}");
    assert_eq!(rows[0]["requests"], 1);
    let one_day = gw
        .get(
            &format!("/v1/usage?start_date={end}&end_date={end}&group_by=day"),
            &gw.key,
        )
        .await
        .expect_ok();
    assert_eq!(one_day["totals"]["requests"], 1, "{one_day}");
    assert!(
        one_day["data"][0].get("model").is_none_or(|m| m.is_null()),
        "{one_day}"
    );
}
