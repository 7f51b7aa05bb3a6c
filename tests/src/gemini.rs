//! The Gemini API as the mock upstream ([`crate::upstream`]) serves it:
//! `POST /v1beta/models/{model}:generateContent` (one `GenerateContentResponse` in JSON) and
//! `:streamGenerateContent?alt=sse` (one per `data:` event, the last with the finish reason and
//! the whole `usageMetadata`). Before any model answers, it does what Google does:
//!
//! - no `x-goog-api-key` (nor `key` query parameter) is a 403 `PERMISSION_DENIED`; a wrong key
//!   a 400 `INVALID_ARGUMENT` whose `ErrorInfo` reason is `API_KEY_INVALID` (as Google answers
//!   it: the gateway must tell it from a refused request);
//! - another model is a 404 `NOT_FOUND`; a stream without `alt=sse` a 400;
//! - a body that is not a `GenerateContentRequest` is a 400 `INVALID_ARGUMENT` naming what is
//!   wrong: unknown fields (`Unknown name "x"`), a turn whose role is not `user`/`model` or
//!   without parts, a part with no data or with two, a schema type or keyword outside Gemini's
//!   `Schema`.
//!
//! Thought parts are sent only when the request asks for them (`includeThoughts`), as Gemini
//! does; a function call carries no id (the Gemini API's models give none). Errors have
//! Google's shape (`{"error": {"code", "message", "status", "details"}}`), a 429 a `RetryInfo`
//! of [`RETRY_DELAY_SECS`]; messages name "gemini" for the harness' leak checks.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::upstream::{MockBlock, Reply, UPSTREAM_API_KEY, UPSTREAM_MODEL};

/// The wait the mock's 429 asks for in its `RetryInfo`: long enough that a test's next turn,
/// on however busy a machine, comes before it.
pub const RETRY_DELAY_SECS: u64 = 20;

/// The Secret holding a key the mock refuses.
pub const WRONG_KEY_SECRET: &str = "mock-upstream-key-wrong";

/// Which endpoint a request called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Generate,
    Stream,
}

/// The method a path names, if it is a Gemini path.
pub fn method(path: &str) -> Option<Method> {
    let rest = path.strip_prefix("/v1beta/models/")?;
    if rest.ends_with(":streamGenerateContent") {
        Some(Method::Stream)
    } else if rest.ends_with(":generateContent") {
        Some(Method::Generate)
    } else {
        None
    }
}

/// Google's error body.
pub fn error(status: u16, message: &str, details: Value) -> Response {
    let name = match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        500 => "INTERNAL",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    };
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({"error": {"code": status, "message": message, "status": name,
        "details": details}});
    (code, axum::Json(body)).into_response()
}

/// A scripted error status, as Google words it; a throttle says when to come back.
pub fn error_response(status: u16) -> Response {
    let details = if status == 429 {
        json!([{"@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": format!("{RETRY_DELAY_SECS}s")}])
    } else {
        json!([])
    };
    error(
        status,
        &format!("gemini {UPSTREAM_MODEL}: the request failed ({status})"),
        details,
    )
}

/// Google's checks, in its order: the key, the model and method, then the body.
pub fn refusal(path: &str, query: &str, headers: &HeaderMap, body: &Value) -> Option<Response> {
    let key = headers
        .get("x-goog-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix("key="))
                .map(str::to_owned)
        });
    match key.as_deref() {
        None => {
            return Some(error(
                403,
                "gemini: Method doesn't allow unregistered callers (callers without established \
                 identity). Please use API Key or other form of API consumer identity to call \
                 this API.",
                json!([]),
            ))
        }
        Some(key) if key != UPSTREAM_API_KEY => {
            return Some(error(
                400,
                "gemini: API key not valid. Please pass a valid API key.",
                json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]),
            ))
        }
        Some(_) => {}
    }
    let model = path
        .strip_prefix("/v1beta/models/")
        .and_then(|rest| rest.split(':').next());
    if model != Some(UPSTREAM_MODEL) {
        return Some(error(
            404,
            &format!(
                "gemini: models/{} is not found for API version v1beta",
                model.unwrap_or("")
            ),
            json!([]),
        ));
    }
    if method(path) == Some(Method::Stream) && !query.split('&').any(|p| p == "alt=sse") {
        // Without alt=sse Google streams a JSON array; the gateway reads SSE only.
        return Some(error(
            400,
            "gemini: the mock streams with alt=sse only",
            json!([]),
        ));
    }
    malformed(body).map(|message| error(400, &format!("gemini: {message}"), json!([])))
}

