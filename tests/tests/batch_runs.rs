//! Batches of 1,000 requests (text, tools, one invalid) through each upstream adapter, as the
//! official SDKs run them: the `anthropic` and `openai` Python SDKs and the TypeScript
//! `@anthropic-ai/sdk`, on the real gateway binary against the mock upstream. Every result is
//! read by `custom_id` (text for a text request, a tool call for one offering the tool, the
//! 400 envelope for the invalid one), and the balance drops by exactly the sum of the items'
//! ledger rows.

use std::collections::HashMap;
use std::path::PathBuf;

use e2e::gateway::workspace_root;
use e2e::upstream::Unscripted;
use e2e::*;
use futures::StreamExt;
use serde_json::{json, Value};

/// Requests per batch, the invalid one not counted.
const N: usize = 1_000;
const TOOL: &str = "get_weather";
const ANSWER: &str = "It is sunny in Paris.";

/// Runs a Message Batch with the `anthropic` Python SDK (every odd request offers the tool;
/// the invalid one has no `max_tokens`); prints each result by custom_id.
const PYTHON_ANTHROPIC: &str = r#"
import sys, json, time, anthropic
base, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tools = [{"name": "get_weather", "description": "The weather in a city now.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}]
def params(i):
    p = {"model": "svc/haiku", "max_tokens": 64,
         "messages": [{"role": "user", "content": f"Question number {i}"}]}
    if i % 2:
        p["tools"] = tools
    return p
requests = [{"custom_id": f"req-{i}", "params": params(i)} for i in range(n)]
requests.append({"custom_id": "invalid",
                 "params": {"model": "svc/haiku", "messages": [{"role": "user", "content": "hi"}]}})
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
batch = client.messages.batches.create(requests=requests)
deadline = time.time() + 110
while batch.processing_status != "ended":
    if time.time() > deadline:
        raise SystemExit("the batch did not end: " + batch.model_dump_json())
    time.sleep(0.1)
    batch = client.messages.batches.retrieve(batch.id)
results = {}
for r in client.messages.batches.results(batch.id):
    if r.result.type == "succeeded":
        m = r.result.message
        results[r.custom_id] = {"type": "succeeded", "id": m.id,
                                "kinds": [b.type for b in m.content]}
    else:
        error = r.result.error.model_dump(mode="json") if r.result.type == "errored" else None
        results[r.custom_id] = {"type": r.result.type, "error": error}
print(json.dumps({"batch": batch.id, "results": results}))
"#;

/// Runs an OpenAI batch of `/v1/chat/completions` with the `openai` Python SDK; prints each
/// result by custom_id, from the output and error files.
const PYTHON_OPENAI: &str = r#"
import sys, json, time, openai
base, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
tools = [{"type": "function", "function": {"name": "get_weather",
          "description": "The weather in a city now.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]
def body(i):
    b = {"model": "svc/haiku", "max_tokens": 64,
         "messages": [{"role": "user", "content": f"Question number {i}"}]}
    if i % 2:
        b["tools"] = tools
    return b
line = lambda custom_id, body: json.dumps({"custom_id": custom_id, "method": "POST",
                                           "url": "/v1/chat/completions", "body": body})
lines = [line(f"req-{i}", body(i)) for i in range(n)]
lines.append(line("invalid", {"model": "svc/haiku", "max_tokens": 64}))
uploaded = client.files.create(file=("input.jsonl", "\n".join(lines).encode()), purpose="batch")
batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
deadline = time.time() + 110
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    if time.time() > deadline:
        raise SystemExit("the batch did not end: " + batch.model_dump_json())
    time.sleep(0.1)
    batch = client.batches.retrieve(batch.id)
results = {}
for text in (client.files.content(batch.output_file_id).text,
             client.files.content(batch.error_file_id).text):
    for l in text.splitlines():
        r = json.loads(l)
        response = r["response"]
        if response["status_code"] == 200:
            message = response["body"]["choices"][0]["message"]
            kinds = (["tool_use"] if message.get("tool_calls") else []) + \
                    (["text"] if message.get("content") else [])
            results[r["custom_id"]] = {"type": "succeeded", "id": response["request_id"],
                                       "kinds": kinds}
        else:
            results[r["custom_id"]] = {"type": "errored", "error": response["body"]}
print(json.dumps({"batch": batch.id, "results": results}))
"#;

/// Runs a Message Batch with the TypeScript `@anthropic-ai/sdk`; prints each result by
/// custom_id.
const NODE_ANTHROPIC: &str = r#"
const Anthropic = require('@anthropic-ai/sdk');
const [base, apiKey, n] = process.argv.slice(1);
const tools = [{ name: 'get_weather', description: 'The weather in a city now.',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const requests = [];
for (let i = 0; i < Number(n); i++) {
  const params = { model: 'svc/haiku', max_tokens: 64,
    messages: [{ role: 'user', content: `Question number ${i}` }] };
  if (i % 2) params.tools = tools;
  requests.push({ custom_id: `req-${i}`, params });
}
requests.push({ custom_id: 'invalid',
  params: { model: 'svc/haiku', messages: [{ role: 'user', content: 'hi' }] } });
(async () => {
  const client = new Anthropic({ baseURL: base, apiKey, maxRetries: 0 });
  let batch = await client.messages.batches.create({ requests });
  const deadline = Date.now() + 110_000;
  while (batch.processing_status !== 'ended') {
    if (Date.now() > deadline) throw new Error(`the batch did not end: ${JSON.stringify(batch)}`);
    await new Promise((r) => setTimeout(r, 100));
    batch = await client.messages.batches.retrieve(batch.id);
  }
  const results = {};
  for await (const r of await client.messages.batches.results(batch.id)) {
    if (r.result.type === 'succeeded') {
      const m = r.result.message;
      results[r.custom_id] = { type: 'succeeded', id: m.id, kinds: m.content.map((b) => b.type) };
    } else {
      results[r.custom_id] = { type: r.result.type, error: r.result.error ?? null };
    }
  }
  console.log(JSON.stringify({ batch: batch.id, results }));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

enum Client {
    PythonAnthropic,
    PythonOpenai,
    NodeAnthropic,
}

/// `$NODE_CLIENTS`, else the packages scripts/test installs under `.cache/node-clients`.
fn node_modules() -> PathBuf {
    let modules = std::env::var_os("NODE_CLIENTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache/node-clients/node_modules"));
    assert!(
        modules.join("@anthropic-ai/sdk").exists(),
        "@anthropic-ai/sdk is not installed at {}; run scripts/test",
        modules.display()
    );
    modules
}

/// Runs the client's batch of `N` requests and the invalid one; what it read.
async fn run(gw: &Gateway, client: &Client, key: &str) -> Value {
    let n = N.to_string();
    let base = gw.url("");
    let mut command = match client {
        Client::NodeAnthropic => {
            let mut node = tokio::process::Command::new("node");
            node.arg("-e")
                .arg(NODE_ANTHROPIC)
                .args([&base, key, &n])
                .env("NODE_PATH", node_modules());
            node
        }
        Client::PythonAnthropic | Client::PythonOpenai => {
            let python = workspace_root().join(".cache/venv/bin/python");
            assert!(
                python.exists(),
                "{} is missing: run scripts/test",
                python.display()
            );
            let mut py = tokio::process::Command::new(python);
            let script = match client {
                Client::PythonOpenai => PYTHON_OPENAI,
                _ => PYTHON_ANTHROPIC,
            };
            py.arg("-c").arg(script).args([&base, key, &n]);
            py
        }
    };
    let out = command
        .env("NO_PROXY", "127.0.0.1")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "the SDK run failed: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            gw.logs()
        )
    })
}

/// Through each adapter: every result read by custom_id as its request asked, the invalid one
/// errored with the 400 envelope, and the balance drops by exactly the items' ledger rows.
async fn a_batch_of_1000_runs_through_each_adapter(client: Client) {
    for provider in ["anthropic", "openai"] {
        let agent = Unscripted::Agent {
            tool: TOOL.to_owned(),
            input: json!({"city": "Paris"}),
            answer: ANSWER.to_owned(),
        };
        let mock = MockUpstream::serve("127.0.0.1:0", agent, false).await;
        let upstream = match provider {
            "anthropic" => UpstreamDef::anthropic(&mock),
            _ => UpstreamDef::openai(&mock),
        };
        let manifests = RoutedManifests::new(&[upstream]);
        let gw = Gateway::builder()
            .manifests(&manifests.path)
            .arg("--batch-concurrency")
            .arg("32")
            .arg("--batch-poll-ms")
            .arg("20")
            .start()
            .await;
        let key = gw.new_key(10_000_000, &KeySpec::api()).await;
        let before = gw.balance(&key.secret).await;
        let report = run(&gw, &client, &key.secret).await;
        let results = report["results"].as_object().expect("results");
        assert_eq!(results.len(), N + 1, "{provider}: every custom_id once");
        let mut ids = Vec::with_capacity(N);
        for i in 0..N {
            let result = &results[&format!("req-{i}")];
            assert_eq!(result["type"], "succeeded", "{provider} req-{i}: {result}");
            let kinds = if i % 2 == 1 {
                json!(["tool_use"])
            } else {
                json!(["text"])
            };
            assert_eq!(result["kinds"], kinds, "{provider} req-{i}: {result}");
            ids.push(result["id"].as_str().expect("id").to_owned());
        }
        let invalid = &results["invalid"];
        assert_eq!(invalid["type"], "errored", "{invalid}");
        assert_eq!(
            invalid["error"]["error"]["type"], "invalid_request_error",
            "{invalid}"
        );

        let rows: Vec<Value> = futures::stream::iter(&ids)
            .map(|id| gw.message_record(id))
            .buffer_unordered(16)
            .collect()
            .await;
        let mut billed = HashMap::new();
        for row in &rows {
            assert_eq!(row["batch_id"], report["batch"], "{row}");
            assert_eq!(row["status"], "completed", "{row}");
            billed.insert(row["id"].clone(), row["billed"].as_i64().expect("billed"));
        }
        assert_eq!(billed.len(), N, "one ledger row per item");
        gw.wait_settled(&key.account_id).await;
        let spent = before - gw.balance(&key.secret).await;
        assert!(spent > 0, "{provider}");
        assert_eq!(
            spent,
            billed.values().sum::<i64>(),
            "{provider}: the balance drops by the items' bills"
        );
    }
}

#[tokio::test]
async fn the_anthropic_python_sdk_runs_a_batch_of_1000_through_each_adapter() {
    a_batch_of_1000_runs_through_each_adapter(Client::PythonAnthropic).await;
}

#[tokio::test]
async fn the_openai_python_sdk_runs_a_batch_of_1000_through_each_adapter() {
    a_batch_of_1000_runs_through_each_adapter(Client::PythonOpenai).await;
}

#[tokio::test]
async fn the_anthropic_typescript_sdk_runs_a_batch_of_1000_through_each_adapter() {
    a_batch_of_1000_runs_through_each_adapter(Client::NodeAnthropic).await;
}
