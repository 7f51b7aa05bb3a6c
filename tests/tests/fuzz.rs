//! Property: whatever arrives (random JSON, a valid request with any field replaced by any
//! value, truncated JSON, huge numbers, deep nesting, random bytes, random query strings),
//! the gateway never answers 5xx, and every non-2xx answer is the error envelope.
//!
//! Each test shares one gateway across its cases (a high_volume key, so a few hundred requests
//! stay under the rate limit). Every run explores new cases: the seed is `FUZZ_SEED` when set
//! (to replay a failure; every failure message names its seed), else drawn at random and
//! printed. `PROPTEST_CASES` sets the case count of each test; without it, CI (`CI` set) runs
//! four times the developer default.

use std::cell::Cell;
use std::time::{Duration, SystemTime};

use e2e::response::assert_envelope;
use e2e::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

const POST_PATHS: [&str; 4] = [
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/chat/completions",
    "/v1/responses",
];
const GET_PATHS: [&str; 7] = [
    "/v1/models",
    "/v1/models/svc/opus",
    "/v1/account",
    "/v1/usage",
    "/v1/messages",
    "/v1/responses/resp_unknown",
    "/v1/responses/resp_unknown/input_items",
];

/// One fuzz gateway: its runtime, process and a high-volume key with plenty of credits.
struct Fuzz {
    rt: Runtime,
    gw: Option<Gateway>,
    key: String,
    /// Requests sent, with how many were answered 2xx.
    sent: Cell<(u32, u32)>,
}

impl Fuzz {
    fn start() -> Fuzz {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (gw, key) = rt.block_on(async {
            let gw = Gateway::builder().chunk_delay_ms(0).start().await;
            let key = gw
                .new_key(1_000_000_000, &KeySpec::tier("high_volume"))
                .await;
            (gw, key.secret)
        });
        Fuzz {
            rt,
            gw: Some(gw),
            key,
            sent: Cell::new((0, 0)),
        }
    }

    fn gw(&self) -> &Gateway {
        self.gw.as_ref().unwrap()
    }

    /// Runs [`cases`]`(default_cases)` cases of `strategy` through `send`, from [`seed`].
    fn run<S: Strategy>(
        &self,
        default_cases: u32,
        strategy: S,
        send: impl Fn(&Fuzz, S::Value) -> Result<(), TestCaseError>,
    ) {
        let cases = cases(default_cases);
        let seed = seed();
        eprintln!("fuzzing {cases} cases from FUZZ_SEED={seed}");
        let config = Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 64,
            ..Config::default()
        };
        let mut seed_bytes = [0u8; 32];
        for chunk in seed_bytes.chunks_mut(8) {
            chunk.copy_from_slice(&seed.to_le_bytes());
        }
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
        let mut runner = TestRunner::new_with_rng(config, rng);
        if let Err(failure) = runner.run(&strategy, |value| send(self, value)) {
            panic!(
                "{failure}\nreplay with FUZZ_SEED={seed} PROPTEST_CASES={cases}\n{}",
                self.gw().logs()
            );
        }
        let (sent, ok) = self.sent.get();
        assert!(
            sent >= cases,
            "only {sent} of {cases} cases reached the gateway"
        );
        eprintln!("{sent} requests, {ok} answered 2xx");
    }

    /// Sends one request and checks the rule.
    fn check(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(), TestCaseError> {
        let gw = self.gw();
        self.rt.block_on(async {
            let mut rb = gw
                .request(method.clone(), path, Some(&self.key))
                .timeout(Duration::from_secs(30));
            if let Some(ct) = content_type {
                rb = rb.header("content-type", ct);
            }
            if method == Method::POST {
                rb = rb.body(body.clone());
            }
            let response = rb.send().await.map_err(|e| {
                TestCaseError::fail(format!("{method} {path}: transport error {e}"))
            })?;
            let what = format!(
                "{method} {path} with body {:?}",
                String::from_utf8_lossy(&body)
            );
            let (sent, ok) = self.sent.get();
            let success = response.status().is_success() as u32;
            self.sent.set((sent + 1, ok + success));
            let is_stream = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            if is_stream {
                let stream = SseStream::new(response);
                prop_assert_eq!(stream.status, 200, "{}", what);
                let events = stream.collect().await;
                prop_assert!(!events.is_empty(), "{}: empty stream", what);
                // A 5xx-class error sent inside a 200 stream is a 5xx all the same.
                for event in &events {
                    let kind = serde_json::from_str::<Value>(&event.data)
                        .ok()
                        .and_then(|data| data["error"]["type"].as_str().map(str::to_owned));
                    prop_assert!(
                        !matches!(kind.as_deref(), Some("api_error" | "overloaded_error")),
                        "{}: a server error inside the stream: {:?}",
                        what,
                        event
                    );
                }
                return Ok(());
            }
            let resp = Resp::read(response).await;
            prop_assert!(resp.status < 500, "{}: {}", what, resp);
            if resp.status >= 300 {
                let envelope = std::panic::catch_unwind(|| assert_envelope(&resp.text));
                prop_assert!(
                    envelope.is_ok(),
                    "{}: not the error envelope: {}",
                    what,
                    resp
                );
            } else {
                prop_assert!(
                    serde_json::from_str::<Value>(&resp.text).is_ok(),
                    "{}: 2xx not JSON: {}",
                    what,
                    resp
                );
            }
            Ok(())
        })
    }

    fn post_json(&self, path: &str, body: &Value) -> Result<(), TestCaseError> {
        self.check(
            Method::POST,
            path,
            Some("application/json"),
            serde_json::to_vec(body).unwrap(),
        )
    }
}

