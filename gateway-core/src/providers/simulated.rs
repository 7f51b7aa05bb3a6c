//! The built-in `simulated` provider: deterministic replies with real token counts, so the
//! whole product (limits, billing, every wire format, SDKs) runs with no upstream account.
//!
//! The reply is `This is a simulated reply from <model>. You said: <last user text>`, cut at
//! `max_tokens` (stop_reason `max_tokens`) or at the first stop sequence in it. With tools, a
//! `tool_use` block is produced when `tool_choice` forces one (`any`, `tool`), or under `auto`
//! when the last user text names a tool; after a `tool_result` it answers in text quoting the
//! result. With thinking enabled it first streams a thinking block with a signature.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{EventStream, Provider, ProviderCall, ProviderError, ProviderEvent};
use crate::conversation::{
    Content, Delta, InputBlock, OutputBlock, Request, Role, Tool, ToolChoice,
};
use crate::ids;
use crate::tokens::Tokenizer;
use store::usage::{StopReason, TokenUsage};

/// Tokens per streamed text chunk.
const TOKENS_PER_CHUNK: usize = 4;

pub struct Simulated {
    tokens: Tokenizer,
}

impl Simulated {
    pub fn new(tokens: Tokenizer) -> Self {
        Self { tokens }
    }
}

#[async_trait]
impl Provider for Simulated {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError> {
        let events = Script::new(self.tokens, &call).finish(call.input_tokens);
        let delay = Duration::from_millis(call.upstream.chunk_delay_ms);
        Ok(Box::pin(async_stream::stream! {
            for event in events {
                let pause = matches!(event, ProviderEvent::BlockDelta { .. }) && !delay.is_zero();
                if pause {
                    tokio::time::sleep(delay).await;
                }
                yield Ok(event);
            }
        }))
    }
}

/// The planned events of one reply, built block by block within the max_tokens budget.
struct Script {
    tokens: Tokenizer,
    events: Vec<ProviderEvent>,
    budget: u32,
    output_tokens: u32,
    stop: Option<(StopReason, Option<String>)>,
    stop_sequences: Vec<String>,
}

impl Script {
    fn new(tokens: Tokenizer, call: &ProviderCall) -> Self {
        let req = &call.request;
        let mut script = Self {
            tokens,
            events: Vec::new(),
            budget: req.max_tokens,
            output_tokens: 0,
            stop: None,
            stop_sequences: req.stop_sequences.clone(),
        };
        let last_text = last_user_text(req);
        if let Some(budget) = req.thinking_budget() {
            script.thinking(&last_text, budget);
        }
        match chosen_tool(req) {
            Some(tool) => {
                if matches!(req.tool_choice, None | Some(ToolChoice::Auto { .. })) {
                    script.text(&format!("I will use the {} tool.", tool.name));
                }
                script.tool_use(&tool.name, example_input(&tool.input_schema));
            }
            None => {
                let reply = match tool_result_text(req) {
                    Some(result) => format!(
                        "This is a simulated reply from {}. The tool returned: {result}",
                        call.served_model
                    ),
                    None => format!(
                        "This is a simulated reply from {}. You said: {last_text}",
                        call.served_model
                    ),
                };
                script.text(&reply);
            }
        }
        script
    }

