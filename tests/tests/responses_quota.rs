//! Stored responses cost what they store and stay within bounds: input the upstream never
//! sees but the store keeps (hosted-tool items) is billed as input; one account's flood of
//! stored responses evicts its own oldest, never another account's; a response past the
//! account's quota is 413 before anything is billed; and a store write that fails is the
//! client's 503 (Retry-After, the credits billed named), never a 200 whose id then reads 404.

use std::time::Duration;

use e2e::sse::assemble_response_stream;
use e2e::*;
use serde_json::{json, Value};

const PATH: &str = "/v1/responses";
const CREDITS: u64 = 1_000_000_000;

/// A user question after a hosted-tool call whose query is `words` words long: the call is
/// stored with the response and never sent to the model.
fn with_hosted_call(question: &str, words: usize) -> Value {
    json!({"model": "svc/haiku", "input": [
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "news ".repeat(words)}},
        {"role": "user", "content": question},
    ]})
}

fn input_tokens(response: &Value) -> u64 {
    response["usage"]["input_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage: {response}"))
}

#[tokio::test]
async fn hosted_tool_items_a_stored_response_keeps_are_billed_as_input() {
    let gw = Gateway::start().await;
    let key = gw.new_key(CREDITS, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let unstored = |words| {
        let mut body = with_hosted_call("What is new?", words);
        body["store"] = json!(false);
        body
    };
    // Neither stored nor sent: the hosted call costs nothing, whatever its size.
    let plain = gw
        .post_json(PATH, &key.secret, &unstored(0))
        .await
        .expect_ok();
    let unstored = gw
        .post_json(PATH, &key.secret, &unstored(3_000))
        .await
        .expect_ok();
    assert_eq!(input_tokens(&unstored), input_tokens(&plain));
    // Stored: its 3,000 words are billed as input.
    let hosted = gw
        .post_json(PATH, &key.secret, &with_hosted_call("What is new?", 3_000))
        .await
        .expect_ok();
    assert!(
        input_tokens(&hosted) >= input_tokens(&plain) + 3_000,
        "the hosted call's 3,000 words are billed: {} then {}",
        plain["usage"],
        hosted["usage"]
    );
    assert!(credits_of(&hosted) > credits_of(&plain));

    gw.wait_settled(&key.account_id).await;
    let billed = credits_of(&plain) + credits_of(&hosted) + credits_of(&unstored);
    assert_eq!(before - gw.balance(&key.secret).await, billed as i64);
}

#[tokio::test]
async fn another_accounts_flood_of_stored_responses_never_evicts_an_accounts_responses() {
    // 2 MB for every account's responses together; the flood stores 3.6 MB.
    let gw = Gateway::builder()
        .arg("--responses-max-bytes")
        .arg("2000000")
        .start()
        .await;
    let victim = gw.new_key(CREDITS, &KeySpec::tier("pay_as_you_go")).await;
    // Enterprise, so that its input tokens a minute admit the whole flood.
    let flooder = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let kept = gw
        .post_json(PATH, &victim.secret, &with_hosted_call("Keep me", 10))
        .await
        .expect_ok();
    let kept_id = kept["id"].as_str().expect("id");

    let mut flood = Vec::new();
    for _ in 0..12 {
        let response = gw
            .post_json(PATH, &flooder.secret, &with_hosted_call("Flood", 60_000))
            .await
            .expect_ok();
        flood.push(response["id"].as_str().expect("id").to_owned());
    }

    let read = gw.get(&format!("{PATH}/{kept_id}"), &victim.secret).await;
    assert_eq!(
        read.status, 200,
        "the victim's stored response survives the flood: {read}"
    );
    gw.get(&format!("{PATH}/{}", flood[0]), &flooder.secret)
        .await
        .expect_error(404, "not_found_error");
    gw.get(&format!("{PATH}/{}", flood[11]), &flooder.secret)
        .await
        .expect_ok();
}

#[tokio::test]
async fn a_response_past_the_accounts_quota_is_413_before_anything_is_billed() {
    let gw = Gateway::builder()
        .arg("--responses-account-max-bytes")
        .arg("100000")
        .start()
        .await;
    let key = gw.new_key(CREDITS, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let message = gw
        .post_json(PATH, &key.secret, &with_hosted_call("Too much", 40_000))
        .await
        .expect_error(413, "invalid_request_error");
    assert!(message.contains("store"), "{message}");
    assert_eq!(gw.balance(&key.secret).await, before, "nothing was billed");

    // The same request, not stored, is served.
    let mut unstored = with_hosted_call("Too much", 40_000);
    unstored["store"] = json!(false);
    gw.post_json(PATH, &key.secret, &unstored).await.expect_ok();
}

/// One pod on Postgres whose calls give up after a second, so that a locked table fails the
/// store write quickly.
async fn pod_on(pg: &PostgresServer) -> Cluster {
    Cluster::start(1, |b| {
        b.database(&pg.url())
            .arg("--database-timeout-ms")
            .arg("1000")
    })
    .await
}

const LOCK_STORED_RESPONSES: &str = "LOCK TABLE stored_responses IN ACCESS EXCLUSIVE MODE";

/// The response id and credits a "not stored" error names.
fn named_in(message: &str) -> (String, u64) {
    let id = message
        .split_whitespace()
        .find(|w| w.starts_with("resp_"))
        .unwrap_or_else(|| panic!("no response id in {message:?}"));
    let credits = message
        .split("billed ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no credits billed in {message:?}"));
    (id.to_owned(), credits)
}

#[tokio::test]
async fn a_store_write_that_fails_is_a_503_naming_its_bill_and_never_a_200_whose_id_reads_404() {
    let pg = PostgresServer::start().await;
    let cluster = pod_on(&pg).await;
    let gw = &cluster.pods[0];
    let key = gw.new_key(CREDITS, &KeySpec::tier("enterprise")).await;
    let before = gw.balance(&key.secret).await;

    let lock = pg.hold_locks(LOCK_STORED_RESPONSES).await;
    let refused = gw
        .post_json(PATH, &key.secret, &with_hosted_call("Store me", 10))
        .await;
    let message = refused.expect_error(503, "api_error");
    assert!(refused.header("retry-after").is_some(), "{refused}");
    let (id, credits) = named_in(&message);

    let mut streamed = with_hosted_call("Stream me", 10);
    streamed["stream"] = json!(true);
    let stream = gw.stream(PATH, &key.secret, &streamed).await;
    let stream = assemble_response_stream(&stream.collect().await);
    lock.release().await;
    assert_eq!(stream.end, "response.failed", "{:?}", stream.names());
    // A failed response that tells its bill ends on `response.failed` (docs/ledger.md), its
    // message in the response's `error` and its bill in `usage`, with no error event after it.
    assert!(stream.error.is_none(), "{:?}", stream.names());
    let message = stream.response["error"]["message"]
        .as_str()
        .unwrap_or_default();
    let (stream_id, stream_credits) = named_in(message);
    assert_eq!(
        stream.response["usage"]["credits_consumed"].as_u64(),
        Some(stream_credits),
        "{}",
        stream.response
    );

    // The database answers again after its failing window (one timeout).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in [&id, &stream_id] {
        gw.get(&format!("{PATH}/{id}"), &key.secret)
            .await
            .expect_error(404, "not_found_error");
    }
    gw.wait_settled(&key.account_id).await;
    for (id, credits) in [(&id, credits), (&stream_id, stream_credits)] {
        let row = gw.message_record(id).await;
        assert_eq!(row["billed"].as_u64(), Some(credits), "{row}");
    }
    assert_eq!(
        before - gw.balance(&key.secret).await,
        (credits + stream_credits) as i64,
        "the balance moved by what the errors named"
    );
}
