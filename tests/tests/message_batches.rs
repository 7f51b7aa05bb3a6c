//! Message Batches (`/v1/messages/batches`) as the official `anthropic` Python SDK calls them,
//! on the real gateway binary, standalone and `serve` on Postgres: a batch runs to completion
//! outside the key's interactive limits, every result is read by `custom_id`, and the balance
//! drops by exactly the ledger rows of its items, each at half the interactive price; cancel
//! stops the queued items, billed nothing; items not run by the expiry end `expired`; the
//! per-key cap of batches in progress is refused with the envelope.

use std::collections::HashMap;
use std::time::Duration;

use e2e::gateway::workspace_root;
use e2e::*;
use reqwest::Method;
use serde_json::{json, Value};

/// Creates a batch of `n` requests and one invalid (no `max_tokens`), optionally cancels it at
/// once, waits for it to end, reads every result, lists the batches, and deletes it; prints
/// what it saw as one JSON line.
const SDK_RUN: &str = r#"
import sys, json, time, anthropic
base, key, n, cancel = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "cancel"
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
requests = [{"custom_id": f"req-{i}", "params": {"model": "svc/haiku", "max_tokens": 32,
             "messages": [{"role": "user", "content": f"Question number {i}"}]}} for i in range(n)]
requests.append({"custom_id": "invalid", "params": {"model": "svc/haiku",
                 "messages": [{"role": "user", "content": "no max_tokens"}]}})
batch = client.messages.batches.create(requests=requests)
created = batch.model_dump(mode="json")
canceled = client.messages.batches.cancel(batch.id).model_dump(mode="json") if cancel else None
deadline = time.time() + 180
while batch.processing_status != "ended":
    if time.time() > deadline:
        raise SystemExit("the batch did not end: " + batch.model_dump_json())
    time.sleep(0.2)
    batch = client.messages.batches.retrieve(batch.id)
results = {}
for line in client.messages.batches.results(batch.id):
    result = {"type": line.result.type}
    if line.result.type == "succeeded":
        result["message_id"] = line.result.message.id
        result["text"] = line.result.message.content[0].text
    if line.result.type == "errored":
        result["error"] = line.result.error.error.type
    results[line.custom_id] = result
listed = [b.id for b in client.messages.batches.list(limit=1)]
deleted = client.messages.batches.delete(batch.id).type
try:
    client.messages.batches.retrieve(batch.id)
    gone = False
except anthropic.NotFoundError:
    gone = True
print(json.dumps({"created": created, "canceled": canceled, "ended": batch.model_dump(mode="json"),
                  "results": results, "listed": listed, "deleted": deleted, "gone": gone}))
"#;

/// What [`SDK_RUN`] printed.
async fn sdk_run(gw: &Gateway, key: &str, n: usize, cancel: bool) -> Value {
    let python = workspace_root().join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test creates the venv with the anthropic SDK",
        python.display()
    );
    let mode = if cancel { "cancel" } else { "run" };
    let out = tokio::process::Command::new(python)
        .args(["-c", SDK_RUN, &gw.url(""), key, &n.to_string(), mode])
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .await
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "the SDK run failed: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            gw.logs()
        )
    })
}

/// The ledger rows of the succeeded results, by custom_id; each names the batch endpoint and
/// the batch.
async fn ledger_rows(gw: &Gateway, batch_id: &Value, results: &Value) -> HashMap<String, Value> {
    let mut rows = HashMap::new();
    for (custom_id, result) in results.as_object().expect("results") {
        if result["type"] != "succeeded" {
            continue;
        }
        let id = result["message_id"].as_str().expect("a message id");
        let row = gw.message_record(id).await;
        assert_eq!(row["endpoint"], "message_batches", "{row}");
        assert_eq!(&row["batch_id"], batch_id, "the row names its batch: {row}");
        assert_eq!(row["status"], "completed", "{row}");
        rows.insert(custom_id.clone(), row);
    }
    rows
}

fn billed(rows: &HashMap<String, Value>) -> i64 {
    rows.values()
        .map(|r| r["billed"].as_i64().expect("billed"))
        .sum()
}

