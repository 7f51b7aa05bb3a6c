//! A Responses API request translated into the conversation (`crate::conversation`), and the
//! turn's usage back into the response's (`api/responses/` serves the endpoint; the stream's output
//! items are its `output.rs`, which holds the stream's state).
//!
//! Rules: `instructions` open the system prompt; `system` and `developer` messages join it
//! (later ones are folded into the conversation as the Messages API does); consecutive items of
//! one role form one canonical turn (a `function_call` is an assistant `tool_use`, a
//! `function_call_output` a user `tool_result`); a `reasoning` item is replayed as the thinking
//! it seals, and is skipped without `encrypted_content`; items of hosted tools are skipped;
//! `temperature` is accepted in [0, 2] and clamped to 1; `text.format` JSON modes become an
//! instruction in the system prompt, which every upstream can follow.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{
    ContentPart, InputItem, InputTokensDetails, ItemKind, ItemRole, OutputTokensDetails,
    RequestTool, ResponseUsage, ResponsesRequest, TextFormat, ToolChoiceMode, ToolChoiceParam,
};
use crate::conversation::{
    BilledUsage, Content, InputBlock, Message, Metadata, Request, Role, Thinking, Tool, ToolChoice,
};
use crate::seal::Sealer;
use crate::validate::Invalid;
use crate::wire::one_or_many::StringOr;
use crate::wire::openai::translate::image_from_url;
use crate::wire::openai::ReasoningEffort;

/// The most characters of a tool name an upstream takes.
const MAX_TOOL_NAME: usize = 64;

/// The conversation, with what is needed to answer in the Responses format.
pub struct Translated {
    pub request: Request,
    /// The client left `max_output_tokens` out: reserve as chat completions does.
    pub open_max_tokens: bool,
    pub names: ToolNames,
    /// The paths of the items that carried nothing for the model (hosted-tool calls and their
    /// outputs, reasoning without sealed thinking): stored, never sent.
    pub skipped: Vec<String>,
}

/// Upstream tool names and the (namespace, name) the client knows them by: a namespaced
/// function is offered as `<namespace>__<name>` (shortened with a hash past 64 characters),
/// and its calls go back to the client in the namespaced form.
#[derive(Clone, Debug, Default)]
pub struct ToolNames {
    by_upstream: HashMap<String, (Option<String>, String)>,
}

impl ToolNames {
    fn upstream(namespace: Option<&str>, name: &str) -> String {
        let Some(namespace) = namespace else {
            return name.to_owned();
        };
        let joined = format!("{namespace}__{name}");
        if joined.len() <= MAX_TOOL_NAME {
            return joined;
        }
        let hash = hex::encode(&Sha256::digest(joined.as_bytes())[..6]);
        let keep: String = joined
            .chars()
            .take(MAX_TOOL_NAME - hash.len() - 1)
            .collect();
        format!("{keep}_{hash}")
    }

    fn offer(&mut self, namespace: Option<&str>, name: &str) -> String {
        let upstream = Self::upstream(namespace, name);
        self.by_upstream.insert(
            upstream.clone(),
            (namespace.map(str::to_owned), name.to_owned()),
        );
        upstream
    }

    /// The (namespace, name) of a tool the model called.
    pub fn client(&self, upstream: &str) -> (Option<String>, String) {
        self.by_upstream
            .get(upstream)
            .cloned()
            .unwrap_or_else(|| (None, upstream.to_owned()))
    }
}

/// One input item and where it came from, for error messages.
pub struct Labeled {
    pub path: String,
    pub item: InputItem,
}

/// The request's own input, each item labeled with where it is.
pub fn labeled_input(req: &ResponsesRequest) -> Vec<Labeled> {
    match req.input.clone() {
        None => Vec::new(),
        Some(StringOr::String(text)) => vec![Labeled {
            path: "input".to_owned(),
            item: InputItem::user_text(text),
        }],
        Some(StringOr::Many(input)) => input
            .into_iter()
            .enumerate()
            .map(|(i, item)| Labeled {
                path: format!("input[{i}]"),
                item,
            })
            .collect(),
    }
}

