//! Credit arithmetic: every turn reports `credits_consumed`, the apiCredits balance drops by
//! exactly what responses report, billing never exceeds the reservation, rejected requests
//! are free, the balance never goes below zero under concurrency, top-ups are idempotent.

use std::collections::HashSet;

use e2e::*;
use futures::future::join_all;
use serde_json::{json, Value};

const USAGE_FIELDS: [&str; 5] = [
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "credits_consumed",
];

/// Checks the ledger row of a settled turn: billed equals what the response reported, never
/// more than reserved; the model is the virtual id.
async fn check_ledger(gw: &Gateway, id: &str, credits: u64, model: &str) -> Value {
    let row = gw.message_record(id).await;
    assert_eq!(row["id"], id, "{row}");
    assert_eq!(
        row["billed"].as_u64(),
        Some(credits),
        "ledger billed vs response credits_consumed: {row}"
    );
    let reserved = row["reserved"].as_u64().expect("reserved");
    assert!(
        credits <= reserved,
        "billed {credits} > reserved {reserved}: {row}"
    );
    assert_eq!(row["model"], model, "{row}");
    row
}

#[tokio::test]
async fn every_turn_reports_credits_consumed_in_its_usage() {
    let gw = Gateway::start().await;
    let key = gw.key.clone();

    let body = gw
        .post_messages(&key, &message("svc/haiku", "hello", 32))
        .await
        .expect_ok();
    for field in USAGE_FIELDS {
        assert!(
            body["usage"][field].is_u64(),
            "usage.{field} missing: {body}"
        );
    }
    assert!(credits_of(&body) > 0);

    let stream = gw
        .stream(
            "/v1/messages",
            &key,
            &message_stream("svc/haiku", "hello", 32),
        )
        .await;
    let stream = sse::assemble_message_stream(&stream.collect().await);
    assert!(
        stream.usage["output_tokens"].is_u64(),
        "message_delta usage: {}",
        stream.usage
    );
    assert!(stream.credits() > 0);

    let chat = gw
        .chat(&key, &chat_body("svc/haiku", "hello", Some(32)))
        .await
        .expect_ok();
    let usage = &chat["usage"];
    for field in [
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "credits_consumed",
    ] {
        assert!(usage[field].is_u64(), "chat usage.{field} missing: {chat}");
    }
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );

    let stream = gw
        .stream(
            "/v1/chat/completions",
            &key,
            &chat_stream_body("svc/haiku", "hello", Some(32)),
        )
        .await;
    let chat = sse::assemble_chat_stream(&stream.collect().await);
    let usage = chat.usage.expect("include_usage gives a usage chunk");
    assert!(
        usage["credits_consumed"].as_u64().is_some_and(|c| c > 0),
        "chat stream usage: {usage}"
    );
}

#[tokio::test]
async fn the_balance_drops_by_exactly_the_credits_consumed_across_json_stream_and_chat() {
    let gw = Gateway::start().await;
    let key = gw.new_key(5_000_000, &KeySpec::tier("enterprise")).await;
    let before = gw.balance(&key.secret).await;
    assert_eq!(before, 5_000_000);
    let mut charged = Vec::new();

    for model in ["svc/haiku", "svc/opus"] {
        let body = gw
            .post_messages(&key.secret, &message(model, "a json turn", 64))
            .await
            .expect_ok();
        charged.push((
            body["id"].as_str().unwrap().to_string(),
            credits_of(&body),
            model,
        ));
    }
    let stream = gw
        .stream(
            "/v1/messages",
            &key.secret,
            &message_stream("svc/sonnet", "a streamed turn", 64),
        )
        .await;
    let stream = sse::assemble_message_stream(&stream.collect().await);
    charged.push((stream.id().to_string(), stream.credits(), "svc/sonnet"));

    let chat = gw
        .chat(&key.secret, &chat_body("svc/kimi", "a chat turn", Some(64)))
        .await
        .expect_ok();
    charged.push((
        chat["id"].as_str().unwrap().to_string(),
        credits_of(&chat),
        "svc/kimi",
    ));

    let stream = gw
        .stream(
            "/v1/chat/completions",
            &key.secret,
            &chat_stream_body("svc/haiku", "a chat stream", Some(64)),
        )
        .await;
    let chat = sse::assemble_chat_stream(&stream.collect().await);
    let credits = chat
        .usage
        .as_ref()
        .and_then(|u| u["credits_consumed"].as_u64())
        .expect("credits");
    charged.push((chat.id.clone(), credits, "svc/haiku"));

    // count_tokens is free.
    gw.count_tokens(&key.secret, &count_body("svc/opus", "free"))
        .await
        .expect_ok();

    gw.wait_settled(&key.account_id).await;
    let after = gw.balance(&key.secret).await;
    let total: u64 = charged.iter().map(|c| c.1).sum();
    assert_eq!(
        (before - after) as u64,
        total,
        "balance drop vs sum of credits_consumed {charged:?}"
    );
    for (id, credits, model) in &charged {
        check_ledger(&gw, id, *credits, model).await;
    }
}

