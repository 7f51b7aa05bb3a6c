//! The conversation a turn serves, whatever protocol the client spoke and whatever protocol
//! the upstream speaks: messages of content blocks, the system prompt, tools, thinking and
//! sampling settings ([`Request`]), and what a provider streams back ([`output`]). Each
//! protocol maps to and from it in its `wire/<protocol>/translate.rs`; below the edge only
//! the provider adapters' upstream calls see a wire format.
//!
//! The blocks mirror the Messages API's because that is the richest of the three protocols:
//! the others map onto a subset. What the gateway carries without interpreting
//! (`cache_control`, `citations`, tool schemas and inputs) stays JSON.

pub mod output;

use serde_json::Value;

pub use output::{BilledUsage, Delta, OutputBlock};

/// The sampling temperature of a request that sets none, by the spec (and the Messages API).
pub const DEFAULT_TEMPERATURE: f64 = 1.0;

/// `Default` is an empty request; the translations fill every field, tests only theirs.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub model: String,
    pub max_tokens: u32,
    pub messages: Vec<Message>,
    pub system: Option<Content<SystemBlock>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub stop_sequences: Vec<String>,
    pub stream: bool,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    pub thinking: Option<Thinking>,
    pub metadata: Option<Metadata>,
}

impl Request {
    /// The text of the system prompt, blocks joined by newlines.
    pub fn system_text(&self) -> Option<String> {
        self.system.as_ref().map(|s| match s {
            Content::Text(text) => text.clone(),
            Content::Blocks(blocks) => blocks
                .iter()
                .map(|b| b.text.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        })
    }

    /// Which cache the upstream may write part of the prompt to, and so bill at a dearer
    /// price than plain input: only where a block or tool carries `cache_control`, the 1-hour
    /// cache where one of them asks for `"ttl": "1h"`.
    pub fn cache_writes(&self) -> CacheWrites {
        let system = self
            .system
            .iter()
            .flat_map(Content::blocks)
            .map(|b| &b.cache_control);
        let tools = self.tools.iter().map(|t| &t.cache_control);
        let blocks = self
            .messages
            .iter()
            .flat_map(Message::blocks)
            .map(InputBlock::cache_control);
        system
            .chain(tools)
            .chain(blocks)
            .flatten()
            .map(|c| match c.get("ttl").and_then(Value::as_str) {
                Some("1h") => CacheWrites::OneHour,
                _ => CacheWrites::FiveMinutes,
            })
            .max()
            .unwrap_or(CacheWrites::None)
    }

    /// The most tokens thinking may take, when thinking is on; adaptive thinking decides for
    /// itself within max_tokens, and is given half of it.
    pub fn thinking_budget(&self) -> Option<u32> {
        match self.thinking {
            Some(Thinking::Enabled { budget_tokens }) => Some(budget_tokens),
            Some(Thinking::Adaptive) => Some(self.max_tokens / 2),
            Some(Thinking::Disabled) | None => None,
        }
    }

    /// Folds `system` messages inside the conversation into what every upstream accepts:
    /// leading ones join the system prompt; later ones become a `<system-reminder>` text block
    /// at the start of the next user turn (or at the end of the last one).
    pub fn fold_system_messages(&mut self) {
        if !self.messages.iter().any(|m| m.role == Role::System) {
            return;
        }
        let mut kept: Vec<Message> = Vec::new();
        let mut carried: Vec<InputBlock> = Vec::new();
        for mut message in std::mem::take(&mut self.messages) {
            match message.role {
                Role::System if kept.is_empty() => self.append_system(message.text()),
                Role::System => carried.push(InputBlock::text(format!(
                    "<system-reminder>\n{}\n</system-reminder>",
                    message.text()
                ))),
                Role::User if !carried.is_empty() => {
                    let mut blocks = std::mem::take(&mut carried);
                    blocks.extend(message.content.into_blocks());
                    message.content = Content::Blocks(blocks);
                    kept.push(message);
                }
                Role::User | Role::Assistant => kept.push(message),
            }
        }
        if !carried.is_empty() {
            match kept.last_mut() {
                Some(last) if last.role == Role::User => {
                    let mut blocks =
                        std::mem::replace(&mut last.content, Content::Blocks(Vec::new()))
                            .into_blocks();
                    blocks.extend(carried);
                    last.content = Content::Blocks(blocks);
                }
                _ => kept.push(Message {
                    role: Role::User,
                    content: Content::Blocks(carried),
                }),
            }
        }
        self.messages = kept;
    }

    fn append_system(&mut self, text: String) {
        self.system = Some(match self.system.take() {
            None => Content::Text(text),
            Some(Content::Text(prompt)) => Content::Text(format!("{prompt}\n\n{text}")),
            Some(Content::Blocks(mut blocks)) => {
                blocks.push(SystemBlock {
                    text,
                    cache_control: None,
                });
                Content::Blocks(blocks)
            }
        });
    }
}

/// Content as a client wrote it: plain text, or a list of blocks. Kept apart because an
/// upstream of the same protocol is sent exactly what the client wrote.
#[derive(Clone, Debug, PartialEq)]
pub enum Content<T> {
    Text(String),
    Blocks(Vec<T>),
}

impl<T> Content<T> {
    /// The blocks of the list form; nothing for plain text.
    pub fn blocks(&self) -> impl Iterator<Item = &T> {
        match self {
            Self::Text(_) => [].iter(),
            Self::Blocks(blocks) => blocks.iter(),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Self::Text(text) => text.is_empty(),
            Self::Blocks(blocks) => blocks.is_empty(),
        }
    }
}

impl Content<InputBlock> {
    /// Plain text of message or tool result content: the text, or its text blocks joined.
    pub fn text(&self) -> String {
        match self {
            Self::Text(s) => s.clone(),
            Self::Blocks(blocks) => blocks
                .iter()
                .filter_map(|b| match b {
                    InputBlock::Text { text, .. } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    fn into_blocks(self) -> Vec<InputBlock> {
        match self {
            Self::Text(text) => vec![InputBlock::text(text)],
            Self::Blocks(blocks) => blocks,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    /// A system message inside the conversation (a Messages API beta Claude Code sends;
    /// the OpenAI formats' mid-conversation instructions); folded away by
    /// [`Request::fold_system_messages`] before anything else runs.
    System,
}

#[derive(Clone, Debug)]
pub struct Message {
    pub role: Role,
    pub content: Content<InputBlock>,
}

impl Message {
    /// Appends `blocks` to the conversation as a turn of `role`, joining the last turn when it
    /// has the same role: the OpenAI formats split one turn into several messages or items
    /// (tool results, then the user's text), and the conversation alternates.
    pub fn append(messages: &mut Vec<Message>, role: Role, blocks: Vec<InputBlock>) {
        match messages.last_mut() {
            Some(last) if last.role == role => {
                let existing = std::mem::replace(&mut last.content, Content::Blocks(Vec::new()));
                let mut joined = existing.into_blocks();
                joined.extend(blocks);
                last.content = Content::Blocks(joined);
            }
            _ => messages.push(Message {
                role,
                content: Content::Blocks(blocks),
            }),
        }
    }

    pub fn blocks(&self) -> impl Iterator<Item = &InputBlock> {
        self.content.blocks()
    }

    /// Plain text of the message: its text, or its text blocks joined.
    pub fn text(&self) -> String {
        self.content.text()
    }
}

/// A block of the system prompt: text only.
#[derive(Clone, Debug)]
pub struct SystemBlock {
    pub text: String,
    pub cache_control: Option<Value>,
}

#[derive(Clone, Debug)]
pub enum InputBlock {
    Text {
        text: String,
        cache_control: Option<Value>,
        citations: Option<Value>,
    },
    Image {
        source: ImageSource,
        cache_control: Option<Value>,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
        cache_control: Option<Value>,
    },
    ToolResult {
        tool_use_id: String,
        content: Option<Content<InputBlock>>,
        is_error: Option<bool>,
        cache_control: Option<Value>,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
}

impl InputBlock {
    pub fn text(text: String) -> Self {
        Self::Text {
            text,
            cache_control: None,
            citations: None,
        }
    }

    fn cache_control(&self) -> &Option<Value> {
        match self {
            Self::Text { cache_control, .. }
            | Self::Image { cache_control, .. }
            | Self::ToolUse { cache_control, .. }
            | Self::ToolResult { cache_control, .. } => cache_control,
            Self::Thinking { .. } | Self::RedactedThinking { .. } => &None,
        }
    }
}

#[derive(Clone, Debug)]
pub enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

#[derive(Clone, Debug)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Value,
    pub cache_control: Option<Value>,
}

/// Which tool the model must call, if any; `disable_parallel_tool_use` is the client's, and
/// left out when it did not say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto {
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        disable_parallel_tool_use: Option<bool>,
    },
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thinking {
    Enabled { budget_tokens: u32 },
    Adaptive,
    Disabled,
}

#[derive(Clone, Debug)]
pub struct Metadata {
    pub user_id: Option<String>,
}

/// The prompt cache a request lets the upstream write to, dearest last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CacheWrites {
    None,
    FiveMinutes,
    OneHour,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn request(messages: Vec<Message>) -> Request {
        Request {
            model: "svc/opus".into(),
            max_tokens: 10,
            messages,
            system: Some(Content::Text("Be brief.".into())),
            ..Request::default()
        }
    }

    /// A message of plain text.
    pub(crate) fn say(role: Role, text: &str) -> Message {
        Message {
            role,
            content: Content::Text(text.into()),
        }
    }

    #[test]
    fn leading_system_messages_join_the_system_prompt() {
        let mut req = request(vec![
            say(Role::System, "Use metric units."),
            say(Role::User, "hi"),
        ]);
        req.fold_system_messages();
        assert_eq!(
            req.system_text().as_deref(),
            Some("Be brief.\n\nUse metric units.")
        );
        assert_eq!(req.messages.len(), 1);
    }

    #[test]
    fn a_mid_conversation_system_message_opens_the_next_user_turn() {
        let mut req = request(vec![
            say(Role::User, "hi"),
            say(Role::Assistant, "hello"),
            say(Role::System, "The user is on mobile."),
            say(Role::User, "weather?"),
        ]);
        req.fold_system_messages();
        let roles: Vec<Role> = req.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
        assert_eq!(
            req.messages[2].text(),
            "<system-reminder>\nThe user is on mobile.\n</system-reminder>\nweather?"
        );
    }

    #[test]
    fn a_trailing_system_message_joins_the_last_user_turn() {
        let mut req = request(vec![
            say(Role::User, "hi"),
            say(Role::System, "Answer in French."),
        ]);
        req.fold_system_messages();
        assert_eq!(req.messages.len(), 1);
        assert!(req.messages[0].text().ends_with("</system-reminder>"));
    }

    #[test]
    fn the_dearest_cache_any_block_asks_for_is_the_one_written() {
        let mut req = request(vec![say(Role::User, "hi")]);
        assert_eq!(req.cache_writes(), CacheWrites::None);
        req.system = Some(Content::Blocks(vec![SystemBlock {
            text: "Be brief.".into(),
            cache_control: Some(serde_json::json!({"type": "ephemeral"})),
        }]));
        assert_eq!(req.cache_writes(), CacheWrites::FiveMinutes);
        req.messages[0].content = Content::Blocks(vec![InputBlock::Text {
            text: "hi".into(),
            cache_control: Some(serde_json::json!({"type": "ephemeral", "ttl": "1h"})),
            citations: None,
        }]);
        assert_eq!(req.cache_writes(), CacheWrites::OneHour);
    }
}
