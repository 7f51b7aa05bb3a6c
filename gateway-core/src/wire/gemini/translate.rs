//! The conversation as a `GenerateContentRequest`, and Gemini's answers as the conversation's
//! stop reasons and usage; the `gemini` adapter (`providers/gemini.rs`) reads the stream's
//! parts itself. What translates:
//!
//! - the system prompt is `systemInstruction`; messages are `contents` (`user`, `model`);
//!   text is `text` parts, base64 images `inlineData`, tool_use a `functionCall`, tool_result
//!   a `functionResponse` (named by the call it answers, its text as `{"content": ...}`, or
//!   `{"error": ...}` when `is_error`);
//! - tools are one `functionDeclarations` list, each JSON Schema translated to Gemini's
//!   `Schema` ([`schema_to_gemini`]); `tool_choice` is `toolConfig.functionCallingConfig`
//!   (`auto` AUTO, `any` ANY, a named tool ANY limited to it, `none` NONE);
//! - max_tokens, temperature, top_p, top_k and stop_sequences are `generationConfig`'s;
//!   thinking is `thinkingConfig` (the budget, or -1 for adaptive, with `includeThoughts`);
//!   disabled thinking sends nothing (some models cannot think less than their default).
//!
//! Left out, as every non-Anthropic upstream leaves them: the previous turns' thinking blocks
//! (their signatures are another model's), `cache_control` (Gemini caches on its own and
//! reports the hits), citations, and `metadata` (the gateway's own).
//!
//! Refused with the client's 400 naming the field ([`Refused`]), never dropped: an image by
//! URL, an image inside a tool result, a tool result whose call is not in the conversation,
//! `disable_parallel_tool_use` / `parallel_tool_calls: false`, and any schema keyword
//! without a counterpart in Gemini's `Schema` (`oneOf`, `allOf`, `$ref`, `not`,
//! `patternProperties`, `additionalProperties` with a schema...).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value};
use store::usage::{StopReason, TokenUsage};
use thiserror::Error;

use super::{
    Blob, Content, ErrorBody, FunctionCall, FunctionCallingConfig, FunctionDeclaration,
    FunctionResponse, GenerateContentRequest, GenerationConfig, Part, ThinkingConfig, Tool,
    ToolConfig, UsageMetadata,
};
use crate::conversation::{
    self, Content as Blocks, ImageSource, InputBlock, Role, Thinking, ToolChoice,
};

/// A part of the request Gemini has no counterpart for; the message names the field and is
/// the client's (it never names the upstream).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0}")]
pub struct Refused(pub String);