/// 50 requests and an invalid one, through a free-tier key (5 requests a minute): all run,
/// and the key's interactive window counts none of them.
async fn a_batch_runs_to_completion_billed_per_item_at_half_price(gw: &Gateway) {
    const N: usize = 50;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let before = gw.balance(&key.secret).await;
    let run = sdk_run(gw, &key.secret, N, false).await;

    let created = &run["created"];
    assert!(
        created["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msgbatch_")),
        "{created}"
    );
    assert_eq!(created["type"], "message_batch");
    assert_eq!(
        created["request_counts"]["errored"], 1,
        "the invalid one at once: {created}"
    );
    let ended = &run["ended"];
    assert_eq!(ended["processing_status"], "ended", "{ended}");
    assert_eq!(
        ended["request_counts"],
        json!({"processing": 0, "succeeded": N, "errored": 1, "canceled": 0, "expired": 0}),
        "{ended}"
    );
    assert!(
        ended["ended_at"].is_string() && ended["results_url"].is_string(),
        "{ended}"
    );

    let results = &run["results"];
    assert_eq!(
        results.as_object().map(|r| r.len()),
        Some(N + 1),
        "{results}"
    );
    for i in 0..N {
        let result = &results[format!("req-{i}")];
        assert_eq!(result["type"], "succeeded", "req-{i}: {result}");
        assert!(
            result["text"].as_str().is_some_and(|t| !t.is_empty()),
            "{result}"
        );
    }
    assert_eq!(
        results["invalid"],
        json!({"type": "errored", "error": "invalid_request_error"})
    );
    assert_eq!(run["listed"], json!([created["id"]]));
    assert_eq!(
        (&run["deleted"], &run["gone"]),
        (&json!("message_batch_deleted"), &json!(true))
    );

    // The key's interactive window: three requests (the batch's creation, the download of its
    // results and the list; none of its items), none of its tokens.
    let window = gw.get("/v1/models", &key.secret).await.rate_limit();
    assert_eq!(window.remaining_tokens, window.limit_tokens, "{window:?}");
    assert!(
        window.remaining_requests + 3 >= window.limit_requests,
        "{window:?}"
    );

    let rows = ledger_rows(gw, &created["id"], results).await;
    assert_eq!(rows.len(), N);
    gw.wait_settled(&key.account_id).await;
    let spent = before - gw.balance(&key.secret).await;
    assert!(spent > 0);
    assert_eq!(
        spent,
        billed(&rows),
        "the balance drops by the items' ledger rows"
    );

    // GET /v1/usage counts the items among all turns and, apart, as batch spend.
    let interactive = gw
        .post_messages(
            &key.secret,
            &json!({"model": "svc/haiku", "max_tokens": 32,
                    "messages": [{"role": "user", "content": "Question number 0"}]}),
        )
        .await
        .expect_ok();
    let interactive = gw
        .message_record(interactive["id"].as_str().expect("id"))
        .await;
    gw.wait_settled(&key.account_id).await;
    let usage = gw.get("/v1/usage", &key.secret).await.expect_ok();
    let totals = &usage["totals"];
    let interactive_billed = interactive["billed"].as_i64().expect("billed");
    assert_eq!(
        (
            &totals["requests"],
            &totals["credits"],
            &totals["batch_requests"],
            &totals["batch_credits"]
        ),
        (
            &json!(N + 1),
            &json!(billed(&rows) + interactive_billed),
            &json!(N),
            &json!(billed(&rows))
        ),
        "{usage}"
    );

    // The same request sent alone costs twice as much (to the rounding of each bill).
    let rich = gw.new_key(1_000_000, &KeySpec::api()).await;
    let alone = gw
        .post_messages(
            &rich.secret,
            &json!({"model": "svc/haiku", "max_tokens": 32,
                    "messages": [{"role": "user", "content": "Question number 0"}]}),
        )
        .await
        .expect_ok();
    let interactive = gw.message_record(alone["id"].as_str().expect("id")).await;
    assert_eq!(
        interactive["batch_id"],
        Value::Null,
        "an interactive row names no batch: {interactive}"
    );
    let item = &rows["req-0"];
    assert_eq!(interactive["usage"], item["usage"], "the same turn");
    let (full, half) = (
        interactive["billed"].as_i64().expect("billed"),
        item["billed"].as_i64().expect("billed"),
    );
    assert!(
        (full / 2..=(full + 1) / 2).contains(&half),
        "a batch item costs half: {half} of {full}"
    );
}