/// (model, input, output, cache-write) prices in micro-dollars per million tokens, as in
/// deploy/standalone/models.yaml (the manifests the test gateways run with).
const PRICES: [(&str, u64, u64, u64); 4] = [
    ("svc/opus", 15_000_000, 75_000_000, 18_750_000),
    ("svc/sonnet", 3_000_000, 15_000_000, 3_750_000),
    ("svc/haiku", 800_000, 4_000_000, 1_000_000),
    ("svc/kimi", 600_000, 2_500_000, 600_000),
];

/// ceil(cost in USD * 100,000 credits per USD), in integers.
fn credits_for(input: u64, input_price: u64, output: u64, output_price: u64) -> u64 {
    let micro_usd_times_mtok = input * input_price + output * output_price;
    (micro_usd_times_mtok * 100_000).div_ceil(1_000_000 * 1_000_000)
}

#[tokio::test]
async fn credits_are_tokens_times_the_models_price_rounded_up() {
    let gw = Gateway::builder().chunk_delay_ms(0).start().await;
    for (model, input_price, output_price, write_price) in PRICES {
        let max_tokens = 700;
        let body = gw
            .post_messages(&gw.key, &message(model, &words(300), max_tokens))
            .await
            .expect_ok();
        let usage = &body["usage"];
        assert_eq!(usage["cache_creation_input_tokens"], 0);
        assert_eq!(usage["cache_read_input_tokens"], 0);
        let input = usage["input_tokens"].as_u64().unwrap();
        let output = usage["output_tokens"].as_u64().unwrap();
        assert_eq!(
            credits_of(&body),
            credits_for(input, input_price, output, output_price),
            "{model}: {usage}"
        );
        // The reservation holds the turn's maximum: input (at most at the cache-write
        // price) plus max_tokens of output.
        let row = gw.message_record(body["id"].as_str().unwrap()).await;
        let reserved = row["reserved"].as_u64().unwrap();
        let low = credits_for(input, input_price, max_tokens, output_price);
        let high = credits_for(
            input,
            input_price.max(write_price),
            max_tokens,
            output_price,
        );
        assert!(
            (low..=high).contains(&reserved),
            "{model}: reserved {reserved} not in {low}..={high}: {row}"
        );
    }
}

#[tokio::test]
async fn a_turn_cut_at_max_tokens_bills_input_plus_max_tokens_and_a_shorter_one_less() {
    let gw = Gateway::start().await;
    let (_, input_price, output_price, _) = PRICES[0];
    let body = gw
        .post_messages(&gw.key, &message("svc/opus", "tell me everything", 5))
        .await
        .expect_ok();
    assert_eq!(body["stop_reason"], "max_tokens");
    assert_eq!(body["usage"]["output_tokens"], 5);
    let input = body["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(
        credits_of(&body),
        credits_for(input, input_price, 5, output_price)
    );
    check_ledger(
        &gw,
        body["id"].as_str().unwrap(),
        credits_of(&body),
        "svc/opus",
    )
    .await;

    let body = gw
        .post_messages(&gw.key, &message("svc/opus", "short", 4_000))
        .await
        .expect_ok();
    assert_eq!(body["stop_reason"], "end_turn");
    let row = check_ledger(
        &gw,
        body["id"].as_str().unwrap(),
        credits_of(&body),
        "svc/opus",
    )
    .await;
    assert!(
        row["billed"].as_u64() < row["reserved"].as_u64(),
        "billed for unused tokens: {row}"
    );
}

