//! The Messages API and the conversation a turn serves, both ways, written once for both
//! sides: the endpoint (`api/messages.rs`, `api/count_tokens.rs`) reads a client's request
//! with [`request_from_messages`] (or [`request_from_count_tokens`]) and writes the turn's
//! output with [`block_to_messages`], [`delta_to_messages`] and [`usage_to_messages`]; the
//! `anthropic` adapter (`providers/anthropic.rs`) writes the upstream's request with
//! [`request_to_messages`] and reads its stream with [`block_from_messages`] and
//! [`delta_from_messages`].
//!
//! The conversation keeps the client's shape (plain text stays text, `cache_control`,
//! `citations` and every optional field as sent), so an `anthropic` upstream is sent what the
//! client wrote, except: the upstream's model name; no empty system list (the API rejects
//! it, like the other empty lists, which serialization leaves out); and tool call ids made
//! safe for it (`ids::tool_call_for_upstream`), call and result alike, since a
//! chat-completions client may send back any form of id. An omitted `temperature` stays
//! omitted: the API's default is the spec's (1), and sending it would break requests the API
//! accepts without it (recent models refuse `temperature` together with `top_p`).

use super::{
    CountTokensRequest, Delta, ImageSource, InputBlock, InputMessage, MessagesRequest,
    MessagesUsage, Metadata, OutputBlock, Role, TextBlock, TextType, Thinking, Tool, ToolChoice,
};
use crate::conversation::{self, Content, Message, SystemBlock};
use crate::ids;
use crate::wire::one_or_many::StringOr;

/// A client's request as the conversation, its strings moved, not copied; `system` messages
/// inside it folded into what every upstream accepts.
pub fn request_from_messages(r: MessagesRequest) -> conversation::Request {
    let mut request = conversation::Request {
        model: r.model,
        max_tokens: r.max_tokens,
        messages: r.messages.into_iter().map(message_from).collect(),
        system: r.system.map(system_from),
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: r.top_k,
        stop_sequences: r.stop_sequences,
        stream: r.stream,
        tools: r.tools.into_iter().map(tool_from).collect(),
        tool_choice: r.tool_choice.map(tool_choice_from),
        thinking: r.thinking.map(thinking_from),
        metadata: r
            .metadata
            .map(|m| conversation::Metadata { user_id: m.user_id }),
    };
    request.fold_system_messages();
    request
}

/// A count_tokens body as the conversation it would be: one output token, not streamed.
pub fn request_from_count_tokens(r: CountTokensRequest) -> conversation::Request {
    request_from_messages(MessagesRequest {
        model: r.model,
        max_tokens: 1,
        messages: r.messages,
        system: r.system,
        temperature: None,
        top_p: None,
        top_k: None,
        stop_sequences: Vec::new(),
        stream: false,
        tools: r.tools,
        tool_choice: r.tool_choice,
        thinking: r.thinking,
        metadata: None,
    })
}

/// The conversation as an upstream's Messages request for `model` (the upstream's name for
/// it). Whether to stream is the adapter's to say.
pub fn request_to_messages(req: &conversation::Request, model: &str) -> MessagesRequest {
    MessagesRequest {
        model: model.to_owned(),
        max_tokens: req.max_tokens,
        messages: req.messages.iter().map(message_to).collect(),
        system: req
            .system
            .as_ref()
            .filter(|system| !matches!(system, Content::Blocks(blocks) if blocks.is_empty()))
            .map(system_to),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop_sequences: req.stop_sequences.clone(),
        stream: req.stream,
        tools: req.tools.iter().map(tool_to).collect(),
        tool_choice: req.tool_choice.as_ref().map(tool_choice_to),
        thinking: req.thinking.map(thinking_to),
        metadata: req.metadata.as_ref().map(|m| Metadata {
            user_id: m.user_id.clone(),
        }),
    }
}

pub fn block_to_messages(block: conversation::OutputBlock) -> OutputBlock {
    match block {
        conversation::OutputBlock::Text { text } => OutputBlock::Text { text },
        conversation::OutputBlock::ToolUse { id, name, input } => {
            OutputBlock::ToolUse { id, name, input }
        }
        conversation::OutputBlock::Thinking {
            thinking,
            signature,
        } => OutputBlock::Thinking {
            thinking,
            signature,
        },
    }
}

