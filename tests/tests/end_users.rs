//! The end user of a turn (issue 54, item 3): what a client names as the person it serves,
//! `metadata.user_id` on Messages, `user` or `safety_identifier` on Chat Completions and
//! Responses (`safety_identifier` first), is kept on the turn's ledger row (both stores), set
//! on its span as `enduser.id` but in no metric, reported by `GET /v1/usage` grouped or
//! filtered by it and by the dashboard's usage page filtered by it, only ever to the row's own
//! account, and carried by the ledger's export; one over 256 bytes is refused (400 naming the
//! field) and leaves no row.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::archive::{assert_archive_matches, ledger_day};
use e2e::ledger::{funded, reserve, settle};
use e2e::otlp::Span;
use e2e::visitor::{new_email, thousands, Visitor};
use e2e::{
    message, message_stream, poll_until, Cluster, Gateway, GatewayBuilder, KeySpec, OtlpReceiver,
    PostgresServer,
};
use serde_json::{json, Value};
use store::db::Database;
use store::ledger::fixtures::turn_record;
use store::ledger::{message_id, partitions, MessageRecord};
use time::{OffsetDateTime, Time};

const ALICE: &str = "alice@example.com";
/// Markup in an end user: the dashboard must show it as text.
const BOB: &str = "bob <b>&</b> co";
const SIGNUP_CREDITS: u64 = 50_000_000;

/// What one end user's turns add up to, from their ledger rows.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
struct Figures {
    requests: u64,
    input_tokens: u64,
    output_tokens: u64,
    credits: u64,
}

/// A turn sent, and the end user its row must name.
struct Sent {
    id: String,
    end_user: Option<&'static str>,
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "svc/haiku",
        "max_tokens": 16,
        "messages": [{ "role": "user", "content": "hello" }],
    });
    merge(&mut body, extra);
    body
}

fn responses(extra: Value) -> Value {
    let mut body = json!({ "model": "svc/haiku", "input": "hello", "max_output_tokens": 16 });
    merge(&mut body, extra);
    body
}

fn messages(extra: Value) -> Value {
    let mut body = message("svc/haiku", "hello", 16);
    merge(&mut body, extra);
    body
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
}

/// `value` percent-encoded for a query string.
fn query_value(value: &str) -> String {
    let url = reqwest::Url::parse_with_params("http://x/", &[("v", value)]).expect("a URL");
    url.query()
        .and_then(|q| q.strip_prefix("v="))
        .expect("the encoded value")
        .to_owned()
}

/// Ten turns of one key through the three endpoints: four of ALICE (one a stream), three of
/// BOB, three naming nobody.
async fn turns_of_two_end_users_and_none(gw: &Gateway, key: &str) -> Vec<Sent> {
    let mut sent = Vec::new();
    let mut answered = |what: &str, body: Value, end_user: Option<&'static str>| {
        let id = body["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no id in {body}"))
            .to_owned();
        sent.push(Sent { id, end_user });
    };
    let cases: Vec<(&str, &str, Value, Option<&'static str>)> = vec![
        (
            "messages, metadata.user_id",
            "/v1/messages",
            messages(json!({ "metadata": { "user_id": ALICE } })),
            Some(ALICE),
        ),
        (
            "messages, metadata.user_id",
            "/v1/messages",
            messages(json!({ "metadata": { "user_id": BOB } })),
            Some(BOB),
        ),
        (
            "messages, empty metadata",
            "/v1/messages",
            messages(json!({ "metadata": {} })),
            None,
        ),
        (
            "chat, user",
            "/v1/chat/completions",
            chat(json!({ "user": ALICE })),
            Some(ALICE),
        ),
        (
            "chat, safety_identifier before user",
            "/v1/chat/completions",
            chat(json!({ "safety_identifier": BOB, "user": "not-bob" })),
            Some(BOB),
        ),
        ("chat, none", "/v1/chat/completions", chat(json!({})), None),
        (
            "responses, safety_identifier",
            "/v1/responses",
            responses(json!({ "safety_identifier": ALICE })),
            Some(ALICE),
        ),
        (
            "responses, user",
            "/v1/responses",
            responses(json!({ "user": BOB })),
            Some(BOB),
        ),
        (
            "responses, none",
            "/v1/responses",
            responses(json!({})),
            None,
        ),
    ];
    for (what, path, body, end_user) in cases {
        let answer = gw.post_json(path, key, &body).await;
        assert_eq!(answer.status, 200, "{what}: {answer}");
        answered(what, answer.json(), end_user);
    }
    let mut stream = gw
        .stream("/v1/messages", key, &{
            let mut body = message_stream("svc/haiku", "hello", 16);
            body["metadata"] = json!({ "user_id": ALICE });
            body
        })
        .await;
    let mut id = None;
    while let Some(event) = stream.next_event().await {
        if event.name() == "message_start" {
            id = event.json()["message"]["id"].as_str().map(str::to_owned);
        }
        if event.name() == "message_stop" {
            break;
        }
    }
    sent.push(Sent {
        id: id.expect("the stream's message id"),
        end_user: Some(ALICE),
    });
    sent
}

