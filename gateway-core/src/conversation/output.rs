//! What a provider produces: content blocks, opened whole or empty and then filled by deltas,
//! and the usage of a finished turn with the credits it cost.

use serde_json::Value;
use store::usage::TokenUsage;

#[derive(Clone, Debug, PartialEq)]
pub enum OutputBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Text {
        text: String,
    },
    /// Part of a tool call's input, as JSON text: whole only once every part has arrived.
    InputJson {
        partial_json: String,
    },
    Thinking {
        thinking: String,
    },
    Signature {
        signature: String,
    },
}

/// A settled turn's token counts and the credits they cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BilledUsage {
    pub tokens: TokenUsage,
    pub credits: u64,
}
