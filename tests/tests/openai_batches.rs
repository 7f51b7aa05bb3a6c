//! OpenAI's Batch API (`/v1/batches` over `/v1/files`) as the official `openai` Python SDK
//! calls it, on the real gateway binary, standalone and `serve` on Postgres: a JSONL of
//! requests and one invalid runs to completion, every `custom_id` is found once in the output
//! and error files, and the balance drops by exactly the ledger rows of its items, each at the
//! batch price; another account reads neither the file nor the batch; bad input gets the
//! envelope with its status.

use std::collections::HashMap;
use std::time::Duration;

use e2e::gateway::workspace_root;
use e2e::*;
use serde_json::{json, Value};

/// Uploads `n` requests and one invalid (no `messages`) as JSONL, creates the batch, waits for
/// it to end, reads its output and error files and their file objects, lists, and tries the
/// file, the batch and its output with another account's key; prints what it saw as JSON.
const SDK_RUN: &str = r#"
import sys, json, time, openai
base, key, other_key, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
line = lambda custom_id, body: json.dumps({"custom_id": custom_id, "method": "POST",
                                           "url": "/v1/chat/completions", "body": body})
lines = [line(f"req-{i}", {"model": "svc/haiku", "max_tokens": 32,
              "messages": [{"role": "user", "content": f"Question number {i}"}]}) for i in range(n)]
lines.append(line("invalid", {"model": "svc/haiku", "max_tokens": 32}))
uploaded = client.files.create(file=("input.jsonl", "\n".join(lines).encode()), purpose="batch")
batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                              completion_window="24h", metadata={"job": "nightly"})
created = batch.model_dump(mode="json")
deadline = time.time() + 180
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    if time.time() > deadline:
        raise SystemExit("the batch did not end: " + batch.model_dump_json())
    time.sleep(0.2)
    batch = client.batches.retrieve(batch.id)
output = client.files.content(batch.output_file_id).text
errors = client.files.content(batch.error_file_id).text
output_file = client.files.retrieve(batch.output_file_id).model_dump(mode="json")
listed = [b.id for b in client.batches.list(limit=1)]
files = [f.id for f in client.files.list(purpose="batch")]
input_back = client.files.content(uploaded.id).text
other = openai.OpenAI(base_url=base + "/v1", api_key=other_key, max_retries=0)
def status(call):
    try:
        call()
        return 200
    except openai.APIStatusError as e:
        return e.status_code
others = {
    "file": status(lambda: other.files.retrieve(uploaded.id)),
    "content": status(lambda: other.files.content(uploaded.id)),
    "delete": status(lambda: other.files.delete(uploaded.id)),
    "batch": status(lambda: other.batches.retrieve(batch.id)),
    "cancel": status(lambda: other.batches.cancel(batch.id)),
    "output": status(lambda: other.files.content(batch.output_file_id)),
    "listed": [b.id for b in other.batches.list()],
}
deleted = client.files.delete(uploaded.id).deleted
print(json.dumps({"uploaded": uploaded.model_dump(mode="json"), "created": created,
                  "ended": batch.model_dump(mode="json"), "output": output, "errors": errors,
                  "output_file": output_file, "listed": listed, "files": files,
                  "input_back": input_back == "\n".join(lines), "others": others,
                  "deleted": deleted}))
"#;

/// Bad input through the SDK: each call's status and the body it got.
const SDK_BAD_INPUT: &str = r#"
import sys, json, openai
base, key, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "svc/haiku", "max_tokens": 8,
                            "messages": [{"role": "user", "content": "hi"}]}})
uploaded = client.files.create(file=("in.jsonl", good.encode()), purpose="batch")
# A well-formed JSONL whose lines are not batch requests: the batch is created, failed.
malformed = client.files.create(file=("in.jsonl", (good + "\n" + good + "\n" +
    json.dumps({"custom_id": "b", "method": "GET", "url": "/v1/chat/completions", "body": {}})).encode()),
    purpose="batch")
failed = client.batches.create(input_file_id=malformed.id, endpoint="/v1/chat/completions",
                               completion_window="24h")
# Just under the cap: a file of chat requests is kept as bytes, whatever it would take parsed.
lines, size = [], 0
while size < cap - 200_000:
    lines.append(good.replace('"a"', f'"r{len(lines)}"'))
    size += len(lines[-1]) + 1