/// `items`: the conversation so far (inherited through `previous_response_id`, then this
/// request's `input`). `thinking_capable`: whether the model has thinking, so that
/// `reasoning.effort` may turn it on.
pub fn translate(
    req: &ResponsesRequest,
    items: Vec<Labeled>,
    thinking_capable: bool,
    sealer: &Sealer,
) -> Result<Translated, Invalid> {
    if req.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(Invalid::new("temperature: must be between 0 and 2"));
    }
    if req.background == Some(true) {
        return Err(Invalid::new(
            "background: background responses are not supported; stream instead",
        ));
    }
    let mut names = ToolNames::default();
    let tools = tools(&req.tools, None, &mut names);

    let mut messages: Vec<Message> = Vec::new();
    if let Some(instructions) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(Message {
            role: Role::System,
            content: Content::Text(instructions.clone()),
        });
    }
    if let Some(instruction) = req
        .text
        .as_ref()
        .and_then(|t| format_instruction(&t.format))
    {
        messages.push(Message {
            role: Role::System,
            content: Content::Text(instruction),
        });
    }
    // Calls of hosted tools are skipped, and so are their outputs, wherever they come from.
    let mut hosted_calls: HashSet<String> = HashSet::new();
    let mut skipped = Vec::new();
    for Labeled { path, item } in items {
        let call_id = item.call_id.clone().unwrap_or_default();
        match item.kind {
            Some(ItemKind::Other) => {
                if !call_id.is_empty() {
                    hosted_calls.insert(call_id);
                }
                skipped.push(path);
                continue;
            }
            Some(ItemKind::FunctionCallOutput | ItemKind::CustomToolCallOutput)
                if hosted_calls.contains(&call_id) =>
            {
                skipped.push(path);
                continue;
            }
            _ => {}
        }
        match item_blocks(item, &path, sealer)? {
            Some((role, blocks)) if !blocks.is_empty() => {
                Message::append(&mut messages, role, blocks);
            }
            _ => skipped.push(path),
        }
    }

    let max_tokens = req.max_output_tokens;
    let mut request = Request {
        model: req.model.clone(),
        max_tokens: max_tokens.unwrap_or(0),
        messages,
        system: None,
        temperature: req.temperature.map(|t| t.min(1.0)),
        top_p: req.top_p,
        top_k: None,
        stop_sequences: Vec::new(),
        stream: req.stream.unwrap_or(false),
        tool_choice: tool_choice(req, &tools, &names)?,
        tools,
        thinking: None,
        metadata: crate::wire::openai::translate::end_user(
            req.safety_identifier.clone(),
            req.user.clone(),
        )?
        .map(|user_id| Metadata {
            user_id: Some(user_id),
        }),
    };
    request.fold_system_messages();
    if request.messages.is_empty() {
        return Err(Invalid::new(
            "input: at least one user message is required (or previous_response_id)",
        ));
    }
    if thinking_capable {
        request.thinking = thinking(req, &request);
    }
    if request.thinking.is_some() {
        // Thinking upstreams take only their default sampling while thinking; the client's
        // sampling is accepted and not applied rather than failing the turn.
        request.temperature = None;
        request.top_p = None;
    }
    Ok(Translated {
        request,
        open_max_tokens: max_tokens.is_none(),
        names,
        skipped,
    })
}

fn tools(tools: &[RequestTool], namespace: Option<&str>, names: &mut ToolNames) -> Vec<Tool> {
    let mut offered = Vec::new();
    for tool in tools {
        match tool {
            RequestTool::Function(f) => offered.push(Tool {
                name: names.offer(namespace, &f.name),
                description: f.description.clone(),
                input_schema: f
                    .parameters
                    .clone()
                    .filter(|p| !p.is_null())
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                cache_control: None,
            }),
            // Namespaces do not nest in the public API; one level is all that is read.
            RequestTool::Namespace { name, tools: inner } if namespace.is_none() => {
                offered.extend(self::tools(inner, Some(name), names));
            }
            RequestTool::Namespace { .. } | RequestTool::Hosted => {}
        }
    }
    offered
}

