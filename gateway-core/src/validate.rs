//! The spec's request rules that need no token count: shape of the conversation, sampling
//! ranges, stop sequences, max_tokens against the model, and what the model can take. Each
//! error names the offending field. Context-window checks follow the token count (`turn`).

use crds::config::ModelConfig;

use crate::conversation::{InputBlock, Request, Role, Thinking, ToolChoice};
use store::ledger::MAX_END_USER;

/// Why a request cannot be served as sent: the spec's 400 `invalid_request_error`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl Invalid {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

pub const MAX_STOP_SEQUENCES: usize = 4;
pub const MIN_THINKING_BUDGET: u32 = 1_024;
const MAX_TOOL_NAME: usize = 64;

/// `open_max_tokens`: the client left max_tokens out (chat completions), so it is not checked.
pub fn request(
    req: &Request,
    model_id: &str,
    model: &ModelConfig,
    open_max_tokens: bool,
) -> Result<(), Invalid> {
    if !open_max_tokens {
        max_tokens(req, model_id, model)?;
    }
    messages(req, model_id, model)?;
    sampling(req)?;
    tools(req, model_id, model)?;
    thinking(req, model, open_max_tokens)?;
    if let Some(user_id) = req.metadata.as_ref().and_then(|m| m.user_id.as_ref()) {
        end_user("metadata.user_id", user_id)?;
    }
    Ok(())
}

/// An end user as the client sent it in `field` (`metadata.user_id`, `user`,
/// `safety_identifier`): at most [`MAX_END_USER`] bytes, what its ledger row keeps. Longer is
/// refused rather than cut, as Anthropic's API refuses it: a cut id could merge two users'
/// usage.
pub fn end_user(field: &str, value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_END_USER {
        return Err(Invalid::new(format!(
            "{field}: at most {MAX_END_USER} bytes, got {}",
            value.len()
        )));
    }
    Ok(())
}

fn max_tokens(req: &Request, model_id: &str, model: &ModelConfig) -> Result<(), Invalid> {
    let value = req.max_tokens;
    if value == 0 {
        return Err(Invalid::new("max_tokens: must be a positive integer"));
    }
    let limit = model.max_output_tokens;
    if value > limit {
        // Claude Code asks for 32,000 output tokens whatever the model, and its users cannot
        // edit the request, only the setting that sizes it.
        let remedy = if looks_like_claude_code(req) {
            format!(
                "set CLAUDE_CODE_MAX_OUTPUT_TOKENS={limit} (or lower) in Claude Code's environment"
            )
        } else {
            format!("lower max_tokens to {limit} or less")
        };
        return Err(Invalid::new(format!(
            "max_tokens: {value} is above the maximum of {limit} for {model_id}; {remedy}"
        )));
    }
    Ok(())
}

/// Claude Code's system prompt names it (its main loop's and its subagents' alike).
fn looks_like_claude_code(req: &Request) -> bool {
    req.system_text()
        .is_some_and(|system| system.contains("Claude Code"))
}