under_cap = client.files.create(file=("big.jsonl", "\n".join(lines).encode()), purpose="batch")
# One line of a million tiny objects: a valid upload, too costly to parse at the create.
tiny = client.files.create(file=("tiny.jsonl", ('{"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [' + ",".join(["{}"] * 1_000_000) + "]}}").encode()), purpose="batch")
print(json.dumps({
    "wrong_purpose": refused(lambda: client.files.create(file=("in.jsonl", good.encode()), purpose="fine-tune")),
    "not_jsonl": refused(lambda: client.files.create(file=("in.jsonl", b"{\"a\": 1}\nnot json\n"), purpose="batch")),
    "over_cap": refused(lambda: client.files.create(file=("in.jsonl", b"{}\n" * (cap // 3 + 1)), purpose="batch")),
    "unknown_file": refused(lambda: client.batches.create(input_file_id="file-nope",
        endpoint="/v1/chat/completions", completion_window="24h")),
    "wrong_endpoint": refused(lambda: client.batches.create(input_file_id=uploaded.id,
        endpoint="/v1/embeddings", completion_window="24h")),
    "wrong_window": refused(lambda: client.batches.create(input_file_id=uploaded.id,
        endpoint="/v1/chat/completions", completion_window="1h")),
    "unknown_batch": refused(lambda: client.batches.retrieve("batch_nope")),
    "unknown_content": refused(lambda: client.files.content("file-nope")),
    "failed": failed.model_dump(mode="json"),
    "under_cap": under_cap.bytes,
    "tiny_objects": refused(lambda: client.batches.create(input_file_id=tiny.id,
        endpoint="/v1/chat/completions", completion_window="24h")),
    "newest_first": [f.id for f in client.files.list()],
    "oldest_first": [f.id for f in client.files.list(order="asc")],
    "bad_order": refused(lambda: client.files.list(order="sideways")),
}))
"#;

/// What every script of [`python`] may call: a call's refusal as `{status, body}`, or
/// `{status: 200}` when it was not refused.
const REFUSED: &str = r#"
def refused(call):
    import openai
    try:
        call()
        return {"status": 200}
    except openai.APIStatusError as e:
        return {"status": e.status_code, "body": e.response.json()}
"#;

/// Runs `script` (after [`REFUSED`]) with the official `openai` SDK against `gw`: the gateway's
/// URL, then `args`, as its arguments; what it printed, as JSON.
async fn python(gw: &Gateway, script: &str, args: &[&str]) -> Value {
    let python = workspace_root().join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test creates the venv with the openai SDK",
        python.display()
    );
    let out = tokio::process::Command::new(python)
        .arg("-c")
        .arg(format!("{REFUSED}{script}"))
        .arg(gw.url(""))
        .args(args)
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

/// The lines of a results file, by custom_id; each custom_id once.
fn by_custom_id(file: &Value) -> HashMap<String, Value> {
    let mut lines = HashMap::new();
    for text in file.as_str().expect("file text").lines() {
        let line: Value = serde_json::from_str(text).expect("a JSON line");
        let custom_id = line["custom_id"].as_str().expect("custom_id").to_owned();
        assert!(
            lines.insert(custom_id.clone(), line).is_none(),
            "{custom_id} twice"
        );
    }
    lines
}

async fn a_batch_runs_to_completion_billed_per_item_at_the_batch_price(gw: &Gateway) {
    const N: usize = 36;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let other = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let run = python(gw, SDK_RUN, &[&key.secret, &other.secret, &N.to_string()]).await;

    let uploaded = &run["uploaded"];
    assert_eq!(
        (&uploaded["object"], &uploaded["purpose"]),
        (&json!("file"), &json!("batch"))
    );
    assert_eq!(run["input_back"], true, "the upload reads back whole");
    assert_eq!(run["files"], json!([uploaded["id"]]));
    let created = &run["created"];
    assert_eq!(created["object"], "batch", "{created}");
    assert_eq!(created["input_file_id"], uploaded["id"]);
    assert_eq!(created["metadata"], json!({"job": "nightly"}));
    assert_eq!(created["request_counts"]["total"], N + 1, "{created}");

    let ended = &run["ended"];
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(
        ended["request_counts"],
        json!({"total": N + 1, "completed": N, "failed": 1}),
        "{ended}"
    );
    assert!(
        ended["completed_at"].is_i64() && ended["errors"].is_null(),
        "{ended}"
    );
    assert_eq!(run["listed"], json!([created["id"]]));
    let output_file = &run["output_file"];
    assert_eq!(output_file["id"], ended["output_file_id"]);
    assert_eq!(
        output_file["bytes"].as_u64(),
        run["output"].as_str().map(|o| o.len() as u64),
        "{output_file}"
    );

    let output = by_custom_id(&run["output"]);
    let errors = by_custom_id(&run["errors"]);
    assert_eq!((output.len(), errors.len()), (N, 1));
    for i in 0..N {
        let line = &output[&format!("req-{i}")];
        let response = &line["response"];
        assert_eq!(response["status_code"], 200, "{line}");
        assert_eq!(response["body"]["object"], "chat.completion", "{line}");
        assert_eq!(response["body"]["id"], response["request_id"], "{line}");
        assert!(line["error"].is_null(), "{line}");
    }
    let invalid = &errors["invalid"]["response"];
    assert_eq!(invalid["status_code"], 400, "{invalid}");
    assert_eq!(invalid["body"]["error"]["type"], "invalid_request_error");

    let others = &run["others"];
    for call in ["file", "content", "delete", "batch", "cancel", "output"] {
        assert_eq!(others[call], 404, "another account's {call}: {others}");
    }
    assert_eq!(others["listed"], json!([]));
    assert_eq!(run["deleted"], true);

    // Each item's ledger row names the batch; the balance drops by exactly their sum.
    let mut billed = 0;
    let mut rows = HashMap::new();
    for (custom_id, line) in &output {
        let id = line["response"]["request_id"].as_str().expect("request_id");
        let row = gw.message_record(id).await;
        assert_eq!(&row["batch_id"], &created["id"], "{row}");
        assert_eq!(row["endpoint"], "chat_completions_batches", "{row}");
        assert_eq!(row["status"], "completed", "{row}");
        billed += row["billed"].as_i64().expect("billed");
        rows.insert(custom_id.clone(), row);
    }
    gw.wait_settled(&key.account_id).await;
    let spent = before - gw.balance(&key.secret).await;
    assert!(spent > 0);
    assert_eq!(spent, billed, "the balance drops by the items' ledger rows");

    // The same request sent alone costs twice as much (to the rounding of each bill).
    let alone = gw
        .post_json(
            "/v1/chat/completions",
            &other.secret,
            &json!({"model": "svc/haiku", "max_tokens": 32,
                    "messages": [{"role": "user", "content": "Question number 0"}]}),
        )
        .await
        .expect_ok();
    let interactive = gw.message_record(alone["id"].as_str().expect("id")).await;
    let item = &rows["req-0"];
    assert_eq!(interactive["usage"], item["usage"], "the same turn");
    let (full, half) = (
        interactive["billed"].as_i64().expect("billed"),
        item["billed"].as_i64().expect("billed"),
    );
    assert!(
        full > 1 && (full / 2..=(full + 1) / 2).contains(&half),
        "a batch item costs half: {half} of {full}"
    );
}

#[tokio::test]
async fn standalone_a_batch_runs_to_completion_billed_per_item_at_the_batch_price() {
    let gw = Gateway::start().await;
    a_batch_runs_to_completion_billed_per_item_at_the_batch_price(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_batch_runs_to_completion_billed_per_item_at_the_batch_price() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_batch_runs_to_completion_billed_per_item_at_the_batch_price(&cluster.pods[0]).await;
}

fn expect_envelope(run: &Value, call: &str, status: u16, kind: &str) {
    let got = &run[call];
    assert_eq!(got["status"], status, "{call}: {got}");
    assert_eq!(got["body"]["type"], "error", "{call}: {got}");
    assert_eq!(got["body"]["error"]["type"], kind, "{call}: {got}");
}

async fn bad_input_gets_the_envelope_with_its_status(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let cap = 16 * 1024 * 1024;
    let run = python(gw, SDK_BAD_INPUT, &[&key.secret, &cap.to_string()]).await;
    expect_envelope(&run, "wrong_purpose", 400, "invalid_request_error");
    expect_envelope(&run, "not_jsonl", 400, "invalid_request_error");
    expect_envelope(&run, "over_cap", 413, "request_too_large");
    expect_envelope(&run, "unknown_file", 404, "not_found_error");
    expect_envelope(&run, "wrong_endpoint", 400, "invalid_request_error");
    expect_envelope(&run, "wrong_window", 400, "invalid_request_error");
    expect_envelope(&run, "unknown_batch", 404, "not_found_error");
    expect_envelope(&run, "unknown_content", 404, "not_found_error");
    expect_envelope(&run, "tiny_objects", 413, "request_too_large");
    expect_envelope(&run, "bad_order", 400, "invalid_request_error");
    // `order=asc` lists the same files from the other end.
    let newest_first = run["newest_first"].as_array().expect("a list");
    let mut oldest_first = run["oldest_first"].as_array().expect("a list").clone();
    assert!(newest_first.len() >= 4, "{run}");
    oldest_first.reverse();
    assert_eq!(&oldest_first, newest_first, "{run}");
    let under_cap = run["under_cap"]
        .as_u64()
        .expect("the upload under the cap is kept");
    assert!(under_cap > cap as u64 - 300_000, "{under_cap}");
    let failed = &run["failed"];
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failed["failed_at"].is_i64(), "{failed}");
    let codes: Vec<(&Value, &Value)> = failed["errors"]["data"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| (&e["code"], &e["line"]))
        .collect();
    assert_eq!(
        codes,
        [
            (&json!("duplicate_custom_id"), &json!(2)),
            (&json!("invalid_value"), &json!(3))
        ],
        "{failed}"
    );
    assert_eq!(failed["request_counts"]["total"], 0, "{failed}");
}

#[tokio::test]
async fn standalone_bad_input_gets_the_envelope_with_its_status() {
    let gw = Gateway::start().await;
    bad_input_gets_the_envelope_with_its_status(&gw).await;
}

#[tokio::test]
async fn in_postgres_bad_input_gets_the_envelope_with_its_status() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    bad_input_gets_the_envelope_with_its_status(&cluster.pods[0]).await;
}

/// A batch of `/v1/responses` requests and one invalid: waits for it to end, reads its output
/// and error files, lists the files, deletes the output file and reads it again.
const SDK_RESPONSES: &str = r#"
import sys, json, time, openai
base, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
line = lambda custom_id, body: json.dumps({"custom_id": custom_id, "method": "POST",
                                           "url": "/v1/responses", "body": body})
lines = [line(f"req-{i}", {"model": "svc/haiku", "max_output_tokens": 32,
                           "instructions": "Be brief.", "input": f"Question number {i}"})
         for i in range(n)]
lines.append(line("invalid", {"model": "svc/haiku", "input": 42}))
uploaded = client.files.create(file=("input.jsonl", "\n".join(lines).encode()), purpose="batch")
batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/responses",
                              completion_window="24h")
deadline = time.time() + 180
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    if time.time() > deadline:
        raise SystemExit("the batch did not end: " + batch.model_dump_json())
    time.sleep(0.2)
    batch = client.batches.retrieve(batch.id)
output = client.files.content(batch.output_file_id).text
errors = client.files.content(batch.error_file_id).text
listed = [f.model_dump(mode="json") for f in client.files.list(purpose="batch_output")]
deleted = client.files.delete(batch.output_file_id).deleted
try:
    client.files.content(batch.output_file_id)
    after_delete = 200
except openai.APIStatusError as e:
    after_delete = e.status_code
print(json.dumps({"ended": batch.model_dump(mode="json"), "output": output, "errors": errors,
                  "listed": listed, "deleted": deleted, "after_delete": after_delete,
                  "listed_after": [f.id for f in client.files.list()]}))
"#;

/// A batch of `/v1/responses` runs each item through the same turn as `POST /v1/responses`:
/// its output line holds a Responses object, its ledger row names the batch and the responses
/// batch endpoint, the balance drops by exactly their bills; the invalid body ends in the
/// error file with its 400. The output and error files are listed as `batch_output` with their
/// size, and deleting one removes it.
async fn a_responses_batch_answers_responses_objects_and_lists_its_files(gw: &Gateway) {
    const N: usize = 12;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let run = python(gw, SDK_RESPONSES, &[&key.secret, &N.to_string()]).await;
    let ended = &run["ended"];
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["endpoint"], "/v1/responses", "{ended}");
    assert_eq!(
        ended["request_counts"],
        json!({"total": N + 1, "completed": N, "failed": 1}),
        "{ended}"
    );
    let output = by_custom_id(&run["output"]);
    let errors = by_custom_id(&run["errors"]);
    assert_eq!((output.len(), errors.len()), (N, 1), "{run}");
    let mut billed = 0;
    for i in 0..N {
        let line = &output[&format!("req-{i}")];
        let response = &line["response"];
        assert_eq!(response["status_code"], 200, "{line}");
        let body = &response["body"];
        assert_eq!(
            (&body["object"], &body["status"]),
            (&json!("response"), &json!("completed")),
            "{line}"
        );
        assert_eq!(body["id"], response["request_id"], "{line}");
        assert_eq!(body["instructions"], "Be brief.", "{line}");
        assert_eq!(body["output"][0]["type"], "message", "{line}");
        let row = gw.message_record(body["id"].as_str().expect("id")).await;
        assert_eq!(row["endpoint"], "responses_batches", "{row}");
        assert_eq!(&row["batch_id"], &ended["id"], "{row}");
        assert_eq!(
            body["usage"]["credits_consumed"], row["billed"],
            "the response tells its bill: {row}"
        );
        billed += row["billed"].as_i64().expect("billed");
    }
    let invalid = &errors["invalid"]["response"];
    assert_eq!(invalid["status_code"], 400, "{invalid}");
    assert_eq!(invalid["body"]["error"]["type"], "invalid_request_error");
    gw.wait_settled(&key.account_id).await;
    let spent = before - gw.balance(&key.secret).await;
    assert!(spent > 0);
    assert_eq!(spent, billed, "the balance drops by the items' ledger rows");

    let listed = run["listed"].as_array().expect("a list");
    let ids: Vec<&Value> = listed.iter().map(|f| &f["id"]).collect();
    assert_eq!(ids.len(), 2, "{listed:?}");
    assert!(ids.contains(&&ended["output_file_id"]) && ids.contains(&&ended["error_file_id"]));
    for file in listed {
        assert_eq!(file["purpose"], "batch_output", "{file}");
        let content = if file["id"] == ended["output_file_id"] {
            &run["output"]
        } else {
            &run["errors"]
        };
        assert_eq!(
            file["bytes"].as_u64(),
            content.as_str().map(|c| c.len() as u64),
            "{file}"
        );
    }
    assert_eq!(run["deleted"], true);
    assert_eq!(run["after_delete"], 404, "a deleted output file is gone");
    let after = run["listed_after"].as_array().expect("a list");
    assert!(!after.contains(&ended["output_file_id"]), "{after:?}");
    assert!(after.contains(&ended["error_file_id"]), "{after:?}");
}

#[tokio::test]
async fn standalone_a_responses_batch_answers_responses_objects_and_lists_its_files() {
    let gw = Gateway::start().await;
    a_responses_batch_answers_responses_objects_and_lists_its_files(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_responses_batch_answers_responses_objects_and_lists_its_files() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_responses_batch_answers_responses_objects_and_lists_its_files(&cluster.pods[0]).await;
}

/// Creates a batch of `n` requests and one invalid, then lists the `batch_output` files until
/// both of its files are there, never retrieving the batch; prints what it listed.
const SDK_FILES_WITHOUT_RETRIEVE: &str = r#"
import sys, json, time, openai
base, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
line = lambda custom_id, body: json.dumps({"custom_id": custom_id, "method": "POST",
                                           "url": "/v1/chat/completions", "body": body})
lines = [line(f"req-{i}", {"model": "svc/haiku", "max_tokens": 16,
              "messages": [{"role": "user", "content": f"Question number {i}"}]}) for i in range(n)]
lines.append(line("invalid", {"model": "svc/haiku", "max_tokens": 16}))
uploaded = client.files.create(file=("input.jsonl", "\n".join(lines).encode()), purpose="batch")
batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
deadline = time.time() + 30
listed = []
while len(listed) < 2 and time.time() < deadline:
    time.sleep(0.1)
    listed = [f.model_dump(mode="json") for f in client.files.list(purpose="batch_output")]
print(json.dumps({"batch": batch.id, "listed": listed}))
"#;

/// The worker that ends a batch's last item records its output and error files: they are
/// listed by `GET /v1/files` without the batch ever being retrieved.
#[tokio::test]
async fn a_batchs_files_are_listed_once_its_last_item_ends() {
    let gw = Gateway::builder()
        .arg("--batch-poll-ms")
        .arg("20")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let run = python(&gw, SDK_FILES_WITHOUT_RETRIEVE, &[&key.secret, "8"]).await;
    let batch = run["batch"].as_str().expect("batch id");
    let mut names: Vec<&str> = run["listed"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| f["filename"].as_str().expect("filename"))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            format!("{batch}_errors.jsonl"),
            format!("{batch}_output.jsonl")
        ],
        "{run}"
    );
}