pub fn block_from_messages(block: OutputBlock) -> conversation::OutputBlock {
    match block {
        OutputBlock::Text { text } => conversation::OutputBlock::Text { text },
        OutputBlock::ToolUse { id, name, input } => {
            conversation::OutputBlock::ToolUse { id, name, input }
        }
        OutputBlock::Thinking {
            thinking,
            signature,
        } => conversation::OutputBlock::Thinking {
            thinking,
            signature,
        },
    }
}

pub fn delta_to_messages(delta: conversation::Delta) -> Delta {
    match delta {
        conversation::Delta::Text { text } => Delta::Text { text },
        conversation::Delta::InputJson { partial_json } => Delta::InputJson { partial_json },
        conversation::Delta::Thinking { thinking } => Delta::Thinking { thinking },
        conversation::Delta::Signature { signature } => Delta::Signature { signature },
    }
}

pub fn delta_from_messages(delta: Delta) -> conversation::Delta {
    match delta {
        Delta::Text { text } => conversation::Delta::Text { text },
        Delta::InputJson { partial_json } => conversation::Delta::InputJson { partial_json },
        Delta::Thinking { thinking } => conversation::Delta::Thinking { thinking },
        Delta::Signature { signature } => conversation::Delta::Signature { signature },
    }
}

/// A settled turn's usage as the response's usage object, with the credits it cost.
pub fn usage_to_messages(usage: conversation::BilledUsage) -> MessagesUsage {
    MessagesUsage {
        tokens: usage.tokens,
        credits_consumed: Some(usage.credits),
    }
}

fn message_from(m: InputMessage) -> Message {
    Message {
        role: match m.role {
            Role::User => conversation::Role::User,
            Role::Assistant => conversation::Role::Assistant,
            Role::System => conversation::Role::System,
        },
        content: content_from(m.content),
    }
}

fn message_to(m: &Message) -> InputMessage {
    InputMessage {
        role: match m.role {
            conversation::Role::User => Role::User,
            conversation::Role::Assistant => Role::Assistant,
            conversation::Role::System => Role::System,
        },
        content: content_to(&m.content),
    }
}

fn content_from(content: StringOr<InputBlock>) -> Content<conversation::InputBlock> {
    match content {
        StringOr::String(text) => Content::Text(text),
        StringOr::Many(blocks) => Content::Blocks(blocks.into_iter().map(block_from).collect()),
    }
}

fn content_to(content: &Content<conversation::InputBlock>) -> StringOr<InputBlock> {
    match content {
        Content::Text(text) => StringOr::String(text.clone()),
        Content::Blocks(blocks) => StringOr::Many(blocks.iter().map(block_to).collect()),
    }
}

fn system_from(system: StringOr<TextBlock>) -> Content<SystemBlock> {
    match system {
        StringOr::String(text) => Content::Text(text),
        StringOr::Many(blocks) => Content::Blocks(
            blocks
                .into_iter()
                .map(|b| SystemBlock {
                    text: b.text,
                    cache_control: b.cache_control,
                })
                .collect(),
        ),
    }
}

fn system_to(system: &Content<SystemBlock>) -> StringOr<TextBlock> {
    match system {
        Content::Text(text) => StringOr::String(text.clone()),
        Content::Blocks(blocks) => StringOr::Many(
            blocks
                .iter()
                .map(|b| TextBlock {
                    kind: TextType::Text,
                    text: b.text.clone(),
                    cache_control: b.cache_control.clone(),
                })
                .collect(),
        ),
    }
}

fn block_from(block: InputBlock) -> conversation::InputBlock {
    match block {
        InputBlock::Text {
            text,
            cache_control,
            citations,
        } => conversation::InputBlock::Text {
            text,
            cache_control,
            citations,
        },
        InputBlock::Image {
            source,
            cache_control,
        } => conversation::InputBlock::Image {
            source: match source {
                ImageSource::Base64 { media_type, data } => {
                    conversation::ImageSource::Base64 { media_type, data }
                }
                ImageSource::Url { url } => conversation::ImageSource::Url { url },
            },
            cache_control,
        },
        InputBlock::ToolUse {
            id,
            name,
            input,
            cache_control,
        } => conversation::InputBlock::ToolUse {
            id,
            name,
            input,
            cache_control,
        },
        InputBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
            cache_control,
        } => conversation::InputBlock::ToolResult {
            tool_use_id,
            content: content.map(content_from),
            is_error,
            cache_control,
        },
        InputBlock::Thinking {
            thinking,
            signature,
        } => conversation::InputBlock::Thinking {
            thinking,
            signature,
        },
        InputBlock::RedactedThinking { data } => {
            conversation::InputBlock::RedactedThinking { data }
        }
    }
}