#[tokio::test]
async fn standalone_a_batch_runs_to_completion_billed_per_item_at_half_price() {
    let gw = Gateway::start().await;
    a_batch_runs_to_completion_billed_per_item_at_half_price(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_batch_runs_to_completion_billed_per_item_at_half_price() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_batch_runs_to_completion_billed_per_item_at_half_price(&cluster.pods[0]).await;
}

/// An account with credits for a few items: those run, the rest end `errored` with the 402
/// envelope, billed nothing, and the balance drops by exactly the rows of those that ran.
async fn items_past_the_balance_end_errored_with_402_unbilled(gw: &Gateway) {
    const N: usize = 12;
    let key = gw.new_key(20, &KeySpec::api()).await;
    let run = sdk_run(gw, &key.secret, N, false).await;
    let results = &run["results"];
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for i in 0..N {
        let result = &results[format!("req-{i}")];
        let kind = match result["type"].as_str() {
            Some("errored") => format!("errored:{}", result["error"].as_str().unwrap_or("")),
            other => other.unwrap_or("").to_owned(),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let ran = kinds.get("succeeded").copied().unwrap_or(0);
    let refused = kinds
        .get("errored:insufficient_quota")
        .copied()
        .unwrap_or(0);
    assert!(ran > 0 && refused > 0, "{kinds:?}");
    assert_eq!(ran + refused, N, "{kinds:?}");
    let rows = ledger_rows(gw, &run["created"]["id"], results).await;
    gw.wait_settled(&key.account_id).await;
    assert_eq!(20 - gw.balance(&key.secret).await, billed(&rows));
}

#[tokio::test]
async fn standalone_items_past_the_balance_end_errored_with_402_unbilled() {
    let gw = slow(Gateway::builder()).start().await;
    items_past_the_balance_end_errored_with_402_unbilled(&gw).await;
}

#[tokio::test]
async fn in_postgres_items_past_the_balance_end_errored_with_402_unbilled() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| slow(b.database(&pg.url()))).await;
    items_past_the_balance_end_errored_with_402_unbilled(&cluster.pods[0]).await;
}

/// One item at a time, each slow: cancelled at once, most never run.
async fn cancel_stops_the_queued_items_billed_nothing(gw: &Gateway) {
    const N: usize = 30;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let before = gw.balance(&key.secret).await;
    let run = sdk_run(gw, &key.secret, N, true).await;
    let canceled = &run["canceled"];
    assert!(canceled["cancel_initiated_at"].is_string(), "{canceled}");
    let counts = &run["ended"]["request_counts"];
    let (succeeded, cancelled) = (
        counts["succeeded"].as_u64().expect("count"),
        counts["canceled"].as_u64().expect("count"),
    );
    assert!(
        cancelled >= N as u64 - 3,
        "the queued ones are cancelled: {counts}"
    );
    assert_eq!(succeeded + cancelled, N as u64, "{counts}");
    let results = &run["results"];
    let of_type = |kind: &str| {
        results
            .as_object()
            .expect("results")
            .values()
            .filter(|r| r["type"] == kind)
            .count() as u64
    };
    assert_eq!(
        (of_type("succeeded"), of_type("canceled")),
        (succeeded, cancelled)
    );
    let rows = ledger_rows(gw, &run["created"]["id"], results).await;
    gw.wait_settled(&key.account_id).await;
    assert_eq!(
        before - gw.balance(&key.secret).await,
        billed(&rows),
        "only the finished items are billed"
    );
}

fn slow(b: GatewayBuilder) -> GatewayBuilder {
    b.chunk_delay_ms(40).arg("--batch-concurrency").arg("1")
}

#[tokio::test]
async fn standalone_cancel_stops_the_queued_items_billed_nothing() {
    let gw = slow(Gateway::builder()).start().await;
    cancel_stops_the_queued_items_billed_nothing(&gw).await;
}

#[tokio::test]
async fn in_postgres_cancel_stops_the_queued_items_billed_nothing() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| slow(b.database(&pg.url()))).await;
    cancel_stops_the_queued_items_billed_nothing(&cluster.pods[0]).await;
}