/// The conversation as a Gemini request (the model is in the URL, not the body).
pub fn request_to_gemini(req: &conversation::Request) -> Result<GenerateContentRequest, Refused> {
    // A tool result names only its call's id; Gemini's answer names the function.
    let mut called: HashMap<&str, &str> = HashMap::new();
    let mut contents = Vec::with_capacity(req.messages.len());
    for (i, message) in req.messages.iter().enumerate() {
        let role = match message.role {
            Role::Assistant => "model",
            // System messages are folded away before any adapter runs.
            Role::User | Role::System => "user",
        };
        let mut parts = Vec::new();
        match &message.content {
            Blocks::Text(text) => parts.push(text_part(text.clone())),
            Blocks::Blocks(blocks) => {
                for (j, block) in blocks.iter().enumerate() {
                    let at = || format!("messages[{i}].content[{j}]");
                    match block {
                        InputBlock::Text { text, .. } => parts.push(text_part(text.clone())),
                        InputBlock::Image { source, .. } => parts.push(image_part(source, at)?),
                        InputBlock::ToolUse {
                            id, name, input, ..
                        } => {
                            called.insert(id, name);
                            parts.push(Part {
                                function_call: Some(FunctionCall {
                                    id: None,
                                    name: name.clone(),
                                    args: Some(input.clone()),
                                }),
                                ..Part::default()
                            });
                        }
                        InputBlock::ToolResult {
                            tool_use_id,
                            content,
                            is_error,
                            ..
                        } => {
                            let Some(name) = called.get(tool_use_id.as_str()) else {
                                return Err(Refused(format!(
                                    "{}.tool_use_id: {tool_use_id:?} answers no tool call earlier in the conversation",
                                    at()
                                )));
                            };
                            if content
                                .iter()
                                .flat_map(Blocks::blocks)
                                .any(|b| !matches!(b, InputBlock::Text { .. }))
                            {
                                return Err(Refused(format!(
                                    "{}.content: this model takes only text in a tool result",
                                    at()
                                )));
                            }
                            let text = content.as_ref().map(Blocks::text).unwrap_or_default();
                            let field = if *is_error == Some(true) {
                                "error"
                            } else {
                                "content"
                            };
                            let mut response = Map::new();
                            response.insert(field.to_owned(), Value::String(text));
                            parts.push(Part {
                                function_response: Some(FunctionResponse {
                                    id: None,
                                    name: (*name).to_owned(),
                                    response: Value::Object(response),
                                }),
                                ..Part::default()
                            });
                        }
                        InputBlock::Thinking { .. } | InputBlock::RedactedThinking { .. } => {}
                    }
                }
            }
        }
        parts.retain(|p| p.text.as_deref() != Some(""));
        if !parts.is_empty() {
            contents.push(Content {
                role: Some(role.to_owned()),
                parts,
            });
        }
    }
    let system_instruction = req
        .system_text()
        .filter(|s| !s.is_empty())
        .map(|text| Content {
            role: None,
            parts: vec![text_part(text)],
        });
    let declarations = req
        .tools
        .iter()
        .map(|tool| {
            Ok(FunctionDeclaration {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: parameters_to_gemini(&tool.input_schema).map_err(|at| {
                    Refused(format!(
                        "tools: the parameter schema of tool {:?} uses {at}, which this model's \
                         tool schemas have no counterpart for; remove it",
                        tool.name
                    ))
                })?,
            })
        })
        .collect::<Result<Vec<_>, Refused>>()?;
    let tools = if declarations.is_empty() {
        Vec::new()
    } else {
        vec![Tool {
            function_declarations: declarations,
        }]
    };
    let tool_config = req
        .tool_choice
        .as_ref()
        .map(tool_choice_to_gemini)
        .transpose()?;
    let thinking_config = match req.thinking {
        Some(Thinking::Enabled { budget_tokens }) => Some(ThinkingConfig {
            thinking_budget: Some(i64::from(budget_tokens)),
            include_thoughts: Some(true),
        }),
        Some(Thinking::Adaptive) => Some(ThinkingConfig {
            thinking_budget: Some(-1),
            include_thoughts: Some(true),
        }),
        Some(Thinking::Disabled) | None => None,
    };
    Ok(GenerateContentRequest {
        contents,
        system_instruction,
        tools,
        tool_config,
        generation_config: Some(GenerationConfig {
            max_output_tokens: Some(req.max_tokens),
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            stop_sequences: req.stop_sequences.clone(),
            thinking_config,
        }),
    })
}

fn text_part(text: String) -> Part {
    Part {
        text: Some(text),
        ..Part::default()
    }
}

fn image_part(source: &ImageSource, at: impl Fn() -> String) -> Result<Part, Refused> {
    match source {
        ImageSource::Base64 { media_type, data } => Ok(Part {
            inline_data: Some(Blob {
                mime_type: media_type.clone(),
                data: data.clone(),
            }),
            ..Part::default()
        }),
        ImageSource::Url { .. } => Err(Refused(format!(
            "{}.source: this model takes images as base64 data, not by URL",
            at()
        ))),
    }
}

fn tool_choice_to_gemini(choice: &ToolChoice) -> Result<ToolConfig, Refused> {
    let (mode, allowed, parallel) = match choice {
        ToolChoice::Auto {
            disable_parallel_tool_use,
        } => ("AUTO", None, disable_parallel_tool_use),
        ToolChoice::Any {
            disable_parallel_tool_use,
        } => ("ANY", None, disable_parallel_tool_use),
        ToolChoice::Tool {
            name,
            disable_parallel_tool_use,
        } => ("ANY", Some(name), disable_parallel_tool_use),
        ToolChoice::None => ("NONE", None, &None),
    };
    if *parallel == Some(true) {
        return Err(Refused(
            "tool_choice.disable_parallel_tool_use (parallel_tool_calls: false): this model \
             cannot be limited to one tool call at a time"
                .to_owned(),
        ));
    }
    Ok(ToolConfig {
        function_calling_config: FunctionCallingConfig {
            mode: mode.to_owned(),
            allowed_function_names: allowed.into_iter().cloned().collect(),
        },
    })
}

