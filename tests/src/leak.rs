//! The spec's rule that underlying provider names are never exposed: no response field (other
//! than the model-generated content itself), no SSE payload and no header value may contain
//! one of [`FORBIDDEN`], case-insensitively.
//!
//! Generated content is exempt because the standalone `simulated` upstream answers with text
//! that says so ("This is a simulated reply from ...") and fills tool inputs with the string
//! "simulated"; that is the model's output, not the gateway naming its provider.

use reqwest::header::HeaderMap;
use serde_json::Value;

/// Substrings that betray the upstream: provider kinds, the simulated upstream's model names,
/// and the mock upstream's model name and API key. ("aws" is not one: three letters turn up
/// by chance in random ids, case-insensitively; "bedrock" and "amazon" cover Bedrock's
/// error bodies, its `x-amzn-` headers' values and its model ids; "gemini" and "googleapis"
/// Gemini's error bodies and their detail types.)
pub const FORBIDDEN: [&str; 11] = [
    "simulated",
    "anthropic",
    "openai",
    "azure",
    "bedrock",
    "amazon",
    "gemini",
    "googleapis",
    "sim-",
    crate::upstream::UPSTREAM_MODEL,
    "upstream-secret-key",
];

/// Keys whose string values (any value for a tool call's `input`) are model-generated content,
/// in the Anthropic, OpenAI and Responses API wire formats (`delta`: a Responses stream's
/// text; `encrypted_content`: sealed thinking, which may spell anything).
const GENERATED: [&str; 9] = [
    "text",
    "partial_json",
    "thinking",
    "input",
    "content",
    "arguments",
    "refusal",
    "delta",
    "encrypted_content",
];

fn forbidden_in(text: &str) -> Option<&'static str> {
    let lower = text.to_ascii_lowercase();
    FORBIDDEN.iter().copied().find(|word| lower.contains(word))
}

/// Panics when a JSON response names a provider outside generated content.
pub fn assert_no_provider_names(body: &Value) {
    let mut path = Vec::new();
    walk(body, &mut path, body);
}

fn walk(value: &Value, path: &mut Vec<String>, root: &Value) {
    match value {
        Value::String(s) => {
            if let Some(word) = forbidden_in(s) {
                panic!(
                    "response exposes a provider name ({word:?}) at {}: {s:?}\nbody: {root}",
                    path.join(".")
                );
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.to_string());
                walk(item, path, root);
                path.pop();
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                if let Some(word) = forbidden_in(key) {
                    panic!(
                        "response exposes a provider name ({word:?}) in key {key:?}\nbody: {root}"
                    );
                }
                let generated =
                    GENERATED.contains(&key.as_str()) && (item.is_string() || key == "input");
                if generated {
                    continue;
                }
                path.push(key.clone());
                walk(item, path, root);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Panics when a non-JSON body names a provider.
pub fn assert_text_clean(text: &str) {
    if let Some(word) = forbidden_in(text) {
        panic!("response body exposes a provider name ({word:?}): {text:?}");
    }
}

/// Panics when a header value names a provider.
pub fn assert_headers_clean(headers: &HeaderMap) {
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        if let Some(word) = forbidden_in(&value) {
            panic!("header {name} exposes a provider name ({word:?}): {value:?}");
        }
    }
}

/// Checks one SSE `data:` payload (JSON or not).
pub fn assert_sse_data_clean(data: &str) {
    match serde_json::from_str::<Value>(data) {
        Ok(json) => assert_no_provider_names(&json),
        Err(_) => assert_text_clean(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generated_content_may_say_simulated_but_fields_may_not() {
        assert_no_provider_names(&json!({
            "model": "svc/haiku",
            "content": [{"type": "text", "text": "This is a simulated reply from svc/haiku."}],
        }));
        let leak = std::panic::catch_unwind(|| {
            assert_no_provider_names(&json!({"model": "sim-haiku", "content": []}));
        });
        assert!(leak.is_err());
        let leak = std::panic::catch_unwind(|| {
            assert_no_provider_names(&json!({"error": {"message": "upstream OpenAI failed"}}));
        });
        assert!(leak.is_err());
    }
}