/// Each turn's row names its end user; the figures of each end user's rows (`None`: the turns
/// that named nobody).
async fn rows_name_their_end_users(
    gw: &Gateway,
    sent: &[Sent],
    pg: Option<&PostgresServer>,
) -> BTreeMap<Option<String>, Figures> {
    let mut figures: BTreeMap<Option<String>, Figures> = BTreeMap::new();
    for turn in sent {
        let record = gw.message_record(&turn.id).await;
        assert_eq!(
            record["end_user"].as_str(),
            turn.end_user,
            "the row of {}: {record}",
            turn.id
        );
        assert_eq!(record["status"], "completed", "{record}");
        let f = figures.entry(turn.end_user.map(str::to_owned)).or_default();
        f.requests += 1;
        f.input_tokens += record["usage"]["input_tokens"].as_u64().expect("input");
        f.output_tokens += record["usage"]["output_tokens"].as_u64().expect("output");
        f.credits += record["billed"].as_u64().expect("billed");
        if let Some(pg) = pg {
            let stored = pg
                .query(&format!(
                    "SELECT coalesce(end_user, '(none)') FROM messages WHERE id = '{}'",
                    turn.id
                ))
                .await;
            assert_eq!(stored, turn.end_user.unwrap_or("(none)"), "{}", turn.id);
        }
    }
    figures
}

fn figures_of(entry: &Value) -> Figures {
    let n = |field: &str| {
        entry[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field}: {entry}"))
    };
    Figures {
        requests: n("requests"),
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        credits: n("credits"),
    }
}

/// `GET /v1/usage` grouped by end user: one group per end user, equal to its rows.
async fn usage_by_end_user(gw: &Gateway, key: &str) -> BTreeMap<Option<String>, Figures> {
    let report = gw.get("/v1/usage?group_by=end_user", key).await.expect_ok();
    assert_eq!(report["group_by"], json!(["end_user"]), "{report}");
    report["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|entry| {
            assert!(entry.get("date").is_none() && entry.get("model").is_none());
            (
                entry["end_user"].as_str().map(str::to_owned),
                figures_of(entry),
            )
        })
        .collect()
}

fn text_of_id(page: &str, id: &str) -> String {
    let after = page
        .split(&format!("id=\"{id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no #{id} in {page}"));
    after
        .split_once('>')
        .and_then(|(_, rest)| rest.split('<').next())
        .expect("the element's text")
        .to_owned()
}