/// Creates a batch of `n` requests, then another (refused: the key's cap is one in progress),
/// cancels the first, waits for it to end, reads its files, then creates the other again (and
/// cancels it too, reading what of it ran).
const SDK_CANCEL: &str = r#"
import sys, json, time, openai
base, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
lines = [json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "svc/haiku", "max_tokens": 32,
                              "messages": [{"role": "user", "content": f"Question number {i}"}]}})
         for i in range(n)]
uploaded = client.files.create(file=("input.jsonl", "\n".join(lines).encode()), purpose="batch")
create = lambda: client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
batch = create()
try:
    create()
    second = {"status": 200}
except openai.APIStatusError as e:
    second = {"status": e.status_code, "body": e.response.json()}
def cancel(batch):
    cancelling = client.batches.cancel(batch.id).model_dump(mode="json")
    deadline = time.time() + 60
    while batch.status not in ("cancelled", "completed"):
        if time.time() > deadline:
            raise SystemExit("the batch did not end: " + batch.model_dump_json())
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    output = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
    return cancelling, batch, output
cancelling, batch, output = cancel(batch)
errors = client.files.content(batch.error_file_id).text
third = create()
_, _, third_output = cancel(third)
print(json.dumps({"second": second, "cancelling": cancelling, "ended": batch.model_dump(mode="json"),
                  "output": output, "errors": errors, "third": third.status,
                  "third_output": third_output}))