fn tool_choice(
    req: &ResponsesRequest,
    tools: &[Tool],
    names: &ToolNames,
) -> Result<Option<ToolChoice>, Invalid> {
    let disable_parallel_tool_use = req.parallel_tool_calls.map(|p| !p);
    if tools.is_empty() {
        // Nothing to choose from (hosted tools are not offered): the model answers in text.
        return Ok(None);
    }
    let auto = ToolChoice::Auto {
        disable_parallel_tool_use,
    };
    let any = ToolChoice::Any {
        disable_parallel_tool_use,
    };
    Ok(match &req.tool_choice {
        None => disable_parallel_tool_use.map(|_| auto),
        Some(ToolChoiceParam::Mode(ToolChoiceMode::None)) => Some(ToolChoice::None),
        Some(ToolChoiceParam::Mode(ToolChoiceMode::Auto)) => Some(auto),
        Some(ToolChoiceParam::Mode(ToolChoiceMode::Required)) => Some(any),
        Some(ToolChoiceParam::Object { kind, name, .. }) if kind == "function" => {
            let Some(name) = name else {
                return Err(Invalid::new(
                    "tool_choice.name: required for a `function` tool choice",
                ));
            };
            let upstream = names
                .by_upstream
                .iter()
                .find(|(_, (_, n))| n == name)
                .map(|(u, _)| u.clone())
                .unwrap_or_else(|| name.clone());
            Some(ToolChoice::Tool {
                name: upstream,
                disable_parallel_tool_use,
            })
        }
        Some(ToolChoiceParam::Object { kind, mode, .. }) if kind == "allowed_tools" => {
            Some(if mode.as_deref() == Some("required") {
                any
            } else {
                auto
            })
        }
        // A hosted or custom tool the gateway does not offer: the model chooses.
        Some(ToolChoiceParam::Object { .. }) => Some(auto),
    })
}

fn format_instruction(format: &Option<TextFormat>) -> Option<String> {
    match format.as_ref()? {
        TextFormat::Text => None,
        TextFormat::JsonObject => {
            Some("Respond with a single JSON object and nothing else.".to_owned())
        }
        TextFormat::JsonSchema { name, schema } => Some(format!(
            "Respond with a single JSON object{} that validates against this JSON schema, and nothing else:\n{schema}",
            name.as_deref().map(|n| format!(" (`{n}`)")).unwrap_or_default()
        )),
    }
}

/// `reasoning.effort` as a thinking budget, by the same rule as chat completions'
/// `reasoning_effort` (`ReasoningEffort::thinking`, within max_output_tokens); no thinking
/// when `tool_choice` forces a tool, or when the turn continues a tool call made without
/// thinking (upstreams refuse to think in either case).
fn thinking(req: &ResponsesRequest, request: &Request) -> Option<Thinking> {
    let effort = req
        .reasoning
        .as_ref()?
        .effort
        .unwrap_or(ReasoningEffort::Medium);
    let continues_unthought_call = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .is_some_and(|m| {
            let mut blocks = m.blocks();
            let starts_thinking = matches!(blocks.next(), Some(InputBlock::Thinking { .. }));
            !starts_thinking && m.blocks().any(|b| matches!(b, InputBlock::ToolUse { .. }))
        });
    let forces_a_tool = matches!(
        request.tool_choice,
        Some(ToolChoice::Any { .. } | ToolChoice::Tool { .. })
    );
    if forces_a_tool || continues_unthought_call {
        return None;
    }
    effort.thinking(req.max_output_tokens)
}