fn block_to(block: &conversation::InputBlock) -> InputBlock {
    match block {
        conversation::InputBlock::Text {
            text,
            cache_control,
            citations,
        } => InputBlock::Text {
            text: text.clone(),
            cache_control: cache_control.clone(),
            citations: citations.clone(),
        },
        conversation::InputBlock::Image {
            source,
            cache_control,
        } => InputBlock::Image {
            source: match source {
                conversation::ImageSource::Base64 { media_type, data } => ImageSource::Base64 {
                    media_type: media_type.clone(),
                    data: data.clone(),
                },
                conversation::ImageSource::Url { url } => ImageSource::Url { url: url.clone() },
            },
            cache_control: cache_control.clone(),
        },
        conversation::InputBlock::ToolUse {
            id,
            name,
            input,
            cache_control,
        } => InputBlock::ToolUse {
            id: safe_tool_id(id),
            name: name.clone(),
            input: input.clone(),
            cache_control: cache_control.clone(),
        },
        conversation::InputBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
            cache_control,
        } => InputBlock::ToolResult {
            tool_use_id: safe_tool_id(tool_use_id),
            content: content.as_ref().map(content_to),
            is_error: *is_error,
            cache_control: cache_control.clone(),
        },
        conversation::InputBlock::Thinking {
            thinking,
            signature,
        } => InputBlock::Thinking {
            thinking: thinking.clone(),
            signature: signature.clone(),
        },
        conversation::InputBlock::RedactedThinking { data } => {
            InputBlock::RedactedThinking { data: data.clone() }
        }
    }
}

fn safe_tool_id(id: &str) -> String {
    ids::tool_call_for_upstream(id, "toolu_").into_owned()
}

fn tool_from(t: Tool) -> conversation::Tool {
    conversation::Tool {
        name: t.name,
        description: t.description,
        input_schema: t.input_schema,
        cache_control: t.cache_control,
    }
}

fn tool_to(t: &conversation::Tool) -> Tool {
    Tool {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema: t.input_schema.clone(),
        cache_control: t.cache_control.clone(),
    }
}

fn tool_choice_from(choice: ToolChoice) -> conversation::ToolChoice {
    match choice {
        ToolChoice::Auto {
            disable_parallel_tool_use,
        } => conversation::ToolChoice::Auto {
            disable_parallel_tool_use,
        },
        ToolChoice::Any {
            disable_parallel_tool_use,
        } => conversation::ToolChoice::Any {
            disable_parallel_tool_use,
        },
        ToolChoice::Tool {
            name,
            disable_parallel_tool_use,
        } => conversation::ToolChoice::Tool {
            name,
            disable_parallel_tool_use,
        },
        ToolChoice::None => conversation::ToolChoice::None,
    }
}

fn tool_choice_to(choice: &conversation::ToolChoice) -> ToolChoice {
    match choice {
        conversation::ToolChoice::Auto {
            disable_parallel_tool_use,
        } => ToolChoice::Auto {
            disable_parallel_tool_use: *disable_parallel_tool_use,
        },
        conversation::ToolChoice::Any {
            disable_parallel_tool_use,
        } => ToolChoice::Any {
            disable_parallel_tool_use: *disable_parallel_tool_use,
        },
        conversation::ToolChoice::Tool {
            name,
            disable_parallel_tool_use,
        } => ToolChoice::Tool {
            name: name.clone(),
            disable_parallel_tool_use: *disable_parallel_tool_use,
        },
        conversation::ToolChoice::None => ToolChoice::None,
    }
}

fn thinking_from(thinking: Thinking) -> conversation::Thinking {
    match thinking {
        Thinking::Enabled { budget_tokens } => conversation::Thinking::Enabled { budget_tokens },
        Thinking::Adaptive => conversation::Thinking::Adaptive,
        Thinking::Disabled => conversation::Thinking::Disabled,
    }
}