impl Drop for Fuzz {
    fn drop(&mut self) {
        let _guard = self.rt.enter();
        self.gw.take();
    }
}

/// `PROPTEST_CASES` when set, else `default` (four times that under CI).
fn cases(default: u32) -> u32 {
    match std::env::var("PROPTEST_CASES") {
        Ok(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("PROPTEST_CASES={n:?} is not a case count")),
        Err(_) if std::env::var_os("CI").is_some() => default * 4,
        Err(_) => default,
    }
}

/// `FUZZ_SEED` when set, else a fresh one (from the clock and the process id).
fn seed() -> u64 {
    if let Ok(seed) = std::env::var("FUZZ_SEED") {
        return seed
            .parse()
            .unwrap_or_else(|_| panic!("FUZZ_SEED={seed:?} is not a u64"));
    }
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// Strings that cannot spell a provider name (the gateway may echo input in error messages).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9 _/.]{0,12}",
        any::<String>().prop_map(|s| s.chars().take(24).collect()),
        Just("svc/opus".to_string()),
        Just("user".to_string()),
        Just("assistant".to_string()),
        Just("text".to_string()),
    ]
    .prop_filter("no provider names", |s| {
        let lower = s.to_lowercase();
        !leak::FORBIDDEN.iter().any(|w| lower.contains(w))
    })
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..70_000).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        (-1.0f64..2.0).prop_map(|f| json!(f)),
        Just(json!(1e308)),
        Just(json!(-0.0)),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        number(),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(text(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Paths (JSON pointers) of a valid request whose value the fuzzer replaces.
const FIELDS: [&str; 22] = [
    "",
    "/model",
    "/max_tokens",
    "/messages",
    "/messages/0",
    "/messages/0/role",
    "/messages/0/content",
    "/messages/0/content/0",
    "/messages/0/content/0/type",
    "/messages/0/content/0/text",
    "/system",
    "/temperature",
    "/top_p",
    "/stop_sequences",
    "/stream",
    "/tools",
    "/tools/0/input_schema",
    "/tool_choice",
    "/thinking",
    "/thinking/budget_tokens",
    "/metadata",
    "/stream_options",
];

fn full_request(model: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "call get_weather"}]}],
        "system": "be brief",
        "temperature": 0.5,
        "stop_sequences": ["zz"],
        "stream": false,
        "tools": [weather_tool()],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "u1"},
    })
}