const REQUEST_FIELDS: &[&str] = &[
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "generationConfig",
    "safetySettings",
    "cachedContent",
];
const GENERATION_FIELDS: &[&str] = &[
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "stopSequences",
    "thinkingConfig",
    "candidateCount",
    "responseMimeType",
    "seed",
];
const PART_DATA: &[&str] = &[
    "text",
    "inlineData",
    "functionCall",
    "functionResponse",
    "fileData",
];
const PART_FIELDS: &[&str] = &["thought", "thoughtSignature"];
const SCHEMA_FIELDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];
const SCHEMA_TYPES: &[&str] = &[
    "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL",
];

fn unknown(object: &Value, known: &[&str], at: &str) -> Option<String> {
    object
        .as_object()?
        .keys()
        .find(|k| !known.contains(&k.as_str()))
        .map(|k| {
            format!(
                "Invalid JSON payload received. Unknown name \"{k}\" at '{at}': Cannot find field."
            )
        })
}

/// What Google would refuse in a request body, if anything.
pub fn malformed(body: &Value) -> Option<String> {
    if !body.is_object() {
        return Some("Invalid JSON payload received.".to_owned());
    }
    if let Some(e) = unknown(body, REQUEST_FIELDS, "") {
        return Some(e);
    }
    if let Some(e) = unknown(
        &body["generationConfig"],
        GENERATION_FIELDS,
        "generation_config",
    ) {
        return Some(e);
    }
    let Some(contents) = body["contents"].as_array().filter(|c| !c.is_empty()) else {
        return Some("* GenerateContentRequest.contents: contents is not specified".to_owned());
    };
    let system = body.get("systemInstruction").into_iter();
    for (i, content) in contents.iter().chain(system).enumerate() {
        let role = content["role"].as_str();
        if i < contents.len() && !matches!(role, Some("user" | "model")) {
            return Some(format!(
                "* GenerateContentRequest.contents[{i}].role: Please use a valid role: user, model."
            ));
        }
        let Some(parts) = content["parts"].as_array().filter(|p| !p.is_empty()) else {
            return Some(format!(
                "* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            ));
        };
        for (j, part) in parts.iter().enumerate() {
            let at = format!("contents[{i}].parts[{j}]");
            let mut known = PART_DATA.to_vec();
            known.extend(PART_FIELDS);
            if let Some(e) = unknown(part, &known, &at) {
                return Some(e);
            }
            let data = PART_DATA.iter().filter(|k| part.get(**k).is_some()).count();
            if data != 1 {
                return Some(format!("* GenerateContentRequest.{at}.data: required oneof field 'data' must have one initialized field"));
            }
            if let Some(call) = part.get("functionResponse") {
                if call["name"].as_str().is_none_or(str::is_empty) || !call["response"].is_object()
                {
                    return Some(format!("* GenerateContentRequest.{at}.function_response: name and response are required"));
                }
            }
        }
    }
    for (t, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
        for (f, declaration) in tool["functionDeclarations"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = format!("tools[{t}].function_declarations[{f}].parameters");
            if let Some(e) = declaration.get("parameters").and_then(|p| schema(p, &at)) {
                return Some(e);
            }
        }
    }
    None
}

fn schema(schema: &Value, at: &str) -> Option<String> {
    if let Some(e) = unknown(schema, SCHEMA_FIELDS, at) {
        return Some(e);
    }
    if let Some(t) = schema.get("type") {
        if !t.as_str().is_some_and(|t| SCHEMA_TYPES.contains(&t)) {
            return Some(format!("Invalid value at '{at}.type' ({t}): not a Type"));
        }
        if t == "OBJECT"
            && schema["properties"]
                .as_object()
                .is_some_and(|p| p.is_empty())
        {
            return Some(format!(
                "* GenerateContentRequest.{at}.properties: should be non-empty for OBJECT type"
            ));
        }
    }
    let nested = schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, s)| (format!("{at}.properties[{name}]"), s))
        .chain(schema.get("items").map(|s| (format!("{at}.items"), s)))
        .chain(
            schema["anyOf"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(k, s)| (format!("{at}.any_of[{k}]"), s)),
        )
        .collect::<Vec<_>>();
    nested.into_iter().find_map(|(at, s)| self::schema(s, &at))
}