/// A tool's parameters: `None` for a function without any (Gemini refuses an object schema
/// without properties); `Err` names the keyword that has no counterpart, and where.
pub fn parameters_to_gemini(schema: &Value) -> Result<Option<Value>, String> {
    let translated = schema_to_gemini(schema, "")?;
    let empty = translated
        .get("properties")
        .and_then(Value::as_object)
        .is_none_or(Map::is_empty);
    Ok((!empty || translated.get("type").is_some_and(|t| t != "OBJECT")).then_some(translated))
}

/// Keywords Gemini's `Schema` has under the same name and meaning.
const SAME: &[&str] = &[
    "description",
    "title",
    "format",
    "pattern",
    "nullable",
    "default",
    "example",
    "enum",
    "required",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "propertyOrdering",
];

/// Annotations that constrain nothing, left out.
const ANNOTATIONS: &[&str] = &["$schema", "$id", "$comment", "examples", "deprecated"];

/// A JSON Schema as Gemini's `Schema`: types upper-cased (`["string", "null"]` is a nullable
/// string), `const` a one-value `enum`, an integer's exclusive bounds inclusive ones,
/// subschemas translated in turn. `additionalProperties:
/// false` is left out: Gemini's functions take the declared properties only. `Err`: the
/// keyword, at its path.
pub fn schema_to_gemini(schema: &Value, at: &str) -> Result<Value, String> {
    let refuse = |keyword: &str| {
        Err(if at.is_empty() {
            format!("the keyword {keyword:?}")
        } else {
            format!("the keyword {keyword:?} at {at}")
        })
    };
    let Some(object) = schema.as_object() else {
        return refuse("a non-object schema");
    };
    let mut out = Map::new();
    for (keyword, value) in object {
        match keyword.as_str() {
            "type" => match value {
                Value::String(t) => {
                    out.insert("type".into(), Value::String(t.to_ascii_uppercase()));
                }
                Value::Array(types) => {
                    let named: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
                    match named.as_slice() {
                        [t] => {
                            out.insert("type".into(), Value::String(t.to_ascii_uppercase()));
                        }
                        [t, "null"] | ["null", t] => {
                            out.insert("type".into(), Value::String(t.to_ascii_uppercase()));
                            out.insert("nullable".into(), Value::Bool(true));
                        }
                        _ => return refuse("type (a list of several types)"),
                    }
                }
                _ => return refuse("type"),
            },
            "const" => match value {
                Value::String(_) => {
                    out.insert("enum".into(), Value::Array(vec![value.clone()]));
                }
                _ => return refuse("const (of a non-string value)"),
            },
            "properties" => {
                let Some(properties) = value.as_object() else {
                    return refuse("properties");
                };
                let mut translated = Map::new();
                for (name, property) in properties {
                    let path = format!("{at}.properties.{name}");
                    translated.insert(
                        name.clone(),
                        schema_to_gemini(property, path.trim_start_matches('.'))?,
                    );
                }
                out.insert("properties".into(), Value::Object(translated));
            }
            "items" => {
                if !value.is_object() {
                    return refuse("items (a list of schemas)");
                }
                let path = format!("{at}.items");
                out.insert(
                    "items".into(),
                    schema_to_gemini(value, path.trim_start_matches('.'))?,
                );
            }
            "anyOf" => {
                let Some(choices) = value.as_array() else {
                    return refuse("anyOf");
                };
                let translated = choices
                    .iter()
                    .enumerate()
                    .map(|(k, choice)| {
                        let path = format!("{at}.anyOf[{k}]");
                        schema_to_gemini(choice, path.trim_start_matches('.'))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                out.insert("anyOf".into(), Value::Array(translated));
            }
            // An integer's exclusive bound is the next integer's inclusive one (Claude Code's
            // tools say `exclusiveMinimum: 0`); a number's has no counterpart.
            "exclusiveMinimum" | "exclusiveMaximum" | "minimum" | "maximum" => {
                let integer = object.get("type").and_then(Value::as_str) == Some("integer");
                let (bound, lower) = match keyword.as_str() {
                    "exclusiveMinimum" | "minimum" => ("minimum", true),
                    _ => ("maximum", false),
                };
                let exclusive = keyword.starts_with("exclusive");
                let Some(n) = value.as_f64() else {
                    return refuse(keyword);
                };
                let inclusive = match (exclusive, lower) {
                    (false, _) => value.clone(),
                    (true, true) if integer => Value::from(n.floor() as i64 + 1),
                    (true, false) if integer => Value::from(n.ceil() as i64 - 1),
                    (true, _) => return refuse(&format!("{keyword} (on a non-integer)")),
                };
                // With both forms, the tighter bound holds.
                let tighter = match out.get(bound).and_then(Value::as_f64) {
                    Some(other) if lower => other > inclusive.as_f64().unwrap_or(n),
                    Some(other) => other < inclusive.as_f64().unwrap_or(n),
                    None => false,
                };
                if !tighter {
                    out.insert(bound.into(), inclusive);
                }
            }
            // `true` and `{}` say what an absent keyword says; `false` is left out (a Gemini
            // function gets the declared properties); a schema for the other properties has
            // no counterpart.
            "additionalProperties"
                if value.is_boolean() || value.as_object().is_some_and(Map::is_empty) => {}
            // Property names are strings: a string schema for them constrains nothing.
            "propertyNames"
                if value.as_object().is_some_and(|names| {
                    names.is_empty()
                        || (names.len() == 1 && names.get("type") == Some(&"string".into()))
                }) => {}
            k if SAME.contains(&k) => {
                out.insert(keyword.clone(), value.clone());
            }
            k if ANNOTATIONS.contains(&k) => {}
            other => return refuse(other),
        }
    }
    Ok(Value::Object(out))
}

/// Gemini's usage as the ledger's: `promptTokenCount` includes the cached tokens, which are
/// cache reads; thinking tokens are output tokens.
pub fn usage_from_gemini(usage: &UsageMetadata) -> TokenUsage {
    let cached = usage
        .cached_content_token_count
        .min(usage.prompt_token_count);
    TokenUsage {
        input_tokens: usage.prompt_token_count - cached,
        output_tokens: usage
            .candidates_token_count
            .saturating_add(usage.thoughts_token_count),
        cache_read_input_tokens: cached,
        ..TokenUsage::default()
    }
}

/// A finish reason as the conversation's: `MAX_TOKENS` is max_tokens; any end after a
/// function call is tool_use; every other (`STOP`, a stop sequence, and the refusals:
/// `SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`...) ends the turn, as a refusal
/// does on the other upstreams (the conversation has no stop reason of its own for one).
pub fn stop_from_gemini(reason: Option<&str>, called: bool) -> StopReason {
    match reason {
        Some("MAX_TOKENS") => StopReason::MaxTokens,
        _ if called => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

/// The wait a throttle's body asks for: its `google.rpc.RetryInfo` detail's `retryDelay`
/// (`"37s"`, `"1.5s"`), if any.
pub fn retry_delay(body: &[u8]) -> Option<Duration> {
    let body: ErrorBody = serde_json::from_slice(body).ok()?;
    body.error.details.iter().find_map(|detail| {
        let kind = detail.get("@type")?.as_str()?;
        if !kind.ends_with("google.rpc.RetryInfo") {
            return None;
        }
        let secs: f64 = detail
            .get("retryDelay")?
            .as_str()?
            .strip_suffix('s')?
            .parse()
            .ok()?;
        (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
    })
}

/// Whether an error body is Google's refusal of the API key: a 400 `INVALID_ARGUMENT`, as a
/// refused request is, told apart by its `ErrorInfo` reason `API_KEY_INVALID`.
pub fn refuses_the_key(body: &[u8]) -> bool {
    serde_json::from_slice::<ErrorBody>(body).is_ok_and(|body| {
        body.error
            .details
            .iter()
            .any(|d| d.get("reason").and_then(Value::as_str) == Some("API_KEY_INVALID"))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::conversation::{Message, Request};

    fn tool(schema: Value) -> conversation::Tool {
        conversation::Tool {
            name: "get_weather".into(),
            description: Some("Weather".into()),
            input_schema: schema,
            cache_control: None,
        }
    }

    fn request(messages: Vec<Message>) -> Request {
        Request {
            model: "svc/x".into(),
            max_tokens: 64,
            messages,
            system: Some(Blocks::Text("Be brief.".into())),
            ..Request::default()
        }
    }

    #[test]
    fn a_tool_round_trip_becomes_a_function_call_and_a_named_function_response() {
        let mut req = request(vec![
            Message {
                role: Role::User,
                content: Blocks::Text("Weather in Paris?".into()),
            },
            Message {
                role: Role::Assistant,
                content: Blocks::Blocks(vec![InputBlock::ToolUse {
                    id: "toolu_1".into(),
                    name: "get_weather".into(),
                    input: json!({"city": "Paris"}),
                    cache_control: None,
                }]),
            },
            Message {
                role: Role::User,
                content: Blocks::Blocks(vec![InputBlock::ToolResult {
                    tool_use_id: "toolu_1".into(),
                    content: Some(Blocks::Text("18C".into())),
                    is_error: None,
                    cache_control: None,
                }]),
            },
        ]);
        req.tools = vec![tool(json!({"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}))];
        req.tool_choice = Some(ToolChoice::Tool {
            name: "get_weather".into(),
            disable_parallel_tool_use: None,
        });
        let body =
            serde_json::to_value(request_to_gemini(&req).expect("translates")).expect("serializes");
        assert_eq!(
            body["systemInstruction"],
            json!({"parts": [{"text": "Be brief."}]})
        );
        assert_eq!(body["contents"][1]["role"], "model");
        assert_eq!(
            body["contents"][1]["parts"][0]["functionCall"],
            json!({"name": "get_weather", "args": {"city": "Paris"}})
        );
        assert_eq!(
            body["contents"][2]["parts"][0]["functionResponse"],
            json!({"name": "get_weather", "response": {"content": "18C"}})
        );
        assert_eq!(
            body["tools"][0]["functionDeclarations"][0]["parameters"],
            json!({"type": "OBJECT", "properties": {"city": {"type": "STRING"}},
                "required": ["city"]})
        );
        assert_eq!(
            body["toolConfig"],
            json!({"functionCallingConfig": {"mode": "ANY",
                "allowedFunctionNames": ["get_weather"]}})
        );
        assert_eq!(body["generationConfig"], json!({"maxOutputTokens": 64}));
    }

    #[test]
    fn a_schema_keyword_without_a_counterpart_is_refused_naming_it_and_where() {
        let schema = json!({"type": "object", "properties": {"unit": {"oneOf": [
            {"type": "string"}, {"type": "integer"}]}}});
        let mut req = request(Vec::new());
        req.tools = vec![tool(schema)];
        let refused = request_to_gemini(&req).expect_err("refused");
        assert!(
            refused.0.contains("\"oneOf\" at properties.unit") && refused.0.contains("get_weather"),
            "{refused}"
        );
        assert!(!refused.0.to_lowercase().contains("gemini"), "{refused}");
    }

    #[test]
    fn a_nullable_type_list_and_a_const_have_gemini_counterparts() {
        let translated =
            schema_to_gemini(&json!({"type": ["string", "null"], "const": "celsius"}), "")
                .expect("translates");
        assert_eq!(
            translated,
            json!({"type": "STRING", "nullable": true, "enum": ["celsius"]})
        );
        assert_eq!(parameters_to_gemini(&json!({"type": "object"})), Ok(None));
        assert_eq!(
            schema_to_gemini(
                &json!({"type": "integer", "exclusiveMinimum": 0, "maximum": 9,
                    "exclusiveMaximum": 5}),
                ""
            ),
            Ok(json!({"type": "INTEGER", "minimum": 1, "maximum": 4}))
        );
        assert!(
            schema_to_gemini(&json!({"type": "number", "exclusiveMinimum": 0}), "")
                .is_err_and(|e| e.contains("exclusiveMinimum")),
            "a number's exclusive bound has no counterpart"
        );
    }

    #[test]
    fn cached_tokens_are_cache_reads_and_thoughts_are_output() {
        let usage = usage_from_gemini(&UsageMetadata {
            prompt_token_count: 100,
            candidates_token_count: 7,
            cached_content_token_count: 60,
            thoughts_token_count: 5,
        });
        assert_eq!(
            (
                usage.input_tokens,
                usage.cache_read_input_tokens,
                usage.output_tokens
            ),
            (40, 60, 12)
        );
    }

    #[test]
    fn a_throttles_retry_info_is_its_wait() {
        let body = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure"},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]}});
        assert_eq!(
            retry_delay(body.to_string().as_bytes()),
            Some(Duration::from_secs(37))
        );
        assert_eq!(retry_delay(b"{\"error\": {}}"), None);
    }
}