"#;

/// A key's cap of batches in progress counts OpenAI batches (429 past it); cancel stops the
/// queued items, which end in the error file as `batch_cancelled`, billed nothing.
#[tokio::test]
async fn cancel_ends_the_queued_items_in_the_error_file_and_frees_the_cap() {
    const N: usize = 20;
    let gw = Gateway::builder()
        .chunk_delay_ms(40)
        .arg("--batch-concurrency")
        .arg("1")
        .arg("--batch-max-in-progress")
        .arg("1")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let before = gw.balance(&key.secret).await;
    let run = python(&gw, SDK_CANCEL, &[&key.secret, &N.to_string()]).await;
    let second = &run["second"];
    assert_eq!(second["status"], 429, "{second}");
    assert_eq!(
        second["body"]["error"]["type"], "rate_limit_error",
        "{second}"
    );
    assert!(run["cancelling"]["cancelling_at"].is_i64(), "{run}");

    let ended = &run["ended"];
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert!(ended["cancelled_at"].is_i64(), "{ended}");
    let (output, errors) = (by_custom_id(&run["output"]), by_custom_id(&run["errors"]));
    assert_eq!(output.len() + errors.len(), N, "every custom_id once");
    assert!(!errors.is_empty(), "queued items were cancelled: {ended}");
    for line in errors.values() {
        assert_eq!(line["error"]["code"], "batch_cancelled", "{line}");
        assert!(line["response"].is_null(), "{line}");
    }
    assert_eq!(
        ended["request_counts"],
        json!({"total": N, "completed": output.len(), "failed": errors.len()})
    );
    let mut billed = 0;
    let third = by_custom_id(&run["third_output"]);
    for line in output.values().chain(third.values()) {
        let id = line["response"]["request_id"].as_str().expect("request_id");
        billed += gw.message_record(id).await["billed"]
            .as_i64()
            .expect("billed");
    }
    gw.wait_settled(&key.account_id).await;
    assert_eq!(
        before - gw.balance(&key.secret).await,
        billed,
        "only the finished items are billed"
    );
    assert_eq!(run["third"], "in_progress", "the cap is free once it ended");
}

