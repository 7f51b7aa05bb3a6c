//! The `openai` adapter: any OpenAI-compatible chat-completions upstream
//! (`POST {base_url}/chat/completions`, Bearer auth), and the `azure-openai` variation of it
//! (`POST {base_url}/openai/deployments/{model}/chat/completions?api-version=…`, `api-key`
//! header): the same body and stream, only the address and the credential's header differ
//! ([`Endpoint`]). The request and the answer are translated
//! by `wire::openai::translate` (the rules are there); the request always streams, asking for
//! usage with `stream_options.include_usage`.
//!
//! Stream: `reasoning_content` (as served for thinking models) becomes a thinking block,
//! `content` a text block, and each `tool_calls[].index` a tool_use block whose argument
//! fragments are its `input_json_delta`s; one block is open at a time.

use std::collections::HashMap;

use async_trait::async_trait;
use crds::config::{ProviderKind, Secret, Upstream};

use super::blocks::Blocks;
use super::embeddings::{EmbeddingsAnswer, EmbeddingsCall, UpstreamRequest, UpstreamResponse};
use super::http::{self, Clients, Decoder, Framing, SseEvent};
use super::{EventStream, Provider, ProviderCall, ProviderError, ProviderEvent};
use crate::conversation::{Delta, OutputBlock};
use crate::tokens::Tokenizer;
use crate::wire::openai::translate::{
    request_to_chat, stop_from_chat, tool_use_from_chat, usage_from_chat,
};
use crate::wire::openai::{
    ChatChunk, ChatRequest, ChatUsage, FinishReason, StreamOptions, ToolCallDelta,
};
use store::usage::TokenUsage;

pub struct OpenAi {
    clients: Clients,
    tokens: Tokenizer,
}

impl OpenAi {
    pub fn new(tokens: Tokenizer) -> Self {
        Self {
            clients: Clients::default(),
            tokens,
        }
    }
}

/// Where a chat-completions call goes and how the key is sent, by provider kind.
enum Endpoint<'a> {
    /// `{base}/chat/completions`, `Authorization: Bearer`.
    OpenAi { base: &'a str },
    /// `{base}/openai/deployments/{deployment}/chat/completions?api-version=…`, `api-key`.
    /// Azure ignores the body's `model`: the deployment in the path picks it.
    Azure {
        base: &'a str,
        deployment: &'a str,
        api_version: &'a str,
    },
}

impl<'a> Endpoint<'a> {
    fn of(upstream: &'a Upstream) -> Result<Self, ProviderError> {
        let missing = |what: &str| {
            tracing::error!(upstream = %upstream.name, provider = upstream.provider.as_str(), "upstream without {what}");
            ProviderError::Unavailable
        };
        let base = upstream
            .base_url
            .as_deref()
            .ok_or_else(|| missing("a base URL"))?
            .trim_end_matches('/');
        Ok(match upstream.provider {
            ProviderKind::AzureOpenai => Endpoint::Azure {
                base,
                deployment: &upstream.model,
                api_version: upstream
                    .api_version
                    .as_deref()
                    .ok_or_else(|| missing("an api version"))?,
            },
            _ => Endpoint::OpenAi { base },
        })
    }

    /// A call to the operation at `path` (`["chat", "completions"]`, `["embeddings"]`).
    fn request(
        &self,
        client: &reqwest::Client,
        key: Option<&Secret>,
        path: &[&str],
    ) -> Result<reqwest::RequestBuilder, ProviderError> {
        Ok(match self {
            Endpoint::OpenAi { base } => {
                let request = client.post(format!("{base}/{}", path.join("/")));
                match key {
                    Some(key) => request.bearer_auth(key.expose()),
                    None => request,
                }
            }
            Endpoint::Azure {
                base,
                deployment,
                api_version,
            } => {
                // Path segments are escaped: a `/` or `?` in a deployment name must not
                // change the path.
                let mut url = reqwest::Url::parse(base).map_err(|e| {
                    tracing::error!(error = %e, "azure-openai upstream with an unusable base URL");
                    ProviderError::Unavailable
                })?;
                url.path_segments_mut()
                    .map_err(|()| ProviderError::Unavailable)?
                    .pop_if_empty()
                    .extend(["openai", "deployments", deployment])
                    .extend(path);
                url.query_pairs_mut()
                    .append_pair("api-version", api_version);
                let request = client.post(url);
                match key {
                    Some(key) => request.header("api-key", key.expose()),
                    None => request,
                }
            }
        })
    }
}