/// The canonical turn one item belongs to and its blocks; `None` for items that carry
/// nothing for the model.
fn item_blocks(
    item: InputItem,
    path: &str,
    sealer: &Sealer,
) -> Result<Option<(Role, Vec<InputBlock>)>, Invalid> {
    let kind = match (item.kind, item.role) {
        (Some(kind), _) => kind,
        (None, Some(_)) => ItemKind::Message,
        (None, None) => {
            return Err(Invalid::new(format!(
                "{path}.type: required (or `role`, for a message)"
            )))
        }
    };
    let required = |value: Option<String>, field: &str| {
        value.ok_or_else(|| Invalid::new(format!("{path}.{field}: required")))
    };
    Ok(Some(match kind {
        ItemKind::Message => {
            let Some(role) = item.role else {
                return Err(Invalid::new(format!(
                    "{path}.role: required for a message"
                )));
            };
            let Some(content) = item.content else {
                return Err(Invalid::new(format!("{path}.content: required")));
            };
            let role = match role {
                ItemRole::User => Role::User,
                ItemRole::Assistant => Role::Assistant,
                ItemRole::System | ItemRole::Developer => Role::System,
            };
            let blocks = content_blocks(content, &format!("{path}.content"), role)?;
            if role == Role::System {
                let text = Message {
                    role,
                    content: Content::Blocks(blocks),
                }
                .text();
                (role, vec![InputBlock::text(text)])
            } else {
                (role, blocks)
            }
        }
        ItemKind::FunctionCall | ItemKind::CustomToolCall => {
            let call_id = required(item.call_id, "call_id")?;
            let name = required(item.name, "name")?;
            let input = if kind == ItemKind::FunctionCall {
                let arguments = item.arguments.unwrap_or_default();
                if arguments.trim().is_empty() {
                    json!({})
                } else {
                    serde_json::from_str(&arguments).map_err(|_| {
                        Invalid::new(format!("{path}.arguments: not valid JSON"))
                    })?
                }
            } else {
                json!({"input": item.input.unwrap_or_default()})
            };
            (
                Role::Assistant,
                vec![InputBlock::ToolUse {
                    id: call_id,
                    name: ToolNames::upstream(item.namespace.as_deref(), &name),
                    input,
                    cache_control: None,
                }],
            )
        }
        ItemKind::FunctionCallOutput | ItemKind::CustomToolCallOutput => {
            let call_id = required(item.call_id, "call_id")?;
            let content = match item.output {
                None => None,
                Some(StringOr::String(text)) => Some(Content::Text(text)),
                Some(parts) => Some(Content::Blocks(content_blocks(
                    parts,
                    &format!("{path}.output"),
                    Role::User,
                )?)),
            };
            (
                Role::User,
                vec![InputBlock::ToolResult {
                    tool_use_id: call_id,
                    content,
                    is_error: None,
                    cache_control: None,
                }],
            )
        }
        ItemKind::Reasoning => {
            let Some(sealed) = item.encrypted_content else {
                return Ok(None);
            };
            let thinking = sealer
                .open(&sealed)
                .map_err(|e| Invalid::new(format!("{path}.encrypted_content: {e}")))?;
            // Thinking streamed without a signature (an OpenAI-compatible upstream's
            // reasoning) cannot be replayed to an upstream that checks one.
            if thinking.signature.is_empty() {
                return Ok(None);
            }
            (
                Role::Assistant,
                vec![InputBlock::Thinking {
                    thinking: thinking.thinking,
                    signature: thinking.signature,
                }],
            )
        }
        ItemKind::ItemReference => {
            return Err(Invalid::new(format!(
                "{path}.type: `item_reference` is not supported; resend the item, or continue with previous_response_id"
            )))
        }
        ItemKind::Other => return Ok(None),
    }))
}

fn content_blocks(
    content: StringOr<ContentPart>,
    path: &str,
    role: Role,
) -> Result<Vec<InputBlock>, Invalid> {
    let parts = match content {
        StringOr::String(text) if text.is_empty() => return Ok(Vec::new()),
        StringOr::String(text) => return Ok(vec![InputBlock::text(text)]),
        StringOr::Many(parts) => parts,
    };
    let mut blocks = Vec::new();
    for (j, part) in parts.into_iter().enumerate() {
        let text = match part {
            ContentPart::InputText { text }
            | ContentPart::OutputText { text }
            | ContentPart::ReasoningText { text }
            | ContentPart::SummaryText { text }
            | ContentPart::Refusal { refusal: text } => text,
            ContentPart::InputImage { image_url, file_id } => {
                if role == Role::Assistant {
                    continue;
                }
                let source = match (image_url, file_id) {
                    (Some(url), _) => image_from_url(&url).ok_or_else(|| {
                        Invalid::new(format!(
                            "{path}[{j}].image_url: expected an https URL or a base64 data URL"
                        ))
                    })?,
                    (None, Some(_)) => {
                        return Err(Invalid::new(format!(
                            "{path}[{j}].file_id: file ids are not supported; send the image as image_url"
                        )))
                    }
                    (None, None) => {
                        return Err(Invalid::new(format!("{path}[{j}].image_url: required")))
                    }
                };
                blocks.push(InputBlock::Image {
                    source,
                    cache_control: None,
                });
                continue;
            }
            ContentPart::InputFile {} => {
                return Err(Invalid::new(format!(
                    "{path}[{j}].type: `input_file` is not supported"
                )))
            }
        };
        // Upstreams refuse empty text blocks; an empty part carries nothing anyway.
        if !text.is_empty() {
            blocks.push(InputBlock::text(text));
        }
    }
    Ok(blocks)
}