    fn index(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, ProviderEvent::BlockStart { .. }))
            .count()
    }

    fn thinking(&mut self, about: &str, budget: u32) {
        let text = format!(
            "The user wrote: {about}. A short, direct answer that repeats it back fits best."
        );
        let pieces = self.tokens.split(&text);
        let allowed = pieces.len().min(budget as usize).min(self.budget as usize);
        let kept = &pieces[..allowed];
        let index = self.index();
        self.events.push(ProviderEvent::BlockStart {
            index,
            block: OutputBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            },
        });
        for chunk in kept.chunks(TOKENS_PER_CHUNK) {
            self.events.push(ProviderEvent::BlockDelta {
                index,
                delta: Delta::Thinking {
                    thinking: chunk.concat(),
                },
            });
        }
        let signature = base64::engine::general_purpose::STANDARD
            .encode(Sha256::digest(kept.concat().as_bytes()));
        self.events.push(ProviderEvent::BlockDelta {
            index,
            delta: Delta::Signature { signature },
        });
        self.events.push(ProviderEvent::BlockStop { index });
        self.spend(allowed as u32);
    }

    fn text(&mut self, text: &str) {
        if self.stop.is_some() {
            return;
        }
        let (text, stopped_by) = cut_at_stop_sequence(text, &self.stop_sequences);
        let pieces = self.tokens.split(text);
        let allowed = pieces.len().min(self.budget as usize);
        let index = self.index();
        self.events.push(ProviderEvent::BlockStart {
            index,
            block: OutputBlock::Text {
                text: String::new(),
            },
        });
        for chunk in pieces[..allowed].chunks(TOKENS_PER_CHUNK) {
            self.events.push(ProviderEvent::BlockDelta {
                index,
                delta: Delta::Text {
                    text: chunk.concat(),
                },
            });
        }
        self.events.push(ProviderEvent::BlockStop { index });
        self.spend(allowed as u32);
        if allowed < pieces.len() {
            self.stop = Some((StopReason::MaxTokens, None));
        } else if let Some(sequence) = stopped_by {
            self.stop = Some((StopReason::StopSequence, Some(sequence)));
        }
    }

    fn tool_use(&mut self, name: &str, input: Value) {
        if self.stop.is_some() {
            return;
        }
        let json = input.to_string();
        let cost = self.tokens.count(&json);
        if cost > self.budget {
            self.stop = Some((StopReason::MaxTokens, None));
            return;
        }
        let index = self.index();
        self.events.push(ProviderEvent::BlockStart {
            index,
            block: OutputBlock::ToolUse {
                id: ids::tool_use(),
                name: name.to_owned(),
                input: Value::Object(Map::new()),
            },
        });
        let pieces = self.tokens.split(&json);
        for chunk in pieces.chunks(TOKENS_PER_CHUNK) {
            self.events.push(ProviderEvent::BlockDelta {
                index,
                delta: Delta::InputJson {
                    partial_json: chunk.concat(),
                },
            });
        }
        self.events.push(ProviderEvent::BlockStop { index });
        self.spend(cost);
        self.stop = Some((StopReason::ToolUse, None));
    }

    fn spend(&mut self, tokens: u32) {
        self.output_tokens += tokens;
        self.budget = self.budget.saturating_sub(tokens);
    }

    fn finish(mut self, input_tokens: u32) -> Vec<ProviderEvent> {
        let (stop_reason, stop_sequence) = self.stop.take().unwrap_or((StopReason::EndTurn, None));
        self.events.push(ProviderEvent::Finish {
            stop_reason,
            stop_sequence,
            usage: TokenUsage {
                input_tokens,
                output_tokens: self.output_tokens,
                ..TokenUsage::default()
            },
        });
        self.events
    }
}

fn last_user_text(req: &Request) -> String {
    req.messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(|m| m.text())
        .unwrap_or_default()
}

/// The text of the tool results in the last user turn, if it carries any.
fn tool_result_text(req: &Request) -> Option<String> {
    let last = req.messages.last()?;
    let results: Vec<String> = last
        .blocks()
        .filter_map(|b| match b {
            InputBlock::ToolResult { content, .. } => Some(match content {
                Some(Content::Text(s)) => s.clone(),
                Some(Content::Blocks(blocks)) => blocks
                    .iter()
                    .filter_map(|b| match b {
                        InputBlock::Text { text, .. } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                None => String::new(),
            }),
            _ => None,
        })
        .collect();
    (!results.is_empty()).then(|| results.join("; "))
}

fn chosen_tool(req: &Request) -> Option<&Tool> {
    if req.tools.is_empty() {
        return None;
    }
    match &req.tool_choice {
        Some(ToolChoice::None) => None,
        Some(ToolChoice::Any { .. }) => req.tools.first(),
        Some(ToolChoice::Tool { name, .. }) => req.tools.iter().find(|t| &t.name == name),
        None | Some(ToolChoice::Auto { .. }) => {
            if tool_result_text(req).is_some() {
                return None;
            }
            let text = last_user_text(req);
            req.tools.iter().find(|t| text.contains(t.name.as_str()))
        }
    }
}

/// An input that satisfies the schema's required properties, by type.
fn example_input(schema: &Value) -> Value {
    let mut input = Map::new();
    let properties = schema.get("properties").and_then(Value::as_object);
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        let kind = properties
            .and_then(|p| p.get(name))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("string");
        let value = match kind {
            "number" | "integer" => Value::from(1),
            "boolean" => Value::Bool(true),
            "array" => Value::Array(Vec::new()),
            "object" => Value::Object(Map::new()),
            _ => Value::from("simulated"),
        };
        input.insert(name.to_owned(), value);
    }
    Value::Object(input)
}

/// The text up to the earliest stop sequence in it, and that sequence.
fn cut_at_stop_sequence<'a>(text: &'a str, sequences: &[String]) -> (&'a str, Option<String>) {
    sequences
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
        .min_by_key(|(at, _)| *at)
        .map(|(at, s)| (&text[..at], Some(s.clone())))
        .unwrap_or((text, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_earliest_stop_sequence_cuts_the_text() {
        let (text, seq) = cut_at_stop_sequence("a STOP b END", &["END".into(), "STOP".into()]);
        assert_eq!(text, "a ");
        assert_eq!(seq.as_deref(), Some("STOP"));
    }

    #[test]
    fn example_input_fills_required_properties_by_type() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer"}, "unit": {"type": "string"}}, "required": ["city", "days"]});
        assert_eq!(
            example_input(&schema),
            json!({"city": "simulated", "days": 1})
        );
    }
}