/// Signs up on the dashboard and mints a key there; the account's key for the turns is one
/// of the enterprise tier (a new account's free tier allows 5 requests a minute): the visitor
/// and that key's secret.
async fn dashboard_key(gw: &Gateway) -> (Visitor<'_>, String) {
    let mut visitor = Visitor::new(gw);
    visitor.sign_up(&new_email(), &[]).await;
    let (status, page) = visitor.create_key("end users").await;
    assert_eq!(status, 200, "{page}");
    let secret = page
        .split("value=\"sk-svc-")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(|rest| format!("sk-svc-{rest}"))
        .unwrap_or_else(|| panic!("no secret shown: {page}"));
    let account_id = gw.account(&secret).await["id"]
        .as_str()
        .expect("the account's id")
        .to_owned();
    let key = gw.mint_key(&account_id, &KeySpec::tier("enterprise")).await;
    (visitor, key.secret)
}

/// The whole rule on one gateway (`pg`: the Postgres behind it).
async fn end_users_are_recorded_reported_and_kept_to_their_account(
    gw: &Gateway,
    pg: Option<&PostgresServer>,
) {
    let (mut visitor, key) = dashboard_key(gw).await;
    let sent = turns_of_two_end_users_and_none(gw, &key).await;
    let account_id = gw.message_record(&sent[0].id).await["account_id"]
        .as_str()
        .expect("account")
        .to_owned();
    gw.wait_settled(&account_id).await;

    // The rows.
    let rows = rows_name_their_end_users(gw, &sent, pg).await;
    let (alice, bob) = (Some(ALICE.to_owned()), Some(BOB.to_owned()));
    assert_eq!(
        rows.iter()
            .map(|(u, f)| (u.clone(), f.requests))
            .collect::<Vec<_>>(),
        vec![(None, 3), (alice.clone(), 4), (bob.clone(), 3)]
    );

    // The report grouped by end user is the rows grouped.
    assert_eq!(usage_by_end_user(gw, &key).await, rows);
    // Filtered by one: only its turns, the totals its rows'.
    let only_bob = gw
        .get(&format!("/v1/usage?end_user={}", query_value(BOB)), &key)
        .await
        .expect_ok();
    assert_eq!(only_bob["end_user"], BOB, "{only_bob}");
    assert_eq!(figures_of(&only_bob["totals"]), rows[&bob], "{only_bob}");
    // Unfiltered and ungrouped, every turn (the rollups agree with the rows).
    let all = gw.get("/v1/usage", &key).await.expect_ok();
    assert_eq!(figures_of(&all["totals"]).requests, 10, "{all}");

    // Another account: its own ALICE is another group; it sees none of the first account's.
    let other = gw
        .new_key(SIGNUP_CREDITS, &KeySpec::tier("enterprise"))
        .await;
    gw.post_messages(
        &other.secret,
        &messages(json!({ "metadata": { "user_id": ALICE } })),
    )
    .await
    .expect_ok();
    gw.wait_settled(&other.account_id).await;
    let theirs = usage_by_end_user(gw, &other.secret).await;
    assert_eq!(
        theirs
            .iter()
            .map(|(u, f)| (u.clone(), f.requests))
            .collect::<Vec<_>>(),
        vec![(alice.clone(), 1)],
        "the other account's report has its own turn only"
    );
    let their_bob = gw
        .get(
            &format!("/v1/usage?end_user={}", query_value(BOB)),
            &other.secret,
        )
        .await
        .expect_ok();
    assert_eq!(their_bob["totals"]["requests"], 0, "{their_bob}");
    assert_eq!(their_bob["data"], json!([]), "{their_bob}");
    assert_eq!(
        usage_by_end_user(gw, &key).await,
        rows,
        "unchanged by the other"
    );

    // The dashboard's usage page, filtered by BOB: BOB's figures, BOB shown as text.
    let (status, page) = visitor
        .get(&format!("/developers/usage?end_user={}", query_value(BOB)))
        .await;
    assert_eq!(status, 200, "{page}");
    let bob_figures = rows[&bob];
    assert_eq!(
        text_of_id(&page, "total-requests"),
        thousands(bob_figures.requests)
    );
    assert_eq!(
        text_of_id(&page, "total-input"),
        thousands(bob_figures.input_tokens)
    );
    assert_eq!(
        text_of_id(&page, "total-output"),
        thousands(bob_figures.output_tokens)
    );
    assert_eq!(
        text_of_id(&page, "total-credits"),
        thousands(bob_figures.credits)
    );
    assert!(
        page.contains("bob &lt;b&gt;&amp;&lt;/b&gt; co") && !page.contains(BOB),
        "the end user is escaped: {page}"
    );
    let (_, page) = visitor.get("/developers/usage").await;
    assert_eq!(text_of_id(&page, "total-requests"), "10");
}