/// A 2-second window, one slow item at a time: the items not run by then end `expired`.
async fn items_not_run_by_the_expiry_end_expired(gw: &Gateway) {
    const N: usize = 40;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let before = gw.balance(&key.secret).await;
    let run = sdk_run(gw, &key.secret, N, false).await;
    let counts = &run["ended"]["request_counts"];
    let (succeeded, expired) = (
        counts["succeeded"].as_u64().expect("count"),
        counts["expired"].as_u64().expect("count"),
    );
    assert!(expired > 0 && succeeded > 0, "{counts}");
    assert_eq!(succeeded + expired, N as u64, "{counts}");
    let results = &run["results"];
    let expired_results = results
        .as_object()
        .expect("results")
        .values()
        .filter(|r| r["type"] == "expired")
        .count() as u64;
    assert_eq!(expired_results, expired);
    let rows = ledger_rows(gw, &run["created"]["id"], results).await;
    gw.wait_settled(&key.account_id).await;
    assert_eq!(before - gw.balance(&key.secret).await, billed(&rows));
}

fn expiring(b: GatewayBuilder) -> GatewayBuilder {
    slow(b)
        .arg("--batch-expiry-secs")
        .arg("2")
        .arg("--batch-poll-ms")
        .arg("100")
}

#[tokio::test]
async fn standalone_items_not_run_by_the_expiry_end_expired() {
    let gw = expiring(Gateway::builder()).start().await;
    items_not_run_by_the_expiry_end_expired(&gw).await;
}

#[tokio::test]
async fn in_postgres_items_not_run_by_the_expiry_end_expired() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| expiring(b.database(&pg.url()))).await;
    items_not_run_by_the_expiry_end_expired(&cluster.pods[0]).await;
}

fn one_batch(id: usize) -> Value {
    json!({"requests": [{"custom_id": format!("only-{id}"), "params": {
        "model": "svc/haiku", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}}]})
}

#[tokio::test]
async fn a_key_past_its_cap_of_batches_in_progress_is_refused_with_429() {
    let gw = slow(Gateway::builder())
        .arg("--batch-max-in-progress")
        .arg("1")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let first = gw
        .post_json("/v1/messages/batches", &key.secret, &one_batch(1))
        .await;
    first.expect_ok();
    let second = gw
        .post_json("/v1/messages/batches", &key.secret, &one_batch(2))
        .await;
    second.expect_status(429);
    assert_eq!(second.json()["type"], "error");
    assert_eq!(
        second.json()["error"]["type"],
        "rate_limit_error",
        "{}",
        second.json()
    );
    assert!(second.header_u64("retry-after") > 0);
    let other = gw.new_key(1_000_000, &KeySpec::api()).await;
    gw.post_json("/v1/messages/batches", &other.secret, &one_batch(3))
        .await
        .expect_ok();
}

/// Creating a batch is a request against the key's RPM, counted before its items are
/// checked or stored: a key that used its minute on one pod creates no batch on another,
/// which has not seen it over its limit (so nothing refuses it before the handler).
#[tokio::test]
async fn a_key_over_its_rpm_creates_no_batch_on_a_pod_that_had_not_seen_it() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(2, |b| b.database(&pg.url())).await;
    let (first, other) = (&cluster.pods[0], &cluster.pods[1]);
    let key = first.new_key(1_000_000, &KeySpec::tier("free")).await;
    first.wait_for_roomy_window(&key.secret, 30).await;
    for _ in 0..5 {
        first
            .count_tokens(&key.secret, &count_body("svc/haiku", "hi"))
            .await
            .expect_ok();
    }
    other
        .post_json("/v1/messages/batches", &key.secret, &one_batch(1))
        .await
        .expect_rate_limited("requests");
    // Listed by another key of the account: the list counts against RPM too.
    let lister = other.mint_key(&key.account_id, &KeySpec::api()).await;
    let listed = other
        .get("/v1/messages/batches", &lister.secret)
        .await
        .expect_ok();
    assert_eq!(listed["data"], json!([]), "no batch was created: {listed}");
}

