//! Upstream model providers. Each adapter turns the conversation (`crate::conversation`) into a
//! stream of its events; everything else (billing, limits, wire formats) is done around them.
//! The `simulated` provider answers without any upstream account; `anthropic` speaks the
//! Messages API and `openai` any OpenAI-compatible chat-completions upstream (`azure-openai`
//! too: the same adapter, with Azure's paths and header); `bedrock` is the Messages API's
//! body and events on Amazon Bedrock, SigV4-signed, in AWS event-stream frames. `gemini`
//! is the Gemini API's `generateContent` stream (`wire::gemini`). Embeddings are one whole
//! call, not a stream ([`embeddings`]). Which upstream serves a turn, and what happens when it
//! fails, is `routing::fallback`'s business.
//! body and events on Amazon Bedrock, SigV4-signed, in AWS event-stream frames; `vertex` the
//! same body and events on Google Vertex AI, with a Google access token. Which upstream
//! serves a turn, and what happens when it fails, is `routing::fallback`'s business.

mod anthropic;
mod bedrock;
mod blocks;
pub mod embeddings;
mod eventstream;
mod gemini;
mod golden;
mod google_auth;
mod http;
mod openai;
mod simulated;
mod vertex;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use crds::config::{ProviderKind, Upstream};
use futures::Stream;
use thiserror::Error;

pub use anthropic::Anthropic;
pub use bedrock::Bedrock;
pub use gemini::Gemini;
pub use openai::OpenAi;
pub use simulated::Simulated;
pub use vertex::Vertex;

use crate::conversation::{Delta, OutputBlock, Request};
use crate::tokens::Tokenizer;
use store::usage::{StopReason, TokenUsage};

/// What a provider streams back: blocks of the conversation's output.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderEvent {
    /// The prompt side of the usage, from upstreams that report it before any content (cache
    /// reads and writes included); only ever the first event.
    Started {
        usage: TokenUsage,
    },
    BlockStart {
        index: usize,
        block: OutputBlock,
    },
    BlockDelta {
        index: usize,
        delta: Delta,
    },
    BlockStop {
        index: usize,
    },
    Finish {
        stop_reason: StopReason,
        stop_sequence: Option<String>,
        usage: TokenUsage,
    },
}

#[derive(Debug, Error)]
pub enum ProviderError {
    /// The upstream refused the request's content; the message is ours, not the upstream's.
    #[error("{0}")]
    Rejected(String),
    #[error("upstream returned an error")]
    Upstream,
    #[error("upstream timed out")]
    Timeout,
    /// The upstream limits us (429, 529, a throttle); `retry_after` is when it said to come
    /// back, which keeps the breaker open that long (`routing::breaker`).
    #[error("upstream overloaded")]
    Overloaded { retry_after: Option<Duration> },
    #[error("no upstream available")]
    Unavailable,
    #[error("server shutting down")]
    ShuttingDown,
}

impl ProviderError {
    /// A fixed word for metrics and spans.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Rejected(_) => "rejected",
            Self::Upstream => "error",
            Self::Timeout => "timeout",
            Self::Overloaded { .. } => "overloaded",
            Self::Unavailable => "unavailable",
            Self::ShuttingDown => "shutting_down",
        }
    }

    /// An upstream that limits us and gave no wait.
    pub fn overloaded() -> Self {
        Self::Overloaded { retry_after: None }
    }

    /// When the upstream said to come back, if it limited us and said so.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Overloaded { retry_after } => *retry_after,
            _ => None,
        }
    }
}

pub type EventStream = Pin<Box<dyn Stream<Item = Result<ProviderEvent, ProviderError>> + Send>>;

pub struct ProviderCall {
    pub request: Arc<Request>,
    /// The client's beta features; only the `anthropic` adapter sends them on (another API's
    /// upstream would not know them, and the request is translated for it anyway).
    pub anthropic_beta: Option<String>,
    pub upstream: Upstream,
    /// The virtual model serving the turn (never the upstream's name).
    pub served_model: String,
    /// The gateway's own count of the input, for providers that do not report one.
    pub input_tokens: u32,
}

#[async_trait]
pub trait Provider: Send + Sync {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError>;
}

/// The adapters by provider kind, built once at start-up.
pub struct Providers {
    simulated: Simulated,
    anthropic: Anthropic,
    bedrock: Bedrock,
    gemini: Gemini,
    openai: OpenAi,
    vertex: Vertex,
}

impl Providers {
    pub fn new(tokens: Tokenizer) -> Self {
        Self {
            simulated: Simulated::new(tokens),
            anthropic: Anthropic::default(),
            bedrock: Bedrock::default(),
            gemini: Gemini::new(tokens),
            openai: OpenAi::new(tokens),
            vertex: Vertex::default(),
        }
    }

    pub fn adapter(&self, kind: ProviderKind) -> &dyn Provider {
        match kind {
            ProviderKind::Simulated => &self.simulated,
            ProviderKind::Anthropic => &self.anthropic,
            ProviderKind::Bedrock => &self.bedrock,
            ProviderKind::Gemini => &self.gemini,
            ProviderKind::Vertex => &self.vertex,
            ProviderKind::Openai | ProviderKind::AzureOpenai => &self.openai,
        }
    }
}