/// Uploads of one account past `--files-account-max-bytes` are refused with the envelope;
/// another account's are not, and a deletion makes room.
#[tokio::test]
async fn uploads_past_the_account_quota_get_the_envelope() {
    const SCRIPT: &str = r#"
import sys, json, openai
base, key, other_key = sys.argv[1], sys.argv[2], sys.argv[3]
upload = lambda k: openai.OpenAI(base_url=base + "/v1", api_key=k, max_retries=0).files.create(
    file=("in.jsonl", b'{"x": "' + b"x" * 590 + b'"}'), purpose="batch")
first = upload(key)
try:
    upload(key)
    second = {"status": 200}
except openai.APIStatusError as e:
    second = {"status": e.status_code, "body": e.response.json()}
other = upload(other_key).bytes
openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0).files.delete(first.id)
print(json.dumps({"first": first.bytes, "second": second, "other": other, "after_delete": upload(key).bytes}))
"#;
    let gw = Gateway::builder()
        .arg("--files-account-max-bytes")
        .arg("1000")
        .start()
        .await;
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let other = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let run = python(&gw, SCRIPT, &[&key.secret, &other.secret]).await;
    assert_eq!(run["first"], 599, "{run}");
    expect_envelope(&run, "second", 400, "invalid_request_error");
    assert_eq!(
        (&run["other"], &run["after_delete"]),
        (&json!(599), &json!(599))
    );
}