#[tokio::test]
async fn bad_batches_and_unknown_ids_get_the_envelope() {
    let gw = Gateway::start().await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let duplicate = json!({"requests": [
        {"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]});
    for body in [
        json!({"requests": []}),
        duplicate,
        json!({"requests": [{"custom_id": "has space", "params": {}}]}),
    ] {
        let refused = gw
            .post_json("/v1/messages/batches", &key.secret, &body)
            .await;
        refused.expect_status(400);
        assert_eq!(refused.json()["error"]["type"], "invalid_request_error");
    }
    for path in [
        "/v1/messages/batches/msgbatch_nope",
        "/v1/messages/batches/msgbatch_nope/results",
    ] {
        let missing = gw.get(path, &key.secret).await;
        missing.expect_status(404);
        assert_eq!(missing.json()["error"]["type"], "not_found_error");
    }
    let bad_limit = gw.get("/v1/messages/batches?limit=0", &key.secret).await;
    bad_limit.expect_status(400);
}

/// Two `serve` pods on one Postgres share a batch; the first is SIGKILLed with items in
/// flight. Its items go back after their 3-second lease and the survivor runs them: every
/// item ends with exactly one result and one completed ledger row, and the balance drops by
/// exactly what the rows billed (the killed pod's reservations are released, billed nothing).
#[tokio::test]
async fn a_pod_killed_mid_batch_loses_no_item_and_bills_each_once() {
    const N: usize = 24;
    let pg = PostgresServer::start().await;
    let mut cluster = Cluster::start(2, |b| {
        b.database(&pg.url())
            .chunk_delay_ms(40)
            .arg("--batch-concurrency")
            .arg("2")
            .arg("--batch-lease-secs")
            .arg("3")
            .arg("--batch-poll-ms")
            .arg("100")
            .arg("--reaper-stale-secs")
            .arg("2")
            .arg("--allotment-turns")
            .arg("0")
    })
    .await;
    let key = cluster.pods[0].new_key(1_000_000, &KeySpec::api()).await;
    let before = cluster.pods[1].balance(&key.secret).await;
    let requests: Vec<Value> = (0..N)
        .map(|i| {
            json!({"custom_id": format!("req-{i}"), "params": {"model": "svc/haiku", "max_tokens": 32,
                   "messages": [{"role": "user", "content": format!("Question number {i}")}]}})
        })
        .collect();
    let created = cluster.pods[0]
        .post_json(
            "/v1/messages/batches",
            &key.secret,
            &json!({ "requests": requests }),
        )
        .await
        .expect_ok();
    let path = format!(
        "/v1/messages/batches/{}",
        created["id"].as_str().expect("id")
    );
    let succeeded = |batch: &Value| batch["request_counts"]["succeeded"].as_u64().unwrap_or(0);
    // Killed once a few items have succeeded and at least three are in flight: each pod runs
    // at most two at once, so the pod killed holds at least one.
    let account = &key.account_id;
    poll_until(
        "a few items to succeed and three in flight",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async {
            let batch = cluster.pods[1].get(&path, &key.secret).await.expect_ok();
            let in_flight = pg
                .query_i64(&format!(
                    "SELECT count(*) FROM message_rows WHERE account_id = '{account}' AND status = 'reserved'"
                ))
                .await;
            (succeeded(&batch) >= 4 && in_flight >= 3).then_some(())
        },
    )
    .await;
    cluster.pods[0].kill_9().await;

    let survivor = &cluster.pods[1];
    let ended = poll_until(
        "the batch to end on the survivor",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            let batch = survivor.get(&path, &key.secret).await.expect_ok();
            (batch["processing_status"] == "ended").then_some(batch)
        },
    )
    .await;
    assert_eq!(succeeded(&ended), N as u64, "{ended}");
    // JSONL, not one JSON body: each line is checked for provider names as JSON.
    let results = survivor
        .request(Method::GET, &format!("{path}/results"), Some(&key.secret))
        .send()
        .await
        .expect("results");
    assert_eq!(results.status(), 200);
    let text = results.text().await.expect("the results file");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    lines.iter().for_each(leak::assert_no_provider_names);
    let ids: std::collections::HashSet<&str> = lines
        .iter()
        .filter_map(|l| l["custom_id"].as_str())
        .collect();
    assert_eq!((lines.len(), ids.len()), (N, N), "one result per item");

    survivor.wait_settled(&key.account_id).await;
    let completed = pg
        .query_i64(&format!(
            "SELECT count(*) FROM messages WHERE account_id = '{account}' AND status = 'completed'"
        ))
        .await;
    assert_eq!(completed, N as i64, "one completed ledger row per item");
    let pods = pg
        .query_i64(&format!(
            "SELECT count(DISTINCT instance_id) FROM messages WHERE account_id = '{account}'"
        ))
        .await;
    assert_eq!(pods, 2, "both pods ran items");
    let billed = pg
        .query_i64(&format!(
            "SELECT sum(billed) FROM messages WHERE account_id = '{account}'"
        ))
        .await;
    let cut_but_billed = pg
        .query_i64(&format!(
            "SELECT count(*) FROM messages WHERE account_id = '{account}' AND status <> 'completed' AND billed > 0"
        ))
        .await;
    assert_eq!(
        cut_but_billed, 0,
        "an item cut by the kill is billed nothing"
    );
    let cut = pg
        .query_i64(&format!(
            "SELECT count(*) FROM messages WHERE account_id = '{account}' AND status <> 'completed'"
        ))
        .await;
    assert!(cut > 0, "the kill cut items in flight, which ran again");
    assert_eq!(before - survivor.balance(&key.secret).await, billed);
}

/// A route's `batchPriceRatio` is what its batch items cost of the same turn sent alone: at 1
/// the same; unset, the deployment's default (`--batch-price-percent`, 50: half).
#[tokio::test]
async fn a_routes_batch_price_ratio_sets_what_its_items_cost() {
    let mock = MockUpstream::start().await;
    let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
    let models = manifests.path.join("models.yaml");
    let routes = std::fs::read_to_string(&models).expect("read models.yaml");
    let sonnet = "\n  model: svc/sonnet\n";
    assert!(routes.contains(sonnet), "{routes}");
    let routes = routes.replace(sonnet, "\n  model: svc/sonnet\n  batchPriceRatio: 1.0\n");
    std::fs::write(&models, routes).expect("write models.yaml");
    let gw = Gateway::builder()
        .manifests(&manifests.path)
        .arg("--batch-poll-ms")
        .arg("50")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::api()).await;
    let params = |model: &str| {
        json!({"model": model, "max_tokens": 64,
               "messages": [{"role": "user", "content": "What does a batch item cost?"}]})
    };
    let requests: Vec<Value> = ["svc/sonnet", "svc/haiku"]
        .iter()
        .map(|model| json!({"custom_id": model.replace('/', "-"), "params": params(model)}))
        .collect();
    let created = gw
        .post_json(
            "/v1/messages/batches",
            &key.secret,
            &json!({"requests": requests}),
        )
        .await
        .expect_ok();
    let id = created["id"].as_str().expect("id");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let batch = gw
            .get(&format!("/v1/messages/batches/{id}"), &key.secret)
            .await
            .expect_ok();
        if batch["processing_status"] == "ended" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{batch}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let results = gw
        .get(&format!("/v1/messages/batches/{id}/results"), &key.secret)
        .await;
    let mut items = HashMap::new();
    for line in results.text.lines() {
        let line: Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(line["result"]["type"], "succeeded", "{line}");
        let message_id = line["result"]["message"]["id"].as_str().expect("id");
        let row = gw.message_record(message_id).await;
        items.insert(
            line["custom_id"].as_str().expect("custom_id").to_owned(),
            row,
        );
    }
    for (model, same_price) in [("svc/sonnet", true), ("svc/haiku", false)] {
        let alone = gw
            .post_json("/v1/messages", &key.secret, &params(model))
            .await
            .expect_ok();
        let interactive = gw.message_record(alone["id"].as_str().expect("id")).await;
        let item = &items[&model.replace('/', "-")];
        assert_eq!(interactive["usage"], item["usage"], "the same turn");
        let (full, billed) = (
            interactive["billed"].as_i64().expect("billed"),
            item["billed"].as_i64().expect("billed"),
        );
        assert!(full > 1, "{interactive}");
        if same_price {
            assert_eq!(billed, full, "{model} at ratio 1 costs the same");
        } else {
            assert!(
                (full / 2..=(full + 1) / 2).contains(&billed),
                "{model} at the default costs half: {billed} of {full}"
            );
        }
    }
}