/// Whether the request asks for thought parts.
fn includes_thoughts(body: &Value) -> bool {
    body["generationConfig"]["thinkingConfig"]["includeThoughts"] == true
}

/// The output's split as Gemini counts it: thoughts apart from the answer (a third of the
/// output when thoughts are sent).
fn usage(reply: &Reply, body: &Value, last: bool) -> Value {
    let u = &reply.usage;
    let prompt = u.input + u.cache_read;
    let mut usage = json!({"promptTokenCount": prompt});
    if u.cache_read > 0 {
        usage["cachedContentTokenCount"] = json!(u.cache_read);
    }
    if last {
        let thinks = includes_thoughts(body)
            && reply
                .blocks
                .iter()
                .any(|b| matches!(b, MockBlock::Thinking { .. }));
        let thoughts = if thinks { u.output / 3 } else { 0 };
        usage["candidatesTokenCount"] = json!(u.output - thoughts);
        if thoughts > 0 {
            usage["thoughtsTokenCount"] = json!(thoughts);
        }
        usage["totalTokenCount"] = json!(prompt + u.output);
    }
    usage
}

fn parts(reply: &Reply, body: &Value, piece: usize) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for block in &reply.blocks {
        match block {
            MockBlock::Text(text) => out.extend(
                chars(text, piece)
                    .into_iter()
                    .map(|p| vec![json!({"text": p})]),
            ),
            MockBlock::Thinking {
                thinking,
                signature,
            } if includes_thoughts(body) => {
                let mut pieces: Vec<Vec<Value>> = chars(thinking, piece)
                    .into_iter()
                    .map(|p| vec![json!({"text": p, "thought": true})])
                    .collect();
                if let Some(last) = pieces.last_mut().and_then(|p| p.last_mut()) {
                    last["thoughtSignature"] = json!(signature);
                }
                out.extend(pieces);
            }
            MockBlock::Thinking { .. } => {}
            MockBlock::ToolUse { name, input, .. } => {
                out.push(vec![json!({"functionCall": {"name": name, "args": input}})]);
            }
        }
    }
    out
}

fn chars(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

fn finish_reason(reply: &Reply) -> &'static str {
    if reply.max_tokens_hit {
        "MAX_TOKENS"
    } else {
        "STOP"
    }
}

/// `:generateContent`'s answer.
pub fn json(reply: &Reply, body: &Value) -> Value {
    let parts: Vec<Value> = parts(reply, body, usize::MAX)
        .into_iter()
        .flatten()
        .collect();
    json!({"candidates": [{"content": {"role": "model", "parts": parts},
        "finishReason": finish_reason(reply), "index": 0}],
        "usageMetadata": usage(reply, body, true), "modelVersion": UPSTREAM_MODEL,
        "responseId": "gemini-mock-response"})
}

/// `:streamGenerateContent?alt=sse`'s events.
pub fn events(reply: &Reply, body: &Value) -> Vec<String> {
    let chunk = |parts: Vec<Value>, finish: Option<&str>, last: bool| {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(finish) = finish {
            candidate["finishReason"] = json!(finish);
        }
        let data = json!({"candidates": [candidate], "usageMetadata": usage(reply, body, last),
            "modelVersion": UPSTREAM_MODEL, "responseId": "gemini-mock-response"});
        format!("data: {data}\r\n\r\n")
    };
    let mut out: Vec<String> = parts(reply, body, 6)
        .into_iter()
        .map(|p| chunk(p, None, false))
        .collect();
    // The last event carries the finish reason and the whole usage, with an empty text.
    out.push(chunk(
        vec![json!({"text": ""})],
        Some(finish_reason(reply)),
        true,
    ));
    out
}
