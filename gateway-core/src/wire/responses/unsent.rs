//! What a stored response keeps of its request that the upstream never sees: input items the
//! translation skips (hosted-tool calls and their outputs, unknown item types, reasoning without
//! sealed thinking), the fields of items, content parts and tools that the translation does not
//! read (`id`, `status`, `annotations`, a tool's unknown fields, ...), hosted tools, and the
//! echoed `metadata`, `user`, `prompt_cache_key` and unread parts of `text`, `reasoning` and
//! `tool_choice`. The store keeps all of it, so it is billed as input tokens like what is sent
//! (the gateway's count of its JSON text).

use std::collections::HashSet;

use serde_json::{Map, Value};

/// Item fields that reach the upstream.
const ITEM_SENT: &[&str] = &[
    "type",
    "role",
    "content",
    "call_id",
    "name",
    "namespace",
    "arguments",
    "input",
    "output",
    "encrypted_content",
];
/// Content part fields that reach the upstream.
const PART_SENT: &[&str] = &["type", "text", "refusal", "image_url"];
const FUNCTION_SENT: &[&str] = &["type", "name", "description", "parameters"];
const NAMESPACE_SENT: &[&str] = &["type", "name", "tools"];
const TEXT_SENT: &[&str] = &["format"];
const FORMAT_SENT: &[&str] = &["type", "name", "schema"];
const REASONING_SENT: &[&str] = &["effort", "summary", "generate_summary"];
const TOOL_CHOICE_SENT: &[&str] = &["type", "name", "mode"];
/// Request fields echoed in the stored response and never sent.
const ECHOED: &[&str] = &["metadata", "user", "prompt_cache_key"];

/// The JSON text of everything in `raw` (the request as sent) that is stored but not sent;
/// `skipped` holds the paths (`input[3]`) of the input items the translation skipped.
pub fn unsent_text(raw: &Value, skipped: &[String]) -> String {
    let mut out = Unsent::default();
    let skipped: HashSet<&str> = skipped.iter().map(String::as_str).collect();
    if let Some(items) = raw.get("input").and_then(Value::as_array) {
        for (i, item) in items.iter().enumerate() {
            if skipped.contains(format!("input[{i}]").as_str()) {
                out.push(item);
            } else {
                out.item(item);
            }
        }
    }
    for tool in raw
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.tool(tool);
    }
    if let Some(text) = raw.get("text") {
        out.unread(text, TEXT_SENT);
        if let Some(format) = text.get("format") {
            out.unread(format, FORMAT_SENT);
        }
    }
    if let Some(reasoning) = raw.get("reasoning") {
        out.unread(reasoning, REASONING_SENT);
    }
    if let Some(choice) = raw.get("tool_choice").filter(|c| c.is_object()) {
        out.unread(choice, TOOL_CHOICE_SENT);
    }
    for field in ECHOED {
        if let Some(value) = raw.get(*field).filter(|v| !v.is_null()) {
            out.push(value);
        }
    }
    out.0
}

#[derive(Default)]
struct Unsent(String);

impl Unsent {
    fn push(&mut self, value: &Value) {
        if !self.0.is_empty() {
            self.0.push('\n');
        }
        self.0.push_str(&value.to_string());
    }

    /// The fields of `value` (an object) not in `sent`; anything else whole.
    fn unread(&mut self, value: &Value, sent: &[&str]) {
        match value.as_object() {
            Some(object) => self.unread_fields(object, sent),
            None => self.push(value),
        }
    }

    fn unread_fields(&mut self, object: &Map<String, Value>, sent: &[&str]) {
        for (key, value) in object {
            if !sent.contains(&key.as_str()) {
                self.push(value);
            }
        }
    }

    fn item(&mut self, item: &Value) {
        self.unread(item, ITEM_SENT);
        for field in ["content", "output"] {
            for part in item
                .get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.unread(part, PART_SENT);
            }
        }
    }

    fn tool(&mut self, tool: &Value) {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => self.unread(tool, FUNCTION_SENT),
            Some("namespace") => {
                self.unread(tool, NAMESPACE_SENT);
                for inner in tool
                    .get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    self.tool(inner);
                }
            }
            // Hosted tools are not offered to the model.
            _ => self.push(tool),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn skipped_items_and_unread_fields_are_unsent_and_what_is_sent_is_not() {
        let raw = json!({
            "model": "svc/sonnet",
            "input": [
                {"type": "message", "role": "user", "id": "msg_1",
                 "content": [{"type": "input_text", "text": "sent text", "junk": "part extra"}]},
                {"type": "web_search_call", "id": "ws_1", "action": {"query": "hosted query"}},
            ],
            "tools": [{"type": "function", "name": "f", "parameters": {}, "x": "tool extra"},
                      {"type": "web_search", "filters": "hosted tool"}],
            "metadata": {"k": "meta value"},
        });
        let unsent = unsent_text(&raw, &["input[1]".to_owned()]);
        for expected in [
            "msg_1",
            "part extra",
            "hosted query",
            "tool extra",
            "hosted tool",
            "meta value",
        ] {
            assert!(unsent.contains(expected), "{expected} in {unsent}");
        }
        assert!(!unsent.contains("sent text"), "{unsent}");
        assert!(!unsent.contains("svc/sonnet"), "{unsent}");
    }
}