#[tokio::test]
async fn rejected_requests_consume_no_credits() {
    let gw = Gateway::start().await;
    let account = gw.create_account(1_000_000).await;
    let account_id = account["id"].as_str().unwrap();
    // The free key first: the top-up that gives the next key pay_as_you_go would start it
    // there too.
    let free = gw.mint_key(account_id, &KeySpec::tier("free")).await;
    let payg = gw
        .mint_key(account_id, &KeySpec::tier("pay_as_you_go"))
        .await;
    let chat_only = gw
        .mint_key(
            account_id,
            &KeySpec::tier("pay_as_you_go").with_scopes(&["chat"]),
        )
        .await;
    let before = gw.balance(&payg.secret).await;

    gw.post_messages(&payg.secret, &message("svc/nope", "hi", 16))
        .await
        .expect_status(400);
    gw.post_messages(&payg.secret, &message("svc/haiku", "hi", 9_000))
        .await
        .expect_status(400);
    gw.chat(&payg.secret, &json!({"model": "svc/haiku"}))
        .await
        .expect_status(400);
    gw.get("/v1/messages", &payg.secret)
        .await
        .expect_status(405);
    gw.post_messages(&chat_only.secret, &message("svc/haiku", "hi", 16))
        .await
        .expect_status(403);

    gw.wait_for_roomy_window(&free.secret, 5).await;
    for _ in 0..5 {
        gw.count_tokens(&free.secret, &count_body("svc/haiku", "hi"))
            .await
            .expect_ok();
    }
    gw.post_messages(&free.secret, &message("svc/haiku", "hi", 16))
        .await
        .expect_status(429);
    gw.chat(&free.secret, &chat_body("svc/haiku", "hi", Some(16)))
        .await
        .expect_status(429);

    gw.wait_settled(account_id).await;
    assert_eq!(
        gw.balance(&payg.secret).await,
        before,
        "a rejected request was charged"
    );
}

#[tokio::test]
async fn a_balance_one_credit_short_of_the_reservation_gets_402_and_is_charged_nothing() {
    let gw = Gateway::start().await;
    let body = message("svc/opus", "how much does this cost", 1_000);
    let probe = gw.post_messages(&gw.key, &body).await.expect_ok();
    let reserved = gw.message_record(probe["id"].as_str().unwrap()).await["reserved"]
        .as_u64()
        .expect("reserved");
    assert!(reserved > 1);

    let short = gw.new_key(reserved - 1, &KeySpec::tier("enterprise")).await;
    let msg = gw
        .post_messages(&short.secret, &body)
        .await
        .expect_error(402, "insufficient_quota");
    assert!(!msg.is_empty());
    assert_eq!(gw.balance(&short.secret).await, (reserved - 1) as i64);
    assert_eq!(gw.admin_account(&short.account_id).await["reserved"], 0);

    let exact = gw.new_key(reserved, &KeySpec::tier("enterprise")).await;
    let turn = gw.post_messages(&exact.secret, &body).await.expect_ok();
    gw.wait_settled(&exact.account_id).await;
    assert_eq!(
        gw.balance(&exact.secret).await,
        (reserved - credits_of(&turn)) as i64
    );
}

#[tokio::test]
async fn concurrent_requests_never_overdraw_the_balance() {
    let gw = Gateway::start().await;
    // Every turn uses all of its max_tokens, so it costs about what it reserves.
    let body = message("svc/sonnet", "concurrency under a tight balance", 8);
    let probe = gw.post_messages(&gw.key, &body).await.expect_ok();
    assert_eq!(probe["stop_reason"], "max_tokens");
    let per_turn = credits_of(&probe);
    let reserved = gw.message_record(probe["id"].as_str().unwrap()).await["reserved"]
        .as_u64()
        .unwrap();

    // Ten reservations' worth of credits; 40 requests at once.
    let funds = 10 * reserved;
    let key = gw.new_key(funds, &KeySpec::tier("enterprise")).await;
    let results = join_all((0..40).map(|_| gw.post_messages(&key.secret, &body))).await;

    let mut ok = 0;
    let mut ids = HashSet::new();
    for resp in &results {
        if resp.status == 200 {
            let body = resp.json();
            assert_eq!(credits_of(&body), per_turn, "identical turns cost the same");
            ok += 1;
            assert!(
                ids.insert(body["id"].as_str().unwrap().to_string()),
                "duplicate id"
            );
        } else {
            resp.expect_error(402, "insufficient_quota");
        }
    }
    // A request is refused only while ten reservations' worth is held or spent.
    assert!(
        ok >= 10,
        "only {ok} of 40 admitted with ten reservations' worth of credits"
    );
    assert!(
        ok * per_turn <= funds,
        "{ok} turns of {per_turn} admitted on {funds} credits"
    );
    gw.wait_settled(&key.account_id).await;
    let balance = gw.balance(&key.secret).await;
    assert!(balance >= 0, "balance went negative: {balance}");
    assert_eq!(
        funds as i64 - balance,
        (ok * per_turn) as i64,
        "balance drop vs credits_consumed of the 200s"
    );
    let account = gw.admin_account(&key.account_id).await;
    assert_eq!(account["balance"].as_i64(), Some(balance), "{account}");
}