fn messages(req: &Request, model_id: &str, model: &ModelConfig) -> Result<(), Invalid> {
    let Some(last) = req.messages.last() else {
        return Err(Invalid::new("messages: at least one message is required"));
    };
    if req.messages[0].role != Role::User {
        return Err(Invalid::new(
            "messages[0].role: the first message must have role `user`",
        ));
    }
    if last.role != Role::User {
        return Err(Invalid::new(
            "messages: the last message must have role `user`",
        ));
    }
    for (i, pair) in req.messages.windows(2).enumerate() {
        if pair[0].role == pair[1].role {
            return Err(Invalid::new(format!(
                "messages[{}].role: messages must alternate between `user` and `assistant`",
                i + 1
            )));
        }
    }
    let mut previous_tool_uses: Vec<&str> = Vec::new();
    for (i, message) in req.messages.iter().enumerate() {
        if message.content.is_empty() {
            return Err(Invalid::new(format!(
                "messages[{i}].content: must not be empty"
            )));
        }
        let mut tool_uses = Vec::new();
        for (j, block) in message.blocks().enumerate() {
            let path = format!("messages[{i}].content[{j}]");
            match (block, message.role) {
                (InputBlock::Image { .. }, _) if !model.capabilities.vision => {
                    return Err(Invalid::new(format!(
                        "{path}: {model_id} does not accept images"
                    )));
                }
                (InputBlock::ToolUse { id, .. }, Role::Assistant) => tool_uses.push(id.as_str()),
                (InputBlock::ToolUse { .. }, Role::User) => {
                    return Err(Invalid::new(format!(
                        "{path}: tool_use blocks belong in assistant messages"
                    )));
                }
                (InputBlock::ToolResult { .. }, Role::Assistant) => {
                    return Err(Invalid::new(format!(
                        "{path}: tool_result blocks belong in user messages"
                    )));
                }
                (InputBlock::ToolResult { tool_use_id, .. }, Role::User)
                    if !previous_tool_uses.contains(&tool_use_id.as_str()) =>
                {
                    return Err(Invalid::new(format!(
                        "{path}.tool_use_id: no tool_use block with id `{tool_use_id}` in the previous assistant message"
                    )));
                }
                _ => {}
            }
        }
        previous_tool_uses = tool_uses;
    }
    Ok(())
}

fn sampling(req: &Request) -> Result<(), Invalid> {
    for (name, value) in [("temperature", req.temperature), ("top_p", req.top_p)] {
        if value.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            return Err(Invalid::new(format!("{name}: must be between 0 and 1")));
        }
    }
    if req.stop_sequences.len() > MAX_STOP_SEQUENCES {
        return Err(Invalid::new(format!(
            "stop_sequences: at most {MAX_STOP_SEQUENCES} are allowed, got {}",
            req.stop_sequences.len()
        )));
    }
    if let Some(i) = req.stop_sequences.iter().position(|s| s.trim().is_empty()) {
        return Err(Invalid::new(format!(
            "stop_sequences[{i}]: must contain non-whitespace text"
        )));
    }
    Ok(())
}

fn tools(req: &Request, model_id: &str, model: &ModelConfig) -> Result<(), Invalid> {
    if !req.tools.is_empty() && !model.capabilities.tools {
        return Err(Invalid::new(format!(
            "tools: {model_id} does not support tools"
        )));
    }
    for (i, tool) in req.tools.iter().enumerate() {
        let valid = !tool.name.is_empty()
            && tool.name.len() <= MAX_TOOL_NAME
            && tool
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(Invalid::new(format!(
                "tools[{i}].name: 1 to {MAX_TOOL_NAME} letters, digits, `_` or `-`"
            )));
        }
        if req.tools[..i].iter().any(|t| t.name == tool.name) {
            return Err(Invalid::new(format!(
                "tools[{i}].name: `{}` is defined twice",
                tool.name
            )));
        }
    }
    match &req.tool_choice {
        Some(ToolChoice::Any { .. } | ToolChoice::Tool { .. }) if req.tools.is_empty() => Err(
            Invalid::new("tool_choice: forcing a tool call requires `tools`"),
        ),
        Some(ToolChoice::Tool { name, .. }) if !req.tools.iter().any(|t| &t.name == name) => {
            Err(Invalid::new(format!(
                "tool_choice.name: no tool named `{name}` in `tools`"
            )))
        }
        _ => Ok(()),
    }
}

/// Thinking (the Messages API's `thinking`, chat completions' `reasoning_effort`, the
/// Responses API's `reasoning`) as the model serving the turn can take it: on a model without
/// thinking it is accepted and left out of the turn, since clients such as Claude Code ask for
/// it by default whatever the model; on a model with it, a budget that does not fit under
/// max_tokens (left open by the client and settled only once the turn is reserved) is lowered
/// to fit, and thinking is left out when less than the minimum budget would fit. Run on the
/// final request, just before the provider call.
pub fn fit_thinking(req: &mut Request, model: &ModelConfig) {
    if !model.capabilities.thinking {
        req.thinking = None;
        return;
    }
    if let Some(Thinking::Enabled { budget_tokens }) = req.thinking {
        if budget_tokens >= req.max_tokens {
            req.thinking = (req.max_tokens > MIN_THINKING_BUDGET).then(|| Thinking::Enabled {
                budget_tokens: req.max_tokens - 1,
            });
        }
    }
}