/// A settled turn's usage as the response's: cached prompt tokens are cache reads, counted in
/// `input_tokens`; `reasoning_tokens` is the part of the output that was thinking.
pub fn usage_to_responses(usage: &BilledUsage, reasoning_tokens: u32) -> ResponseUsage {
    let t = &usage.tokens;
    let input = t.input_tokens + t.cache_creation_input_tokens + t.cache_read_input_tokens;
    ResponseUsage {
        input_tokens: input,
        input_tokens_details: InputTokensDetails {
            cached_tokens: t.cache_read_input_tokens,
        },
        output_tokens: t.output_tokens,
        output_tokens_details: OutputTokensDetails { reasoning_tokens },
        total_tokens: input + t.output_tokens,
        credits_consumed: usage.credits,
    }
}

/// The input items as stored and listed: a string input becomes a user message, every item
/// gets an id and a `type`, and message content is always a list of parts.
pub fn normalized_items(input: &Value) -> Vec<Value> {
    let items = match input {
        Value::String(text) => vec![json!({"role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    items.into_iter().map(normalized_item).collect()
}

fn normalized_item(mut item: Value) -> Value {
    let Some(object) = item.as_object_mut() else {
        return item;
    };
    if !object.contains_key("type") && object.contains_key("role") {
        object.insert("type".into(), json!("message"));
    }
    let kind = object
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("item")
        .to_owned();
    if kind == "message" {
        if let Some(Value::String(text)) = object.get("content") {
            let part = if object.get("role").and_then(Value::as_str) == Some("assistant") {
                json!({"type": "output_text", "text": text, "annotations": []})
            } else {
                json!({"type": "input_text", "text": text})
            };
            object.insert("content".into(), json!([part]));
        }
    }
    if !object.get("id").is_some_and(Value::is_string) {
        let id = crate::ids::response_item(&kind);
        object.insert("id".into(), json!(id));
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> (ResponsesRequest, Vec<Labeled>) {
        let req: ResponsesRequest = serde_json::from_value(body).expect("a valid request");
        let items = match req.input.clone() {
            Some(StringOr::Many(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| Labeled {
                    path: format!("input[{i}]"),
                    item,
                })
                .collect(),
            _ => Vec::new(),
        };
        (req, items)
    }

    #[test]
    fn namespaced_functions_are_offered_joined_and_called_back_namespaced() {
        let (req, items) = request(json!({"model": "svc/opus", "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "namespace": "crm", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "found"}],
            "tools": [{"type": "namespace", "name": "crm", "description": "CRM",
                       "tools": [{"type": "function", "name": "lookup"}]},
                      {"type": "web_search"}]}));
        let t = translate(&req, items, false, &Sealer::new(None)).expect("translates");
        let names: Vec<&str> = t.request.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["crm__lookup"], "hosted tools are not offered");
        assert_eq!(
            t.names.client("crm__lookup"),
            (Some("crm".into()), "lookup".into())
        );
        let InputBlock::ToolUse { name, .. } = t.request.messages[1].blocks().next().unwrap()
        else {
            panic!("a tool_use block");
        };
        assert_eq!(name, "crm__lookup");
    }

    #[test]
    fn long_namespaced_names_stay_within_the_upstream_limit() {
        let name = ToolNames::upstream(Some(&"n".repeat(60)), "function_name");
        assert_eq!(name.len(), MAX_TOOL_NAME);
        assert_eq!(
            name,
            ToolNames::upstream(Some(&"n".repeat(60)), "function_name")
        );
    }

    #[test]
    fn effort_turns_thinking_on_within_max_output_tokens_only_for_thinking_models() {
        let body = json!({"model": "svc/opus", "input": [{"role": "user", "content": "hi"}],
                          "max_output_tokens": 4000, "reasoning": {"effort": "high"},
                          "temperature": 0.2});
        let (req, items) = request(body.clone());
        let t = translate(&req, items, true, &Sealer::new(None)).unwrap();
        assert!(
            t.request.temperature.is_none(),
            "sampling is left to thinking upstreams"
        );
        assert!(matches!(
            t.request.thinking,
            Some(Thinking::Enabled {
                budget_tokens: 3999
            })
        ));
        let (req, items) = request(body);
        let t = translate(&req, items, false, &Sealer::new(None)).unwrap();
        assert!(t.request.thinking.is_none());
    }

    #[test]
    fn a_json_schema_text_format_becomes_an_instruction_after_the_instructions() {
        let (req, items) = request(json!({"model": "svc/sonnet", "instructions": "Be brief.",
            "input": [{"role": "user", "content": "hi"}],
            "text": {"format": {"type": "json_schema", "name": "answer",
                                "schema": {"type": "object"}}}}));
        let t = translate(&req, items, false, &Sealer::new(None)).unwrap();
        let system = t.request.system_text().unwrap_or_default();
        assert!(
            system.starts_with("Be brief.\n\nRespond with a single JSON object (`answer`)"),
            "{system}"
        );
        assert!(system.ends_with(r#"{"type":"object"}"#), "{system}");
    }

    #[test]
    fn an_input_without_a_user_message_is_refused_naming_input() {
        let (req, items) = request(json!({"model": "svc/sonnet", "instructions": "Be brief.",
            "input": [{"role": "developer", "content": "rules"}]}));
        let err = translate(&req, items, false, &Sealer::new(None))
            .err()
            .expect("refused");
        assert!(err.0.starts_with("input:"), "{}", err.0);
    }

    #[test]
    fn a_tool_choice_that_forces_a_tool_leaves_thinking_off() {
        let (req, items) = request(json!({"model": "svc/opus", "max_output_tokens": 4000,
            "input": [{"role": "user", "content": "hi"}], "reasoning": {"effort": "low"},
            "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}));
        let t = translate(&req, items, true, &Sealer::new(None)).unwrap();
        assert!(t.request.thinking.is_none());
    }

    #[test]
    fn a_tampered_reasoning_item_is_refused_naming_the_item() {
        let sealer = Sealer::new(None);
        let sealed = sealer.seal(&crate::seal::Thinking {
            thinking: "t".into(),
            signature: "s".into(),
        });
        let tampered = format!("{sealed}x");
        let (req, items) = request(json!({"model": "svc/opus", "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": tampered},
            {"role": "user", "content": "again"}]}));
        let err = translate(&req, items, true, &sealer)
            .err()
            .expect("refused");
        assert!(err.0.starts_with("input[1].encrypted_content"), "{}", err.0);
    }

    #[test]
    fn cached_prompt_tokens_count_in_input_tokens_and_are_shown_as_cached() {
        let usage = usage_to_responses(
            &BilledUsage {
                tokens: store::usage::TokenUsage {
                    input_tokens: 10,
                    output_tokens: 4,
                    cache_creation_input_tokens: 2,
                    cache_read_input_tokens: 5,
                    ..Default::default()
                },
                credits: 3,
            },
            1,
        );
        assert_eq!((usage.input_tokens, usage.total_tokens), (17, 21));
        assert_eq!(usage.input_tokens_details.cached_tokens, 5);
        assert_eq!(usage.output_tokens_details.reasoning_tokens, 1);
        assert_eq!(usage.credits_consumed, 3);
    }
}