/// `body` with the value at `pointer` replaced (`Some`) or removed (`None`).
fn replace_at(mut body: Value, pointer: &str, value: Option<Value>) -> Value {
    if pointer.is_empty() {
        return value.unwrap_or(Value::Null);
    }
    let (parent, last) = pointer.rsplit_once('/').unwrap();
    let target = if parent.is_empty() {
        Some(&mut body)
    } else {
        body.pointer_mut(parent)
    };
    match (target, value) {
        (Some(Value::Object(map)), Some(value)) => {
            map.insert(last.to_string(), value);
        }
        (Some(Value::Object(map)), None) => {
            map.remove(last);
        }
        (Some(Value::Array(items)), Some(value)) => {
            let i: usize = last.parse().unwrap();
            if i < items.len() {
                items[i] = value;
            }
        }
        (Some(Value::Array(items)), None) => {
            let i: usize = last.parse().unwrap();
            if i < items.len() {
                items.remove(i);
            }
        }
        _ => {}
    }
    body
}

/// A valid request (svc/opus, thinking on) with the value at `pointer` replaced or removed.
fn mutate(pointer: &str, value: Option<Value>) -> Value {
    let mut body = full_request("svc/opus");
    body["max_tokens"] = json!(2048);
    replace_at(body, pointer, value)
}

fn mutation() -> impl Strategy<Value = (usize, Value)> {
    (
        0..POST_PATHS.len(),
        (
            prop::sample::select(FIELDS.to_vec()),
            prop::option::weighted(0.85, any_json()),
        )
            .prop_map(|(p, v)| mutate(p, v)),
    )
}

#[test]
fn a_valid_request_with_any_field_replaced_by_any_value_never_gets_a_5xx() {
    let fuzz = Fuzz::start();
    fuzz.run(240, mutation(), |f, (path, body)| {
        f.post_json(POST_PATHS[path], &body)
    });
}

/// Paths (JSON pointers) of a valid `/v1/responses` request whose value the fuzzer replaces.
const RESPONSES_FIELDS: [&str; 26] = [
    "",
    "/model",
    "/input",
    "/input/0",
    "/input/0/role",
    "/input/0/content",
    "/input/0/content/0",
    "/input/0/content/0/type",
    "/input/1",
    "/input/1/arguments",
    "/input/1/call_id",
    "/input/2",
    "/input/2/output",
    "/input/3",
    "/input/3/encrypted_content",
    "/instructions",
    "/tools",
    "/tools/0",
    "/tools/0/parameters",
    "/tools/1/tools",
    "/tool_choice",
    "/reasoning",
    "/max_output_tokens",
    "/text",
    "/include",
    "/previous_response_id",
];

/// A valid Responses request (svc/opus, reasoning on, a tool call and its output in the
/// input, a namespace and a hosted tool) with the value at `pointer` replaced or removed.
fn mutate_responses(pointer: &str, value: Option<Value>, stream: bool) -> Value {
    let body = json!({
        "model": "svc/opus",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "call get_weather"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "user", "content": "and tomorrow?"}
        ],
        "instructions": "be brief",
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": weather_tool()["input_schema"]},
            {"type": "namespace", "name": "crm", "description": "CRM",
             "tools": [{"type": "function", "name": "lookup"}]},
            {"type": "web_search"}
        ],
        "tool_choice": "auto",
        "reasoning": {"effort": "low", "summary": "auto"},
        "max_output_tokens": 2048,
        "text": {"format": {"type": "text"}},
        "include": ["reasoning.encrypted_content"],
        "store": false,
        "stream": stream,
    });
    replace_at(body, pointer, value)
}

#[test]
fn a_valid_responses_request_with_any_field_replaced_by_any_value_never_gets_a_5xx() {
    let fuzz = Fuzz::start();
    let strategy = (
        prop::sample::select(RESPONSES_FIELDS.to_vec()),
        prop::option::weighted(0.85, any_json()),
        any::<bool>(),
    )
        .prop_map(|(p, v, stream)| mutate_responses(p, v, stream));
    fuzz.run(200, strategy, |f, body| f.post_json("/v1/responses", &body));
}