fn gateway_with_sign_up_credits(b: GatewayBuilder) -> GatewayBuilder {
    b.arg("--signup-credits").arg(&SIGNUP_CREDITS.to_string())
}

#[tokio::test]
async fn in_process_end_users_are_on_their_rows_in_usage_and_on_the_dashboard_of_their_account_only(
) {
    let gw = gateway_with_sign_up_credits(Gateway::builder())
        .start()
        .await;
    end_users_are_recorded_reported_and_kept_to_their_account(&gw, None).await;
}

#[tokio::test]
async fn in_postgres_end_users_are_on_their_rows_in_usage_and_on_the_dashboard_of_their_account_only(
) {
    let pg = PostgresServer::start().await;
    let url = pg.url();
    // Both ways a row is written: by the settle statement (turns reserved one by one), and
    // after the turn from an allotment.
    for allotment_turns in ["0", "16"] {
        let cluster = Cluster::start(1, |b| {
            gateway_with_sign_up_credits(b.database(&url))
                .arg("--allotment-turns")
                .arg(allotment_turns)
        })
        .await;
        end_users_are_recorded_reported_and_kept_to_their_account(&cluster.pods[0], Some(&pg))
            .await;
    }
}

/// Over 256 bytes is refused naming the field the client sent, before anything is reserved;
/// 256 bytes is kept whole.
async fn an_end_user_over_256_bytes_is_refused_naming_its_field(gw: &Gateway) {
    let key = gw
        .new_key(SIGNUP_CREDITS, &KeySpec::tier("enterprise"))
        .await;
    let long = "x".repeat(257);
    // 129 characters, 258 bytes: the bound is in bytes.
    let wide = "é".repeat(129);
    let cases = [
        (
            "metadata.user_id",
            "/v1/messages",
            messages(json!({ "metadata": { "user_id": long } })),
        ),
        (
            "metadata.user_id",
            "/v1/messages",
            messages(json!({ "metadata": { "user_id": wide } })),
        ),
        (
            "user",
            "/v1/chat/completions",
            chat(json!({ "user": long })),
        ),
        (
            "safety_identifier",
            "/v1/chat/completions",
            chat(json!({ "safety_identifier": long })),
        ),
        ("user", "/v1/responses", responses(json!({ "user": long }))),
        (
            "safety_identifier",
            "/v1/responses",
            responses(json!({ "safety_identifier": long })),
        ),
    ];
    for (field, path, body) in &cases {
        let message = gw
            .post_json(path, &key.secret, body)
            .await
            .expect_error(400, "invalid_request_error");
        assert!(
            message.starts_with(&format!("{field}: at most 256 bytes")),
            "{path}: {message}"
        );
    }
    let longest = "y".repeat(256);
    let answer = gw
        .post_messages(
            &key.secret,
            &messages(json!({ "metadata": { "user_id": longest } })),
        )
        .await
        .expect_ok();
    let record = gw.message_record(answer["id"].as_str().expect("id")).await;
    assert_eq!(record["end_user"].as_str(), Some(longest.as_str()));
    gw.wait_settled(&key.account_id).await;
    let usage = gw.get("/v1/usage", &key.secret).await.expect_ok();
    assert_eq!(
        usage["totals"]["requests"], 1,
        "the refused turns left no row: {usage}"
    );
    let filter = gw
        .get(&format!("/v1/usage?end_user={long}"), &key.secret)
        .await
        .expect_error(400, "invalid_request_error");
    assert!(
        filter.starts_with("end_user: at most 256 bytes"),
        "{filter}"
    );
}