/// A batch of `/v1/responses` needs the key's `responses` scope as well as `chat`: a key of
/// `chat` alone is refused at the create (403, the envelope) and may still batch chat requests.
#[tokio::test]
async fn a_responses_batch_needs_the_responses_scope() {
    const SCRIPT: &str = r#"
import sys, json, openai
base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
def create(endpoint):
    body = {"model": "svc/haiku", "max_output_tokens": 8, "input": "hi"} if endpoint == "/v1/responses" \
        else {"model": "svc/haiku", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    line = json.dumps({"custom_id": "a", "method": "POST", "url": endpoint, "body": body})
    uploaded = client.files.create(file=("in.jsonl", line.encode()), purpose="batch")
    try:
        return {"status": 200, "body": client.batches.create(input_file_id=uploaded.id,
            endpoint=endpoint, completion_window="24h").model_dump(mode="json")}
    except openai.APIStatusError as e:
        return {"status": e.status_code, "body": e.response.json()}
print(json.dumps({"responses": create("/v1/responses"), "chat": create("/v1/chat/completions")}))
"#;
    let gw = Gateway::start().await;
    let chat_only = KeySpec {
        scopes: Some(vec!["chat".to_owned()]),
        ..KeySpec::tier("pay_as_you_go")
    };
    let key = gw.new_key(1_000_000, &chat_only).await;
    let run = python(&gw, SCRIPT, &[&key.secret]).await;
    expect_envelope(&run, "responses", 403, "permission_error");
    assert_eq!(run["chat"]["status"], 200, "{run}");
    assert_eq!(run["chat"]["body"]["status"], "in_progress", "{run}");
}

/// Uploads with and without `expires_after`, two it refuses, then waits (at most 30 s) for the
/// default-expiry upload to be gone and at once deletes it (before the sweep may have); prints
/// what it saw.
const SDK_EXPIRY: &str = r#"
import sys, json, time, openai
base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "svc/haiku", "max_tokens": 8,
                            "messages": [{"role": "user", "content": "hi"}]}}).encode()