fn thinking(req: &Request, model: &ModelConfig, open_max_tokens: bool) -> Result<(), Invalid> {
    let budget_tokens = match req.thinking {
        None | Some(Thinking::Disabled) => return Ok(()),
        Some(Thinking::Adaptive) => None,
        Some(Thinking::Enabled { budget_tokens }) => Some(budget_tokens),
    };
    if !model.capabilities.thinking {
        // Accepted and left out of the turn by `fit_thinking`, so nothing of it is checked.
        return Ok(());
    }
    let Some(budget_tokens) = budget_tokens else {
        return Ok(());
    };
    if budget_tokens < MIN_THINKING_BUDGET {
        return Err(Invalid::new(format!(
            "thinking.budget_tokens: must be at least {MIN_THINKING_BUDGET}"
        )));
    }
    if !open_max_tokens && budget_tokens >= req.max_tokens {
        return Err(Invalid::new(
            "thinking.budget_tokens: must be less than max_tokens",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crds::config::{Affinity, Capabilities, Pricing, Route};

    use super::*;
    use crate::conversation::{Content, Message};

    fn model(capabilities: Capabilities) -> ModelConfig {
        ModelConfig {
            display_name: "Test".into(),
            context_window: 200_000,
            max_output_tokens: 8_192,
            capabilities,
            pricing: Pricing::default(),
            route: Route::Upstreams(Vec::new()),
            affinity: Affinity::default(),
            batch_price_per_million: None,
        }
    }

    fn everything() -> ModelConfig {
        model(Capabilities {
            thinking: true,
            vision: true,
            tools: true,
            embeddings: false,
        })
    }

    fn say(role: Role, text: &str) -> Message {
        Message {
            role,
            content: Content::Text(text.into()),
        }
    }

    fn ask(text: &str) -> Request {
        Request {
            max_tokens: 1_024,
            messages: vec![say(Role::User, text)],
            ..Request::default()
        }
    }

    fn refusal(req: &Request, model: &ModelConfig) -> String {
        match request(req, "test-model", model, false) {
            Ok(()) => panic!("accepted {req:?}"),
            Err(Invalid(message)) => message,
        }
    }

    #[test]
    fn a_plain_question_within_the_models_limits_is_valid() {
        assert!(request(&ask("hi"), "test-model", &everything(), false).is_ok());
    }

    #[test]
    fn max_tokens_must_be_positive_and_at_most_the_models_output_limit() {
        let mut req = ask("hi");
        req.max_tokens = 0;
        assert_eq!(
            refusal(&req, &everything()),
            "max_tokens: must be a positive integer"
        );
        req.max_tokens = 8_193;
        let message = refusal(&req, &everything());
        assert!(
            message.starts_with("max_tokens: 8193 is above the maximum of 8192 for test-model"),
            "{message}"
        );
        assert!(
            message.ends_with("lower max_tokens to 8192 or less"),
            "{message}"
        );
    }

    #[test]
    fn max_tokens_left_open_by_the_client_is_not_checked() {
        let mut req = ask("hi");
        req.max_tokens = 1_000_000;
        assert!(request(&req, "test-model", &everything(), true).is_ok());
    }

    #[test]
    fn claude_code_over_max_tokens_is_told_the_setting_that_sizes_it() {
        let mut req = ask("hi");
        req.max_tokens = 32_000;
        req.system = Some(Content::Text(
            "You are Claude Code, Anthropic's CLI.".into(),
        ));
        let message = refusal(&req, &everything());
        assert!(
            message.contains("set CLAUDE_CODE_MAX_OUTPUT_TOKENS=8192"),
            "{message}"
        );
    }

    #[test]
    fn messages_start_and_end_with_the_user_and_alternate() {
        let mut req = ask("hi");
        req.messages.clear();
        assert_eq!(
            refusal(&req, &everything()),
            "messages: at least one message is required"
        );
        req.messages = vec![say(Role::Assistant, "hello"), say(Role::User, "hi")];
        assert!(refusal(&req, &everything()).starts_with("messages[0].role"));
        req.messages = vec![say(Role::User, "hi"), say(Role::Assistant, "hello")];
        assert_eq!(
            refusal(&req, &everything()),
            "messages: the last message must have role `user`"
        );
        req.messages = vec![say(Role::User, "hi"), say(Role::User, "again")];
        assert_eq!(
            refusal(&req, &everything()),
            "messages[1].role: messages must alternate between `user` and `assistant`"
        );
        req.messages = vec![say(Role::User, "")];
        assert_eq!(
            refusal(&req, &everything()),
            "messages[0].content: must not be empty"
        );
    }

    #[test]
    fn sampling_ranges_and_stop_sequences_are_checked_naming_the_field() {
        let mut req = ask("hi");
        req.temperature = Some(1.5);
        assert_eq!(
            refusal(&req, &everything()),
            "temperature: must be between 0 and 1"
        );
        req.temperature = None;
        req.top_p = Some(-0.1);
        assert_eq!(
            refusal(&req, &everything()),
            "top_p: must be between 0 and 1"
        );
        req.top_p = None;
        req.stop_sequences = vec!["a".into(); MAX_STOP_SEQUENCES + 1];
        assert!(refusal(&req, &everything()).starts_with("stop_sequences: at most 4"));
        req.stop_sequences = vec!["end".into(), " ".into()];
        assert_eq!(
            refusal(&req, &everything()),
            "stop_sequences[1]: must contain non-whitespace text"
        );
    }

    fn tool(name: &str) -> crate::conversation::Tool {
        crate::conversation::Tool {
            name: name.into(),
            description: None,
            input_schema: serde_json::json!({"type": "object"}),
            cache_control: None,
        }
    }

    #[test]
    fn tools_need_a_model_with_tools_and_unique_well_formed_names() {
        let mut req = ask("hi");
        req.tools = vec![tool("get_weather")];
        assert_eq!(
            refusal(&req, &model(Capabilities::default())),
            "tools: test-model does not support tools"
        );
        req.tools = vec![tool("get weather")];
        assert!(refusal(&req, &everything()).starts_with("tools[0].name: 1 to 64"));
        req.tools = vec![tool("a"), tool("a")];
        assert_eq!(
            refusal(&req, &everything()),
            "tools[1].name: `a` is defined twice"
        );
    }

    #[test]
    fn thinking_on_a_model_without_it_is_accepted_and_left_out_of_the_turn() {
        let mut req = ask("hi");
        req.thinking = Some(Thinking::Enabled { budget_tokens: 10 });
        let plain = model(Capabilities::default());
        assert!(request(&req, "test-model", &plain, false).is_ok());
        fit_thinking(&mut req, &plain);
        assert_eq!(req.thinking, None);
    }

    #[test]
    fn a_thinking_budget_is_at_least_the_minimum_and_below_max_tokens() {
        let mut req = ask("hi");
        req.max_tokens = 4_000;
        req.thinking = Some(Thinking::Enabled {
            budget_tokens: 1_000,
        });
        assert_eq!(
            refusal(&req, &everything()),
            "thinking.budget_tokens: must be at least 1024"
        );
        req.thinking = Some(Thinking::Enabled {
            budget_tokens: 4_000,
        });
        assert_eq!(
            refusal(&req, &everything()),
            "thinking.budget_tokens: must be less than max_tokens"
        );
    }

    #[test]
    fn a_budget_that_does_not_fit_open_max_tokens_is_lowered_or_left_out() {
        let mut req = ask("hi");
        req.max_tokens = 2_000;
        req.thinking = Some(Thinking::Enabled {
            budget_tokens: 5_000,
        });
        fit_thinking(&mut req, &everything());
        assert_eq!(
            req.thinking,
            Some(Thinking::Enabled {
                budget_tokens: 1_999
            })
        );
        req.max_tokens = 1_000;
        req.thinking = Some(Thinking::Enabled {
            budget_tokens: 5_000,
        });
        fit_thinking(&mut req, &everything());
        assert_eq!(req.thinking, None, "less than the minimum budget would fit");
    }
}