#[tokio::test]
async fn in_process_an_end_user_over_256_bytes_is_refused_naming_its_field() {
    let gw = Gateway::start().await;
    an_end_user_over_256_bytes_is_refused_naming_its_field(&gw).await;
}

#[tokio::test]
async fn in_postgres_an_end_user_over_256_bytes_is_refused_naming_its_field() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    an_end_user_over_256_bytes_is_refused_naming_its_field(&cluster.pods[0]).await;
}

#[tokio::test]
async fn the_end_user_is_on_the_turns_span_and_in_no_metric() {
    let receiver = OtlpReceiver::start().await;
    let gw = Gateway::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .start()
        .await;
    let key = gw
        .new_key(SIGNUP_CREDITS, &KeySpec::tier("enterprise"))
        .await;
    let end_user = "span-end-user-7f3a";
    let mut ids = Vec::new();
    for body in [
        messages(json!({ "metadata": { "user_id": end_user } })),
        messages(json!({})),
    ] {
        let answer = gw.post_messages(&key.secret, &body).await.expect_ok();
        ids.push(answer["id"].as_str().expect("id").to_owned());
    }
    let span_of = |id: &str| {
        let id = id.to_owned();
        move |s: &Span| {
            s.attr("gen_ai.response.id")
                .as_ref()
                .and_then(Value::as_str)
                == Some(id.as_str())
                && s.attr("svc.credits.billed").is_some()
        }
    };
    let named = receiver
        .wait_for("the named turn's span", span_of(&ids[0]))
        .await;
    assert_eq!(named.str_attr("enduser.id"), end_user, "{}", named.raw);
    let anonymous = receiver
        .wait_for("the anonymous turn's span", span_of(&ids[1]))
        .await;
    assert_eq!(anonymous.attr("enduser.id"), None, "{}", anonymous.raw);
    let scrape = gw.metrics().await;
    assert!(!scrape.samples.is_empty(), "a scrape");
    assert!(
        !scrape.text.contains(end_user),
        "an end user is never a metric label"
    );
}

/// A day's export carries each row's end user, open and closed days alike (a day closed into
/// `closed_messages` keeps it), equal to the ledger's, decoded by pyarrow.
#[tokio::test]
async fn the_export_carries_each_rows_end_user_open_and_closed_days() {
    let pg = PostgresServer::start().await;
    let db = Database::connect(&pg.url(), 4, Duration::from_secs(5)).expect("url");
    db.migrate().await.expect("migrate");
    let (ledger, account) = funded(&db, "end-users", 100_000_000).await;
    let midnight = OffsetDateTime::now_utc().replace_time(Time::MIDNIGHT);
    let days = [
        (midnight - time::Duration::days(3)).date(),
        (midnight - time::Duration::days(2)).date(),
    ];
    for day in days {
        partitions::create(&db, day).await.expect("a partition");
    }
    for day in &days {
        for (i, end_user) in [Some(ALICE), Some(BOB), None].into_iter().enumerate() {
            // Minted with its time, as a gateway mints it: only such rows can be closed.
            let at = day.midnight().assume_utc() + time::Duration::hours(1 + i as i64);
            let id = message_id::mint("msg", at);
            let record = MessageRecord {
                created_at: message_id::created_at(&id).expect("a time"),
                end_user: end_user.map(str::to_owned),
                ..turn_record(&id, &account, "key_end_users")
            };
            reserve(&ledger, record).await;
            settle(&ledger, &id, 100).await;
        }
    }
    // The older day closed, as the retention closes a day a week past its end.
    assert_eq!(
        pg.query(&format!("SELECT ledger_compact_day('{}')", days[0]))
            .await,
        "t"
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM closed_messages WHERE end_user <> ''")
            .await,
        2,
        "the closed rows keep their end users"
    );
    let dir = std::env::temp_dir().join(e2e::gateway::unique_name("end-users-export"));
    let printed = pg
        .gateway_cli(&[
            "ledger",
            "export",
            "--from",
            &days[0].to_string(),
            "--to",
            &days[1].to_string(),
            "--reaper-max-turn-secs",
            "60",
            "--to-dir",
            dir.to_str().expect("utf-8"),
        ])
        .await
        .expect("export");
    assert_eq!(
        printed["days"].as_array().map(Vec::len),
        Some(2),
        "{printed}"
    );
    for day in days {
        let ledger = ledger_day(&pg, day).await;
        let end_users: Vec<Option<&str>> = ledger
            .rows
            .values()
            .map(|r| r["end_user"].as_str())
            .collect();
        assert_eq!(end_users, vec![Some(ALICE), Some(BOB), None], "{day}");
        let file =
            std::fs::read(dir.join(format!("messages-{day}.parquet"))).expect("the day's file");
        assert_archive_matches(&format!("messages-{day}.parquet"), &file, &ledger).await;
    }
}