#[async_trait]
impl Provider for OpenAi {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError> {
        let upstream = &call.upstream;
        let endpoint = Endpoint::of(upstream)?;
        let body = body(&call);
        let (client, upstream_call) = self.clients.get(upstream)?;
        let request = endpoint
            .request(&client, upstream.api_key.as_ref(), &["chat", "completions"])?
            .header("accept", "text/event-stream")
            .json(&body);
        let stream = Stream::new(self.tokens, call.input_tokens);
        http::open(
            request,
            upstream_call,
            upstream.timeouts,
            Framing::Sse,
            stream,
        )
        .await
    }
}

/// The chat completions body sent upstream: streamed, with the usage in the last chunk.
pub(super) fn body(call: &ProviderCall) -> ChatRequest {
    ChatRequest {
        stream: Some(true),
        stream_options: Some(StreamOptions {
            include_usage: true,
        }),
        ..request_to_chat(&call.request, &call.upstream.model)
    }
}

impl OpenAi {
    /// `POST {base}/embeddings` (Azure: the deployment's `/embeddings`), answered whole.
    pub(super) async fn embed(
        &self,
        upstream: &Upstream,
        call: &EmbeddingsCall,
    ) -> Result<EmbeddingsAnswer, ProviderError> {
        let endpoint = Endpoint::of(upstream)?;
        let body = UpstreamRequest {
            model: &upstream.model,
            input: call.inputs.as_slice(),
            encoding_format: "float",
            dimensions: call.dimensions,
            user: call.user.as_deref(),
        };
        let (client, upstream_call) = self.clients.get(upstream)?;
        let request = endpoint
            .request(&client, upstream.api_key.as_ref(), &["embeddings"])?
            .json(&body);
        let bytes = http::whole(request, upstream_call, upstream.timeouts).await?;
        serde_json::from_slice::<UpstreamResponse>(&bytes)
            .map_err(|e| http::malformed("embeddings answer", e))?
            .answer(call.inputs.len())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    Tool(u32),
}

pub(super) struct Stream {
    blocks: Blocks,
    tokens: Tokenizer,
    input_tokens: u32,
    /// The block being streamed, and its key in `blocks`.
    open: Option<(Open, usize)>,
    keys: usize,
    /// Tool calls seen, by the upstream's index.
    tools: HashMap<u32, usize>,
    finish: Option<FinishReason>,
    usage: Option<ChatUsage>,
    /// Output text, counted when an upstream reports no usage.
    generated: String,
}

impl Stream {
    pub(super) fn new(tokens: Tokenizer, input_tokens: u32) -> Self {
        Self {
            blocks: Blocks::default(),
            tokens,
            input_tokens,
            open: None,
            keys: 0,
            tools: HashMap::new(),
            finish: None,
            usage: None,
            generated: String::new(),
        }
    }

    /// Makes `kind` the open block, closing another one first; returns its key.
    fn switch_to(&mut self, kind: Open, block: OutputBlock, out: &mut Vec<ProviderEvent>) -> usize {
        if let Some((open, key)) = self.open {
            if open == kind {
                return key;
            }
            self.blocks.stop(key, out);
        }
        let key = self.keys;
        self.keys += 1;
        self.blocks.start(key, block, out);
        self.open = Some((kind, key));
        key
    }