default = client.files.create(file=("default.jsonl", good), purpose="batch")
hour = client.files.create(file=("hour.jsonl", good), purpose="batch",
                           expires_after={"anchor": "created_at", "seconds": 3600})
too_short = refused(lambda: client.files.create(file=("x.jsonl", good), purpose="batch",
                    expires_after={"anchor": "created_at", "seconds": 60}))
wrong_anchor = refused(lambda: client.files.create(file=("x.jsonl", good), purpose="batch",
                       expires_after={"anchor": "last_active_at", "seconds": 3600}))
listed_before = [f.id for f in client.files.list()]
deadline = time.time() + 30
gone = False
retrieved = None
while time.time() < deadline and not gone:
    try:
        client.files.retrieve(default.id)
        time.sleep(0.25)
    except openai.NotFoundError as e:
        gone = True
        retrieved = {"status": e.status_code, "body": e.response.json()}
try:
    client.files.delete(default.id)
    deleted = {"status": 200}
except openai.NotFoundError as e:
    deleted = {"status": e.status_code, "body": e.response.json(), "not_found_error": True}
content = refused(lambda: client.files.content(default.id))
batch = refused(lambda: client.batches.create(input_file_id=default.id,
                endpoint="/v1/chat/completions", completion_window="24h"))
print(json.dumps({"default": default.model_dump(mode="json"), "hour": hour.model_dump(mode="json"),
                  "too_short": too_short, "wrong_anchor": wrong_anchor, "gone": gone,
                  "retrieved": retrieved, "deleted": deleted,
                  "gone_at": time.time(), "listed_before": listed_before,
                  "listed_after": [f.id for f in client.files.list()], "content": content,
                  "batch": batch, "hour_after": client.files.retrieve(hour.id).model_dump(mode="json")}))