#[test]
fn random_json_bodies_never_get_a_5xx() {
    let fuzz = Fuzz::start();
    fuzz.run(150, (0..POST_PATHS.len(), any_json()), |f, (path, body)| {
        f.post_json(POST_PATHS[path], &body)
    });
}

/// Raw bodies: truncated valid JSON, numbers no integer type holds, deep nesting, random bytes.
fn raw_body() -> impl Strategy<Value = Vec<u8>> {
    let valid = serde_json::to_string(&full_request("svc/haiku")).unwrap();
    let len = valid.len();
    let truncated = {
        let valid = valid.clone();
        (0..len).prop_map(move |cut| valid.as_bytes()[..cut].to_vec())
    };
    let huge = prop::sample::select(vec![
        "1e400",
        "-1e400",
        "18446744073709551616",
        "-9223372036854775809",
        "99999999999999999999999999999999999999",
        "1e-400",
        "0.0000000001",
        "NaN",
        "Infinity",
        "0x10",
        "1_000",
    ])
    .prop_flat_map(|n| {
        prop::sample::select(vec!["max_tokens", "temperature", "top_p", "budget_tokens"])
            .prop_map(move |field| format!(r#"{{"model":"svc/opus","max_tokens":64,"{field}":{n},"messages":[{{"role":"user","content":"hi"}}]}}"#).into_bytes())
    });
    let deep = (1usize..3000, prop::bool::ANY).prop_map(|(depth, arrays)| {
        let (open, close) = if arrays { ("[", "]") } else { (r#"{"a":"#, "}") };
        format!(
            r#"{{"model":"svc/haiku","max_tokens":16,"messages":[{{"role":"user","content":{}1{}}}]}}"#,
            open.repeat(depth),
            close.repeat(depth)
        )
        .into_bytes()
    });
    let bytes = prop::collection::vec(any::<u8>(), 0..256);
    let duplicate_keys = Just(br#"{"model":"svc/haiku","model":"svc/opus","max_tokens":16,"max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}"#.to_vec());
    prop_oneof![truncated, huge, deep, bytes, duplicate_keys]
}

#[test]
fn truncated_huge_deep_and_random_byte_bodies_never_get_a_5xx() {
    let fuzz = Fuzz::start();
    let content_types = prop::sample::select(vec![
        Some("application/json"),
        Some("application/json; charset=utf-8"),
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ]);
    fuzz.run(
        180,
        (0..POST_PATHS.len(), raw_body(), content_types),
        |f, (path, body, ct)| f.check(Method::POST, POST_PATHS[path], ct, body),
    );
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn query() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        prop::sample::select(vec![
            "start_date",
            "end_date",
            "group_by",
            "limit",
            "after_id",
            "after",
            "order",
            "beta"
        ])
        .prop_map(String::from),
        text(),
    ];
    let value = prop_oneof![
        text(),
        prop::sample::select(vec![
            "2026-05-09",
            "2026-13-45",
            "0000-00-00",
            "day",
            "model",
            "day,model",
            "model,model,day",
            "9999-12-31",
            "-1",
            "asc",
            "desc",
            "0",
            "101",
        ])
        .prop_map(String::from),
        any::<i64>().prop_map(|n| n.to_string()),
    ];
    prop::collection::vec((key, value), 0..4).prop_map(|pairs| {
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    })
}

#[test]
fn gets_with_random_query_strings_and_model_ids_never_get_a_5xx() {
    let fuzz = Fuzz::start();
    let paths = prop_oneof![
        prop::sample::select(GET_PATHS.to_vec()).prop_map(String::from),
        text().prop_map(|id| format!("/v1/models/{}", percent_encode(&id))),
        text().prop_map(|id| format!("/v1/models/svc/{}", percent_encode(&id))),
    ];
    fuzz.run(200, (paths, query()), |f, (path, query)| {
        f.check(Method::GET, &format!("{path}?{query}"), None, Vec::new())
    });
}