/// A Message Batch's items keep the end user their params name, as interactive turns do, and
/// the report counts them as batch requests of that end user.
async fn a_batch_items_row_names_its_end_user(gw: &Gateway) {
    let key = gw
        .new_key(SIGNUP_CREDITS, &KeySpec::tier("enterprise"))
        .await;
    let body = json!({ "requests": [
        { "custom_id": "alice", "params": messages(json!({ "metadata": { "user_id": ALICE } })) },
        { "custom_id": "nobody", "params": messages(json!({})) },
    ] });
    let created = gw
        .post_json("/v1/messages/batches", &key.secret, &body)
        .await
        .expect_ok();
    let batch_id = created["id"].as_str().expect("a batch id").to_owned();
    poll_until(
        "the batch to end",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            let batch = gw
                .get(&format!("/v1/messages/batches/{batch_id}"), &key.secret)
                .await
                .expect_ok();
            (batch["processing_status"] == "ended").then_some(())
        },
    )
    .await;
    // Read raw: JSON Lines, whose generated text the harness' leak check (for JSON bodies)
    // would take for prose naming the simulated provider.
    let results = gw
        .client()
        .get(gw.url(&format!("/v1/messages/batches/{batch_id}/results")))
        .bearer_auth(&key.secret)
        .send()
        .await
        .expect("the results");
    assert_eq!(results.status(), 200);
    let results = results.text().await.expect("the results' text");
    let mut seen = 0;
    for line in results.lines().filter(|l| !l.trim().is_empty()) {
        let line: Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(line["result"]["type"], "succeeded", "{line}");
        let id = line["result"]["message"]["id"]
            .as_str()
            .expect("message id");
        let row = gw.message_record(id).await;
        assert_eq!(row["batch_id"], batch_id.as_str(), "{row}");
        let expected = (line["custom_id"] == "alice").then_some(ALICE);
        assert_eq!(row["end_user"].as_str(), expected, "{row}");
        seen += 1;
    }
    assert_eq!(seen, 2, "both items' results: {results}");
    gw.wait_settled(&key.account_id).await;
    let report = gw
        .get(
            &format!(
                "/v1/usage?group_by=end_user&end_user={}",
                query_value(ALICE)
            ),
            &key.secret,
        )
        .await
        .expect_ok();
    assert_eq!(report["data"].as_array().map(Vec::len), Some(1), "{report}");
    assert_eq!(report["data"][0]["end_user"], ALICE, "{report}");
    assert_eq!(report["data"][0]["batch_requests"], 1, "{report}");
}

#[tokio::test]
async fn in_process_a_batch_items_row_names_its_end_user() {
    let gw = Gateway::start().await;
    a_batch_items_row_names_its_end_user(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_batch_items_row_names_its_end_user() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_batch_items_row_names_its_end_user(&cluster.pods[0]).await;
}