    fn tool_call(&mut self, call: ToolCallDelta, out: &mut Vec<ProviderEvent>) {
        let function = call.function;
        let key = match self.tools.get(&call.index) {
            Some(&key) if self.open == Some((Open::Tool(call.index), key)) => key,
            Some(_) => {
                tracing::debug!(
                    index = call.index,
                    "late fragment of a closed tool call dropped"
                );
                return;
            }
            None => {
                let block = tool_use_from_chat(call.id, function.name);
                let key = self.switch_to(Open::Tool(call.index), block, out);
                self.tools.insert(call.index, key);
                key
            }
        };
        self.generated.push_str(&function.arguments);
        self.blocks.delta(
            key,
            Delta::InputJson {
                partial_json: function.arguments,
            },
            out,
        );
    }

    fn finish(&mut self) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        self.blocks.stop_all(&mut out);
        let stop_reason = stop_from_chat(self.finish, !self.tools.is_empty());
        let usage = match &self.usage {
            Some(reported) => usage_from_chat(reported),
            None => TokenUsage {
                input_tokens: self.input_tokens,
                output_tokens: self.tokens.count(&self.generated),
                ..TokenUsage::default()
            },
        };
        out.push(ProviderEvent::Finish {
            stop_reason,
            stop_sequence: None,
            usage,
        });
        out
    }
}