#[tokio::test]
async fn top_ups_are_idempotent_by_reference() {
    let gw = Gateway::start().await;
    let key = gw.new_key(0, &KeySpec::tier("enterprise")).await;
    let first = gw.top_up(&key.account_id, 1_000, "pay-ref-1").await;
    assert!(matches!(first.status, 200 | 201), "{first}");
    let first = first.json();
    assert_eq!(first["reference"], "pay-ref-1");
    assert_eq!(first["usd_cents"], 1_000);
    assert_eq!(first["status"], "confirmed");
    // $10 at the default 100,000 credits per USD.
    assert_eq!(first["credits"], 1_000_000);

    let again = gw.top_up(&key.account_id, 1_000, "pay-ref-1").await;
    assert!(matches!(again.status, 200 | 201), "{again}");
    assert_eq!(again.json()["reference"], "pay-ref-1");

    let account = gw.admin_account(&key.account_id).await;
    assert_eq!(account["balance"], 1_000_000, "{account}");
    assert_eq!(account["lifetime_top_up_cents"], 1_000, "{account}");
    assert_eq!(gw.balance(&key.secret).await, 1_000_000);

    gw.top_up(&key.account_id, 2_500, "pay-ref-2").await.json();
    let account = gw.admin_account(&key.account_id).await;
    assert_eq!(account["balance"], 3_500_000, "{account}");
    assert_eq!(account["lifetime_top_up_cents"], 3_500, "{account}");

    // Topped up, the key can now pay for a turn.
    gw.post_messages(&key.secret, &message("svc/haiku", "paid", 16))
        .await
        .expect_ok();
}

#[tokio::test]
async fn chat_completions_without_max_tokens_succeed_on_a_funded_key() {
    let gw = Gateway::start().await;
    for model in MODELS {
        let resp = gw
            .chat(&gw.key, &chat_body(model, "no cap given", None))
            .await;
        let body = resp.expect_ok();
        assert_eq!(body["model"], model);
        check_ledger(&gw, body["id"].as_str().unwrap(), credits_of(&body), model).await;
    }
}

#[tokio::test]
async fn count_tokens_is_free() {
    let gw = Gateway::start().await;
    let before = gw.balance(&gw.key).await;
    for model in MODELS {
        let body = gw
            .count_tokens(&gw.key, &count_body(model, &words(500)))
            .await
            .expect_ok();
        let n = body["input_tokens"].as_u64().expect("input_tokens");
        assert!((500..600).contains(&n), "{model}: {n} tokens for 500 words");
    }
    assert_eq!(gw.balance(&gw.key).await, before);
}

#[tokio::test]
async fn credits_scale_with_the_credits_per_usd_setting() {
    let body = message("svc/opus", "price check", 300);
    let single = Gateway::start().await;
    let c1 = credits_of(&single.post_messages(&single.key, &body).await.expect_ok());
    drop(single);
    let double = Gateway::builder()
        .arg("--credits-per-usd")
        .arg("200000")
        .start()
        .await;
    let c2 = credits_of(&double.post_messages(&double.key, &body).await.expect_ok());
    // ceil(2x) is 2*ceil(x) or one less.
    assert!(
        c2 == 2 * c1 || c2 + 1 == 2 * c1,
        "credits {c1} at 100,000/USD, {c2} at 200,000/USD"
    );
}