fn thinking_to(thinking: conversation::Thinking) -> Thinking {
    match thinking {
        conversation::Thinking::Enabled { budget_tokens } => Thinking::Enabled { budget_tokens },
        conversation::Thinking::Adaptive => Thinking::Adaptive,
        conversation::Thinking::Disabled => Thinking::Disabled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn from_json(body: Value) -> conversation::Request {
        request_from_messages(serde_json::from_value(body).expect("a valid Messages request"))
    }

    fn upstream_json(req: &conversation::Request) -> Value {
        serde_json::to_value(request_to_messages(req, "upstream-model")).expect("serializes")
    }

    fn every_field() -> Value {
        json!({
            "model": "upstream-model", "max_tokens": 2048, "stream": true,
            "system": [{"type": "text", "text": "Be brief.",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END"],
            "tools": [{"name": "get_weather", "description": "Weather by city",
                       "input_schema": {"type": "object"},
                       "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "tool", "name": "get_weather",
                            "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "metadata": {"user_id": "u-1"},
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather?", "citations": [{"x": 1}]},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": "AAAA"}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false,
                     "content": [{"type": "text", "text": "Sunny"}],
                     "cache_control": {"type": "ephemeral"}},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "plain"}]}
            ]
        })
    }

    #[test]
    fn a_messages_request_survives_the_round_trip_through_the_internal_model() {
        let body = every_field();
        assert_eq!(upstream_json(&from_json(body.clone())), body);
    }

    #[test]
    fn cache_control_is_carried_to_the_upstream() {
        let req = from_json(every_field());
        assert_eq!(req.cache_writes(), conversation::CacheWrites::OneHour);
        let sent = upstream_json(&req);
        assert_eq!(sent["system"][0]["cache_control"]["ttl"], "1h");
        assert_eq!(sent["tools"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(
            sent["messages"][2]["content"][0]["cache_control"]["type"],
            "ephemeral"
        );
    }

    #[test]
    fn a_string_system_prompt_stays_a_string_upstream() {
        let req = from_json(json!({"model": "m", "max_tokens": 5, "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}]}));
        let sent = upstream_json(&req);
        assert_eq!(sent["system"], "Be brief.");
        assert_eq!(sent["messages"][0]["content"], "hi");
    }

    #[test]
    fn an_empty_system_list_is_left_out_upstream() {
        let req = from_json(json!({"model": "m", "max_tokens": 5, "system": [],
            "messages": [{"role": "user", "content": "hi"}]}));
        assert!(upstream_json(&req).get("system").is_none());
    }

    #[test]
    fn optional_fields_a_client_left_out_stay_out_upstream() {
        let req = from_json(json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}));
        assert_eq!(
            upstream_json(&req),
            json!({"model": "upstream-model", "max_tokens": 5, "stream": false,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
        );
    }

    #[test]
    fn tool_call_ids_an_upstream_would_refuse_are_made_safe_call_and_result_alike() {
        let req = from_json(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use",
                "id": "functions.get_weather:0", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": "functions.get_weather:0", "content": "ok"}]}]}));
        let sent = upstream_json(&req);
        let call = sent["messages"][1]["content"][0]["id"].as_str().unwrap();
        assert!(call.starts_with("toolu_"));
        assert_eq!(sent["messages"][2]["content"][0]["tool_use_id"], call);
    }

    #[test]
    fn a_count_tokens_body_is_a_one_token_request_not_streamed() {
        let body: CountTokensRequest = serde_json::from_value(json!({"model": "m",
            "messages": [{"role": "user", "content": "hi"}]}))
        .unwrap();
        let req = request_from_count_tokens(body);
        assert_eq!((req.max_tokens, req.stream), (1, false));
    }

    #[test]
    fn output_blocks_and_deltas_survive_the_round_trip() {
        let block = OutputBlock::ToolUse {
            id: "toolu_1".into(),
            name: "f".into(),
            input: json!({"a": 1}),
        };
        assert_eq!(block_to_messages(block_from_messages(block.clone())), block);
        let delta = Delta::Signature {
            signature: "sig".into(),
        };
        assert_eq!(delta_to_messages(delta_from_messages(delta.clone())), delta);
    }
}