impl Decoder for Stream {
    fn event(&mut self, event: SseEvent) -> Result<Vec<ProviderEvent>, ProviderError> {
        if event.data.trim_ascii() == b"[DONE]" {
            return self.end();
        }
        let chunk: ChatChunk =
            serde_json::from_slice(&event.data).map_err(|e| http::malformed("openai chunk", e))?;
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage);
        }
        let mut out = Vec::new();
        for choice in chunk.choices {
            let delta = choice.delta;
            if let Some(thinking) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                self.generated.push_str(&thinking);
                let block = OutputBlock::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                };
                let key = self.switch_to(Open::Thinking, block, &mut out);
                self.blocks
                    .delta(key, Delta::Thinking { thinking }, &mut out);
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.generated.push_str(&text);
                let block = OutputBlock::Text {
                    text: String::new(),
                };
                let key = self.switch_to(Open::Text, block, &mut out);
                self.blocks.delta(key, Delta::Text { text }, &mut out);
            }
            for call in delta.tool_calls {
                self.tool_call(call, &mut out);
            }
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(reason);
            }
        }
        Ok(out)
    }

    /// The turn ends at `[DONE]` (or at the end of the body, for upstreams that omit it)
    /// once a finish reason came: usage may follow the finish reason in a chunk of its own.
    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        if self.finish.is_none() {
            return Ok(Vec::new());
        }
        let events = self.finish();
        self.finish = None;
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use store::usage::StopReason;

    use super::*;

    fn stream() -> Stream {
        Stream::new(Tokenizer::default(), 9)
    }

    fn feed(stream: &mut Stream, events: &[&str]) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        for data in events {
            let event = SseEvent {
                data: Bytes::copy_from_slice(data.as_bytes()),
            };
            out.extend(stream.event(event).expect("a well-formed chunk"));
        }
        out
    }

    fn finish(events: &[ProviderEvent]) -> (StopReason, TokenUsage) {
        match events.last() {
            Some(ProviderEvent::Finish {
                stop_reason, usage, ..
            }) => (*stop_reason, *usage),
            other => panic!("the stream did not finish: {other:?}"),
        }
    }

    #[test]
    fn the_turn_ends_at_done_with_the_usage_chunk_that_follows_the_finish_reason() {
        let mut s = stream();
        let events = feed(
            &mut s,
            &[
                r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"length"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":2,"total_tokens":22}}"#,
                "[DONE]",
            ],
        );
        let (stop, usage) = finish(&events);
        assert_eq!(stop, StopReason::MaxTokens);
        assert_eq!((usage.input_tokens, usage.output_tokens), (20, 2));
    }

    #[test]
    fn an_upstream_that_reports_no_usage_is_billed_by_the_gateways_count() {
        let mut s = stream();
        let events = feed(
            &mut s,
            &[
                r#"{"choices":[{"index":0,"delta":{"content":"Hello there"},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
        );
        let (stop, usage) = finish(&events);
        assert_eq!(stop, StopReason::EndTurn);
        assert_eq!(
            usage.input_tokens, 9,
            "the gateway's own count of the input"
        );
        assert_eq!(
            usage.output_tokens,
            Tokenizer::default().count("Hello there")
        );
    }

    #[test]
    fn a_body_that_ends_without_a_finish_reason_finishes_nothing() {
        let mut s = stream();
        feed(
            &mut s,
            &[r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#],
        );
        assert_eq!(s.end().expect("end"), Vec::new());
    }

    #[test]
    fn a_tool_call_streams_as_a_tool_use_block_and_the_turn_stops_for_it() {
        let mut s = stream();
        let events = feed(
            &mut s,
            &[
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}"#,
                "[DONE]",
            ],
        );
        assert!(events.iter().any(|e| matches!(
            e,
            ProviderEvent::BlockStart { block: OutputBlock::ToolUse { name, .. }, .. } if name == "get_weather"
        )));
        assert!(events.contains(&ProviderEvent::BlockDelta {
            index: 0,
            delta: Delta::InputJson {
                partial_json: r#"{"city":"Paris"}"#.into()
            },
        }));
        assert_eq!(finish(&events).0, StopReason::ToolUse);
    }

    fn azure(base: &str, deployment: &str) -> Upstream {
        Upstream {
            name: "azure".into(),
            provider: ProviderKind::AzureOpenai,
            model: deployment.into(),
            base_url: Some(base.into()),
            api_version: Some("2024-10-21".into()),
            region: None,
            aws_credentials: None,
            project: None,
            google_credentials: None,
            api_key: Some(Secret("k-1".into())),
            weight: 1,
            timeouts: crds::config::Timeouts::default(),
            http2: false,
            chunk_delay_ms: 0,
        }
    }

    #[test]
    fn an_azure_call_goes_to_the_deployment_with_the_api_version_and_the_api_key_header() {
        let upstream = azure("https://res.openai.azure.com/", "gpt-4o prod/eu");
        let request = Endpoint::of(&upstream)
            .and_then(|e| {
                e.request(
                    &reqwest::Client::new(),
                    upstream.api_key.as_ref(),
                    &["chat", "completions"],
                )
            })
            .expect("a request")
            .build()
            .expect("a request");
        assert_eq!(
            request.url().as_str(),
            "https://res.openai.azure.com/openai/deployments/gpt-4o%20prod%2Feu/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(request.headers()["api-key"], "k-1");
        assert!(request.headers().get("authorization").is_none());
    }

    #[test]
    fn embeddings_go_to_the_deployments_embeddings_on_azure_and_base_embeddings_on_openai() {
        let upstream = azure("https://res.openai.azure.com", "embed-small");
        let request = Endpoint::of(&upstream)
            .and_then(|e| e.request(&reqwest::Client::new(), None, &["embeddings"]))
            .expect("a request")
            .build()
            .expect("a request");
        assert_eq!(
            request.url().as_str(),
            "https://res.openai.azure.com/openai/deployments/embed-small/embeddings?api-version=2024-10-21"
        );
        let openai = Upstream {
            provider: ProviderKind::Openai,
            api_version: None,
            base_url: Some("https://api.openai.com/v1/".into()),
            ..upstream
        };
        let request = Endpoint::of(&openai)
            .and_then(|e| e.request(&reqwest::Client::new(), None, &["embeddings"]))
            .expect("a request")
            .build()
            .expect("a request");
        assert_eq!(
            request.url().as_str(),
            "https://api.openai.com/v1/embeddings"
        );
    }
}
