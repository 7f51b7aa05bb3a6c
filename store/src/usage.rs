//! What a turn used and why it stopped: the internal model the ledger records and bills,
//! whichever protocol the turn was served in. The Messages API shows these very fields, so the
//! serde names are its names and its responses serialize these types as they are.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
    /// Generation filled the rest of the model's context window before the client's
    /// max_tokens: the turn was admitted with more max_tokens than the window had room for, and
    /// generation was capped to that room (the Messages API's name for it).
    ModelContextWindowExceeded,
}

/// Token counts of a turn, as the Messages API reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TokenUsage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_creation_input_tokens: u32,
    pub cache_read_input_tokens: u32,
    /// The part of `cache_creation_input_tokens` written to the 1-hour cache, billed at its
    /// own price. Billed, not shown: clients see the writes' total, as before.
    #[serde(skip)]
    pub cache_creation_1h_input_tokens: u32,
}