"#;

/// An upload expires as OpenAI's do: `expires_at` is `created_at` plus its `expires_after`
/// seconds (an hour to 30 days; `created_at` the only anchor), or plus `--files-expiry-days`
/// (30 days by default; 4.3 s here) without one. Past it the upload is gone to retrieve, list,
/// content, delete (the SDK's `NotFoundError`, the retrieve's envelope) and a batch's create at
/// once, and the sweep deletes it; the other stays.
async fn an_upload_expires_as_its_expires_after_says(gw: &Gateway) -> Value {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    let run = python(gw, SDK_EXPIRY, &[&key.secret]).await;
    let (default, hour) = (&run["default"], &run["hour"]);
    let created = |file: &Value| file["created_at"].as_i64().expect("created_at");
    let expires = |file: &Value| file["expires_at"].as_i64().expect("expires_at");
    assert_eq!(expires(hour) - created(hour), 3_600, "{hour}");
    let default_after = expires(default) - created(default);
    assert!((4..=5).contains(&default_after), "{default}");
    expect_envelope(&run, "too_short", 400, "invalid_request_error");
    expect_envelope(&run, "wrong_anchor", 400, "invalid_request_error");
    let listed_before = run["listed_before"].as_array().expect("a list");
    assert!(listed_before.contains(&default["id"]), "{run}");
    assert_eq!(run["gone"], true, "the upload is gone once expired: {run}");
    assert!(
        run["gone_at"].as_f64().expect("a time") >= expires(default) as f64,
        "not gone before its expiry: {run}"
    );
    assert_eq!(run["listed_after"], json!([hour["id"]]), "{run}");
    expect_envelope(&run, "retrieved", 404, "not_found_error");
    assert_eq!(
        run["deleted"]["not_found_error"], true,
        "deleting the expired upload raises NotFoundError: {run}"
    );
    expect_envelope(&run, "deleted", 404, "not_found_error");
    assert_eq!(
        run["deleted"]["body"], run["retrieved"]["body"],
        "the delete's envelope is the retrieve's"
    );
    expect_envelope(&run, "content", 404, "not_found_error");
    expect_envelope(&run, "batch", 404, "not_found_error");
    assert_eq!(run["hour_after"], *hour, "the later upload stays");
    run
}

fn expiring(b: GatewayBuilder) -> GatewayBuilder {
    b.arg("--files-expiry-days").arg("0.00005")
}

#[tokio::test]
async fn standalone_an_upload_expires_as_its_expires_after_says() {
    let gw = expiring(Gateway::builder()).start().await;
    an_upload_expires_as_its_expires_after_says(&gw).await;
}

/// On Postgres the sweep's deletion is seen too: the expired upload's row is gone.
#[tokio::test]
async fn in_postgres_an_upload_expires_as_its_expires_after_says() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| expiring(b.database(&pg.url()))).await;
    let run = an_upload_expires_as_its_expires_after_says(&cluster.pods[0]).await;
    let id = run["default"]["id"].as_str().expect("an id");
    let mut rows = 1;
    for _ in 0..40 {
        rows = pg
            .query_i64(&format!("SELECT count(*) FROM files WHERE id = '{id}'"))
            .await;
        if rows == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(rows, 0, "the sweep deleted the expired upload");
    let kept = pg.query_i64("SELECT count(*) FROM files").await;
    assert_eq!(kept, 1, "the later upload is kept");
}
