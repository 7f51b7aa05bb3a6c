//! Request bodies and model facts shared by the tests.

use serde_json::{json, Value};

/// The five virtual model ids of the spec.
pub const MODELS: [&str; 5] = [
    "svc/auto",
    "svc/opus",
    "svc/sonnet",
    "svc/kimi",
    "svc/haiku",
];

/// (id, context_window, max_output_tokens) from the contract's standalone models.
pub const MODEL_LIMITS: [(&str, u64, u64); 4] = [
    ("svc/opus", 200_000, 32_000),
    ("svc/sonnet", 200_000, 64_000),
    ("svc/haiku", 200_000, 8_192),
    ("svc/kimi", 131_072, 16_384),
];

/// (tier, RPM, TPM, concurrent streams) from the spec's tier table.
pub const TIERS: [(&str, u64, u64, u64); 3] = [
    ("free", 5, 20_000, 1),
    ("pay_as_you_go", 60, 100_000, 5),
    ("high_volume", 300, 500_000, 20),
];

/// A one-turn `/v1/messages` body.
pub fn message(model: &str, text: &str, max_tokens: u64) -> Value {
    json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{ "role": "user", "content": text }],
    })
}

/// The same body with `"stream": true`.
pub fn message_stream(model: &str, text: &str, max_tokens: u64) -> Value {
    let mut body = message(model, text, max_tokens);
    body["stream"] = json!(true);
    body
}

/// A `/v1/messages/count_tokens` body.
pub fn count_body(model: &str, text: &str) -> Value {
    json!({ "model": model, "messages": [{ "role": "user", "content": text }] })
}

/// A one-turn `/v1/chat/completions` body.
pub fn chat_body(model: &str, text: &str, max_tokens: Option<u64>) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{ "role": "user", "content": text }],
    });
    if let Some(max) = max_tokens {
        body["max_tokens"] = json!(max);
    }
    body
}

/// A streamed chat body asking for the usage chunk.
pub fn chat_stream_body(model: &str, text: &str, max_tokens: Option<u64>) -> Value {
    let mut body = chat_body(model, text, max_tokens);
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    body
}

/// A tool with a string, an integer and a boolean required property.
pub fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "Current weather for a place.",
        "input_schema": {
            "type": "object",
            "properties": {
                "location": { "type": "string" },
                "days": { "type": "integer" },
                "metric": { "type": "boolean" },
                "tags": { "type": "array", "items": { "type": "string" } },
                "note": { "type": "string" }
            },
            "required": ["location", "days", "metric", "tags"]
        }
    })
}

/// The input the simulated upstream builds for [`weather_tool`] (required properties only).
pub fn weather_tool_input() -> Value {
    json!({ "location": "simulated", "days": 1, "metric": true, "tags": [] })
}

/// Text of about `words` input tokens (each " word" is one BPE token).
pub fn words(words: usize) -> String {
    let mut text = String::with_capacity(words * 5);
    for i in 0..words {
        if i > 0 {
            text.push(' ');
        }
        text.push_str("word");
    }
    text
}

/// Text blocks of an Anthropic message response, concatenated.
pub fn response_text(body: &Value) -> String {
    body["content"]
        .as_array()
        .unwrap_or_else(|| panic!("response has no content array: {body}"))
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap_or_default())
        .collect()
}

/// `usage.credits_consumed` of a response (Anthropic or OpenAI shape).
pub fn credits_of(body: &Value) -> u64 {
    body["usage"]["credits_consumed"]
        .as_u64()
        .unwrap_or_else(|| panic!("usage.credits_consumed missing: {body}"))
}
