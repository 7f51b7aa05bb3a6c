//! A mock upstream on loopback that speaks both wire formats the gateway's adapters call: the
//! Anthropic Messages API (`POST /v1/messages`) and OpenAI chat completions
//! (`POST /v1/chat/completions`), JSON or SSE as the request's `stream` asks; and chat
//! completions as an Azure OpenAI resource serves them
//! (`POST /openai/deployments/{deployment}/chat/completions?api-version=…`), which checks the
//! `api-key` header, the api-version and the deployment as Azure does, refusing a mismatch
//! with Azure's 401 or 404, adds Azure's content-filter results, and sends `retry-after` and
//! `retry-after-ms` with a 429 (`tests/python/test_upstream_adapters.py` checks it with the
//! `openai` SDK's `AzureOpenAI` client); and Claude on Amazon Bedrock
//! (`POST /model/{modelId}/invoke` and `/invoke-with-response-stream`), which checks the
//! SigV4 signature and the body as Bedrock does and streams AWS event-stream frames
//! (`crate::bedrock`); the Gemini API (`POST /v1beta/models/{model}:generateContent` and
//! `:streamGenerateContent?alt=sse`), which checks the `x-goog-api-key` header and the body's
//! shape as Google does (`crate::gemini`); and Claude on Google Vertex AI (`:streamRawPredict`,
//! `:rawPredict`) with Google's token endpoint and metadata server, which check the service
//! account's JWT and the bearer token as Google does (`crate::vertex`). Both OpenAI wire formats
//! also serve embeddings (`POST /v1/embeddings`, `/openai/deployments/{deployment}/embeddings`)
//! as OpenAI does: one vector per input, of the request's `dimensions` (8 by default), float or
//! base64 as its `encoding_format` asks, and [`MOCK_EMBEDDING_TOKENS_PER_INPUT`] prompt tokens
//! per input.
//!
//! Each test scripts it with a queue of [`Reply`]s, taken one per request in arrival order
//! (an empty queue answers a short text): normal replies, tool calls, thinking, usage with
//! cache tokens, any error status, a slow first byte, a stall mid-stream, a malformed chunk.
//! It records every request (path, headers, body) and counts streams the caller abandoned.
//! Like a real model it stops at the max_tokens it is sent: a reply whose usage counts more
//! output is cut there ([`Reply::within`]).
//!
//! Its error bodies and model names deliberately name the provider (`anthropic`, `openai`,
//! [`UPSTREAM_MODEL`]) so the leak checks of the harness catch the gateway forwarding them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};

use crate::gateway::{unique_name, workspace_root};

/// The upstream model name every generated route uses; it must never reach a client.
pub const UPSTREAM_MODEL: &str = "upstream-model-zq7";

#[derive(Clone, Debug)]
pub enum MockBlock {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// Thinking with its signature (the OpenAI format streams it as `reasoning_content`,
    /// without the signature).
    Thinking {
        thinking: String,
        signature: String,
    },
}

#[derive(Clone, Copy, Debug, Default)]
pub struct MockUsage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with this status and a provider-style error body.
    Status(u16),
    /// Hold the whole response back this long.
    FirstByteDelay(Duration),
    /// Send this many SSE events, then nothing more (the connection stays open).
    StallAfter(usize),
    /// Send this many SSE events, then one whose data is not JSON.
    MalformedAfter(usize),
    /// Send this many SSE events, then an Anthropic `error` event (overloaded).
    OverloadedAfter(usize),
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Reply {
    pub blocks: Vec<MockBlock>,
    pub max_tokens_hit: bool,
    pub usage: MockUsage,
    /// The part of `usage.cache_write` that went to the 1-hour cache, which the Anthropic
    /// format reports apart (`cache_creation.ephemeral_1h_input_tokens`).
    pub cache_write_1h: u64,
    pub fault: Option<Fault>,
    /// Pause before each SSE event after the first.
    pub chunk_delay: Duration,
}

impl Reply {
    pub fn text(text: &str) -> Reply {
        Reply {
            blocks: vec![MockBlock::Text(text.to_owned())],
            max_tokens_hit: false,
            usage: MockUsage {
                input: 21,
                output: 9,
                ..MockUsage::default()
            },
            cache_write_1h: 0,
            fault: None,
            chunk_delay: Duration::ZERO,
        }
    }

    /// A reply with no content at all: no block in the Anthropic format, no content beyond
    /// the opening empty string in the OpenAI one; its usage counts no output.
    pub fn empty() -> Reply {
        Reply {
            blocks: Vec::new(),
            usage: MockUsage {
                input: 21,
                output: 0,
                ..MockUsage::default()
            },
            ..Reply::text("")
        }
    }

    /// A reply that ends in a call of `name` with `input`.
    pub fn tool_call(name: &str, input: Value) -> Reply {
        Reply {
            blocks: Vec::new(),
            ..Reply::text("")
        }
        .then_tool(name, input)
    }

    pub fn status(status: u16) -> Reply {
        Reply::text("unused").fault(Fault::Status(status))
    }

    pub fn then_text(mut self, text: &str) -> Reply {
        self.blocks.push(MockBlock::Text(text.to_owned()));
        self
    }

    pub fn then_tool(mut self, name: &str, input: Value) -> Reply {
        let id = format!("toolu_mock_{}", self.blocks.len());
        self.blocks.push(MockBlock::ToolUse {
            id,
            name: name.to_owned(),
            input,
        });
        self
    }

    pub fn thinking_first(mut self, thinking: &str, signature: &str) -> Reply {
        self.blocks.insert(
            0,
            MockBlock::Thinking {
                thinking: thinking.to_owned(),
                signature: signature.to_owned(),
            },
        );
        self
    }

    pub fn usage(mut self, usage: MockUsage) -> Reply {
        self.usage = usage;
        self
    }

    /// Reports `tokens` of the usage's cache writes as 1-hour ones (Anthropic format).
    pub fn cache_write_1h(mut self, tokens: u64) -> Reply {
        self.cache_write_1h = tokens;
        self
    }

    pub fn max_tokens_hit(mut self) -> Reply {
        self.max_tokens_hit = true;
        self
    }

    pub fn fault(mut self, fault: Fault) -> Reply {
        self.fault = Some(fault);
        self
    }

    pub fn chunk_delay(mut self, delay: Duration) -> Reply {
        self.chunk_delay = delay;
        self
    }

    /// The reply a model gives under `max_tokens`, as upstreams stop at the max_tokens they
    /// are sent: a reply whose usage counts more output is cut there (`max_tokens` /
    /// `length`), its usage counting `max_tokens`. The text is cut to at most `max_tokens`
    /// characters (no token is shorter); a tool call past the cut is not sent, as a
    /// generation cut short never completes it.
    pub fn within(mut self, max_tokens: Option<u64>) -> Reply {
        let Some(max_tokens) = max_tokens else {
            return self;
        };
        if self.usage.output <= max_tokens {
            return self;
        }
        self.usage.output = max_tokens;
        self.max_tokens_hit = true;
        let mut left = usize::try_from(max_tokens).unwrap_or(usize::MAX);
        let mut kept = Vec::new();
        for block in self.blocks {
            match block {
                MockBlock::Text(text) => {
                    let cut: String = text.chars().take(left).collect();
                    left -= cut.chars().count();
                    kept.push(MockBlock::Text(cut));
                }
                MockBlock::Thinking {
                    thinking,
                    signature,
                } => {
                    let cut: String = thinking.chars().take(left).collect();
                    left -= cut.chars().count();
                    kept.push(MockBlock::Thinking {
                        thinking: cut,
                        signature,
                    });
                }
                MockBlock::ToolUse { .. } => break,
            }
        }
        self.blocks = kept;
        self
    }

    fn calls_tool(&self) -> bool {
        self.blocks
            .iter()
            .any(|b| matches!(b, MockBlock::ToolUse { .. }))
    }
}

/// A request the mock received.
#[derive(Clone, Debug)]
pub struct Received {
    /// HTTP/1.1, or HTTP/2 when the route asked for cleartext HTTP/2.
    pub version: Version,
    pub path: String,
    /// The query string, without `?` (empty when there is none).
    pub query: String,
    pub headers: HeaderMap,
    pub body: Value,
    /// The body's size as sent.
    pub bytes: usize,
}

/// What a request gets when the queue is empty.
#[derive(Clone, Debug)]
pub enum Unscripted {
    Always(Reply),
    /// An agent's tool loop, whatever side requests the client makes in between: a request
    /// that offers `tool` and carries no tool result yet gets a call of it with `input`; any
    /// other request gets `answer`.
    Agent {
        tool: String,
        input: Value,
        answer: String,
    },
    /// A model whose window the conversation nearly fills: the first request of at least
    /// `min_bytes` gets a reply whose usage counts `output` tokens, so that it stops at the
    /// max_tokens it is sent ([`Reply::within`]); every other request gets `answer`.
    FillsTheWindowOnce {
        min_bytes: usize,
        output: u64,
        answer: String,
        given: Arc<std::sync::atomic::AtomicBool>,
    },
}

impl Unscripted {
    fn reply(&self, body: &Value) -> Reply {
        match self {
            Unscripted::Always(reply) => reply.clone(),
            Unscripted::Agent {
                tool,
                input,
                answer,
            } => {
                let has_result = carries_tool_result(body);
                let offers_tool = body["tools"].as_array().is_some_and(|tools| {
                    tools.iter().any(|t| {
                        t["name"] == tool.as_str()
                            || t["function"]["name"] == tool.as_str()
                            || t["functionDeclarations"]
                                .as_array()
                                .is_some_and(|f| f.iter().any(|d| d["name"] == tool.as_str()))
                    })
                });
                if offers_tool && !has_result {
                    Reply::tool_call(tool, input.clone())
                } else {
                    Reply::text(answer)
                }
            }
            Unscripted::FillsTheWindowOnce {
                min_bytes,
                output,
                answer,
                given,
            } => {
                let large = body.to_string().len() >= *min_bytes;
                if large && !given.swap(true, Ordering::SeqCst) {
                    Reply::text(answer).usage(MockUsage {
                        input: 21,
                        output: *output,
                        ..MockUsage::default()
                    })
                } else {
                    Reply::text(answer)
                }
            }
        }
    }
}

/// Whether a request (any wire format) carries a tool result anywhere in its conversation.
pub fn carries_tool_result(body: &Value) -> bool {
    let gemini = body["contents"].as_array().is_some_and(|contents| {
        contents.iter().any(|c| {
            c["parts"]
                .as_array()
                .is_some_and(|parts| parts.iter().any(|p| p.get("functionResponse").is_some()))
        })
    });
    gemini
        || body["messages"].as_array().is_some_and(|messages| {
            messages.iter().any(|m| {
                m["role"] == "tool"
                    || m["content"]
                        .as_array()
                        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
            })
        })
}

struct Shared {
    unscripted: Unscripted,
    /// Whether requests are kept for `received` (off for benchmarks).
    record: bool,
    queue: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
    /// The paths of requests refused before any model saw them (a bad signature...).
    refused: Mutex<Vec<String>>,
    /// Streams dropped by the caller before their last event.
    abandoned: AtomicUsize,
    /// Streamed responses open now, and the most open at once.
    open: AtomicUsize,
    peak_open: AtomicUsize,
    /// The Google access tokens granted (the Vertex AI endpoints take only those).
    grants: crate::vertex::Grants,
}

/// The running mock, stopped when dropped.
pub struct MockUpstream {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl MockUpstream {
    /// A mock on a free loopback port that records requests and answers a short text when
    /// nothing is queued.
    pub async fn start() -> MockUpstream {
        let unscripted = Unscripted::Always(Reply::text("Hello from upstream."));
        MockUpstream::serve("127.0.0.1:0", unscripted, true).await
    }

    pub async fn serve(addr: &str, unscripted: Unscripted, record: bool) -> MockUpstream {
        let shared = Arc::new(Shared {
            unscripted,
            record,
            queue: Mutex::default(),
            received: Mutex::default(),
            refused: Mutex::default(),
            abandoned: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            peak_open: AtomicUsize::new(0),
            grants: crate::vertex::Grants::default(),
        });
        let app = Router::new()
            .route("/v1/messages", post(answer))
            .route("/v1/chat/completions", post(answer))
            .route(
                "/openai/deployments/{deployment}/chat/completions",
                post(answer),
            )
            .route("/v1/embeddings", post(answer))
            .route("/openai/deployments/{deployment}/embeddings", post(answer))
            .route("/model/{model}/invoke", post(answer))
            .route("/model/{model}/invoke-with-response-stream", post(answer))
            // `{model}:generateContent` and `{model}:streamGenerateContent`: one segment.
            .route("/v1beta/models/{model_method}", post(answer))
            .route("/v1/projects/{*endpoint}", post(answer))
            .route("/token", post(google_token))
            .route(crate::vertex::METADATA_TOKEN, get(metadata_token))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind the mock upstream's address");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let task = tokio::spawn(serve(listener, app));
        MockUpstream { url, shared, task }
    }

    /// Queues replies for the next requests, in order.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.shared.queue).extend(replies);
    }

    pub fn received(&self) -> Vec<Received> {
        lock(&self.shared.received).clone()
    }

    /// The requests refused before any model saw them, as Bedrock refuses a bad signature.
    pub fn refused_count(&self) -> usize {
        lock(&self.shared.refused).len()
    }

    pub fn request_count(&self) -> usize {
        lock(&self.shared.received).len()
    }

    pub fn last_body(&self) -> Value {
        self.received()
            .last()
            .map(|r| r.body.clone())
            .expect("the mock upstream received a request")
    }

    /// The Google access tokens granted: for a service account's key file (`/token`), and by
    /// the metadata server.
    pub fn token_grants(&self) -> (usize, usize) {
        let grants = &self.shared.grants;
        (
            grants.key_file_grants.load(Ordering::SeqCst),
            grants.metadata_grants.load(Ordering::SeqCst),
        )
    }

    /// The token requests refused (a bad signature, an expired assertion...).
    pub fn token_refusals(&self) -> usize {
        self.shared.grants.refused.load(Ordering::SeqCst)
    }

    /// The lifetime the token endpoints report from now on (the tokens stay valid an hour).
    pub fn report_token_lifetime(&self, secs: u64) {
        *self
            .shared
            .grants
            .reported_secs
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(secs);
    }

    /// Expires every access token granted so far: Vertex refuses them from now on.
    pub fn expire_tokens(&self) {
        self.shared.grants.expire_all();
    }

    /// The most streamed responses that were open at once.
    pub fn peak_open_streams(&self) -> usize {
        self.shared.peak_open.load(Ordering::SeqCst)
    }

    pub fn abandoned(&self) -> usize {
        self.shared.abandoned.load(Ordering::SeqCst)
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The streams an HTTP/2 connection to the mock carries at once: 100, the figure servers
/// commonly advertise, and the number of calls the gateway puts on one connection.
pub const MAX_HTTP2_STREAMS: u32 = 100;

/// Serves HTTP/1.1, and HTTP/2 with prior knowledge (h2c) for routes that ask for it.
async fn serve(listener: tokio::net::TcpListener, app: Router) {
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http2().max_concurrent_streams(MAX_HTTP2_STREAMS);
    let http = Arc::new(http);
    loop {
        let Ok((io, _)) = listener.accept().await else {
            continue;
        };
        // As servers of streamed APIs do: each SSE event leaves at once, not with the next.
        let _ = io.set_nodelay(true);
        let (http, service) = (http.clone(), TowerToHyperService::new(app.clone()));
        tokio::spawn(async move {
            let _ = http.serve_connection(TokioIo::new(io), service).await;
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    Anthropic,
    OpenAi,
    /// Chat completions on an Azure OpenAI resource.
    Azure,
    /// Claude on Amazon Bedrock: `InvokeModel` (JSON), or with `stream` its
    /// `InvokeModelWithResponseStream` (the AWS event stream).
    Bedrock {
        stream: bool,
    },
    /// The Gemini API: `:generateContent` (JSON), or `:streamGenerateContent` (SSE).
    Gemini {
        stream: bool,
    },
    /// Claude on Vertex AI: `:rawPredict` (JSON) or `:streamRawPredict` (the Messages SSE).
    Vertex {
        stream: bool,
    },
}

/// The Azure OpenAI data-plane version the mock serves; any other is refused, as Azure refuses
/// an api-version it does not know.
pub const AZURE_API_VERSION: &str = "2024-10-21";
/// The wait the mock's Azure throttle (429) gives, in its two headers.
pub const AZURE_RETRY_AFTER_SECS: &str = "20";
pub const AZURE_RETRY_AFTER_MS: &str = "20000";

/// Azure's own checks, in its order: the key (401), then the api-version and the deployment
/// (404). `None` when the request passes them.
fn azure_refusal(path: &str, query: &str, headers: &HeaderMap) -> Option<Response> {
    let refuse = |status: StatusCode, code: &str, message: &str| {
        let body = json!({"error": {"code": code, "message": message}});
        Some((status, axum::Json(body)).into_response())
    };
    if headers.get("api-key").and_then(|v| v.to_str().ok()) != Some(UPSTREAM_API_KEY) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to \
             provide a valid key for an active subscription and use a correct regional API \
             endpoint for your resource.",
        );
    }
    // Versions are dates: no percent-encoding to undo.
    let version = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "api-version")
        .map(|(_, value)| value);
    if version != Some(AZURE_API_VERSION) {
        return refuse(StatusCode::NOT_FOUND, "404", "Resource not found");
    }
    let deployment = path.strip_prefix("/openai/deployments/").and_then(|rest| {
        rest.strip_suffix("/chat/completions")
            .or_else(|| rest.strip_suffix("/embeddings"))
    });
    if deployment != Some(UPSTREAM_MODEL) {
        return refuse(
            StatusCode::NOT_FOUND,
            "DeploymentNotFound",
            "The API deployment for this resource does not exist. If you created the \
             deployment within the last 5 minutes, please wait a moment and try again.",
        );
    }
    None
}

async fn google_token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    crate::vertex::token_endpoint(&shared.grants, &headers, &body)
}

async fn metadata_token(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    crate::vertex::metadata_endpoint(&shared.grants, &headers)
}

async fn answer(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let version = request.version();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let headers = request.headers().clone();
    let bytes = axum::body::to_bytes(request.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if shared.record {
        lock(&shared.received).push(Received {
            version,
            path: path.clone(),
            query: query.clone(),
            headers: headers.clone(),
            body: body.clone(),
            bytes: bytes.len(),
        });
    }
    let wire = if let Some(stream) = crate::vertex::wire(&path) {
        Wire::Vertex { stream }
    } else if path.ends_with("/messages") {
        Wire::Anthropic
    } else if path.starts_with("/openai/deployments/") {
        Wire::Azure
    } else if let Some(method) = crate::gemini::method(&path) {
        Wire::Gemini {
            stream: method == crate::gemini::Method::Stream,
        }
    } else if path.starts_with("/model/") {
        Wire::Bedrock {
            stream: path.ends_with("/invoke-with-response-stream"),
        }
    } else {
        Wire::OpenAi
    };
    // A refused request takes no scripted reply: it never reached a model.
    let refusal = match wire {
        Wire::Azure => azure_refusal(&path, &query, &headers),
        Wire::Bedrock { .. } => crate::bedrock::refusal(&path, &query, &headers, &bytes, &body),
        Wire::Gemini { .. } => crate::gemini::refusal(&path, &query, &headers, &body),
        Wire::Vertex { .. } => crate::vertex::refusal(&shared.grants, &path, &headers, &body),
        _ => None,
    };
    if let Some(refusal) = refusal {
        if shared.record {
            lock(&shared.refused).push(path);
        }
        return refusal;
    }
    if path.ends_with("/embeddings") {
        // A queued reply's fault applies (a throttle, an outage); its text does not.
        let fault = lock(&shared.queue).pop_front().and_then(|r| r.fault);
        if let Some(Fault::Status(status)) = fault {
            return error_response(wire, status);
        }
        return embeddings_json(&body);
    }
    let reply = lock(&shared.queue)
        .pop_front()
        .unwrap_or_else(|| shared.unscripted.reply(&body))
        .within(sent_max_tokens(&body));
    let model = body["model"].as_str().unwrap_or(UPSTREAM_MODEL).to_owned();
    match reply.fault {
        Some(Fault::Status(status)) => return error_response(wire, status),
        Some(Fault::FirstByteDelay(delay)) => tokio::time::sleep(delay).await,
        _ => {}
    }
    let stream = match wire {
        Wire::Bedrock { stream } | Wire::Gemini { stream } | Wire::Vertex { stream } => stream,
        _ => body["stream"].as_bool().unwrap_or(false),
    };
    if !stream {
        let json = match wire {
            Wire::Anthropic | Wire::Bedrock { .. } | Wire::Vertex { .. } => {
                anthropic_json(&reply, &model)
            }
            Wire::OpenAi => openai_json(&reply, &model),
            Wire::Azure => azure_json(&reply, &model),
            Wire::Gemini { .. } => crate::gemini::json(&reply, &body),
        };
        let mut response = axum::Json(json).into_response();
        if matches!(wire, Wire::Bedrock { .. }) {
            crate::bedrock::add_content_type(&mut response);
        }
        return response;
    }
    let include_usage = body["stream_options"]["include_usage"].as_bool() == Some(true);
    let events = match wire {
        Wire::Anthropic | Wire::Vertex { .. } => anthropic_events(&reply, &model),
        Wire::OpenAi => openai_events(&reply, &model, include_usage),
        Wire::Azure => azure_events(&reply, &model, include_usage),
        Wire::Gemini { .. } => crate::gemini::events(&reply, &body),
        Wire::Bedrock { .. } => {
            let events = crate::bedrock::frames(&anthropic_events(&reply, &model), &reply.usage);
            let mut response = stream_response(events, &reply, shared, Framing::AwsEventStream);
            crate::bedrock::add_content_type(&mut response);
            return response;
        }
    };
    stream_response(
        events.into_iter().map(Bytes::from).collect(),
        &reply,
        shared,
        Framing::Sse,
    )
}

/// The prompt tokens the mock reports per embeddings input, whatever its text: a count the
/// gateway's own tokenizer would not give, so a bill taken from the wrong count shows.
pub const MOCK_EMBEDDING_TOKENS_PER_INPUT: u64 = 7;

/// OpenAI's embeddings answer to `body` (a string or a list of strings as `input`): each
/// input's vector is its index and length, repeated to `dimensions` (8 by default).
fn embeddings_json(body: &Value) -> Response {
    let inputs: Vec<String> = match &body["input"] {
        Value::String(one) => vec![one.clone()],
        Value::Array(many) => many
            .iter()
            .map(|i| i.as_str().unwrap_or_default().to_owned())
            .collect(),
        _ => Vec::new(),
    };
    if inputs.is_empty() {
        let error = json!({"error": {"message": "openai: '$.input' is invalid", "type": "invalid_request_error"}});
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    let dimensions = body["dimensions"].as_u64().unwrap_or(8) as usize;
    let base64 = body["encoding_format"] == "base64";
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let vector: Vec<f32> = (0..dimensions)
                .map(|d| {
                    if d % 2 == 0 {
                        index as f32
                    } else {
                        input.len() as f32
                    }
                })
                .collect();
            let embedding = if base64 {
                use base64::Engine;
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens = MOCK_EMBEDDING_TOKENS_PER_INPUT * inputs.len() as u64;
    axum::Json(json!({
        "object": "list",
        "data": data,
        "model": body["model"].as_str().unwrap_or(UPSTREAM_MODEL),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

/// The max_tokens a request sent, in any wire format (`max_completion_tokens` first, as
/// OpenAI reads it).
fn sent_max_tokens(body: &Value) -> Option<u64> {
    body["max_completion_tokens"]
        .as_u64()
        .or_else(|| body["max_tokens"].as_u64())
        .or_else(|| body["generationConfig"]["maxOutputTokens"].as_u64())
}

fn error_response(wire: Wire, status: u16) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = format!("anthropic/openai/azure upstream {UPSTREAM_MODEL} says no ({status})");
    let body = match wire {
        Wire::Anthropic => {
            let kind = match status {
                400 => "invalid_request_error",
                401 => "authentication_error",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        Wire::OpenAi => {
            json!({"error": {"message": message, "type": "server_error", "code": status}})
        }
        Wire::Azure => json!({"error": {"code": status.to_string(), "message": message}}),
        Wire::Bedrock { .. } => return crate::bedrock::error_response(status, &message),
        Wire::Gemini { .. } => return crate::gemini::error_response(status),
        Wire::Vertex { .. } => return crate::vertex::error_response(status, &message),
    };
    let mut response = (code, axum::Json(body)).into_response();
    if wire == Wire::Azure && status == 429 {
        // Azure's throttle says when to come back, in seconds and in milliseconds: long enough
        // that a test's next turn, on however busy a machine, comes before it.
        for (name, value) in [
            ("retry-after", AZURE_RETRY_AFTER_SECS),
            ("retry-after-ms", AZURE_RETRY_AFTER_MS),
        ] {
            response
                .headers_mut()
                .insert(name, axum::http::HeaderValue::from_static(value));
        }
    }
    response.headers_mut().insert(
        "x-upstream-provider",
        axum::http::HeaderValue::from_static("anthropic-openai"),
    );
    response
}

/// Counts the stream as open while it lives, and as abandoned when it is dropped before its end.
struct Watch {
    shared: Arc<Shared>,
    done: bool,
}

impl Watch {
    fn new(shared: Arc<Shared>) -> Watch {
        let open = shared.open.fetch_add(1, Ordering::SeqCst) + 1;
        shared.peak_open.fetch_max(open, Ordering::SeqCst);
        Watch {
            shared,
            done: false,
        }
    }

    fn complete(&mut self) {
        self.done = true;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.open.fetch_sub(1, Ordering::SeqCst);
        if !self.done {
            self.shared.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// How a streamed answer is cut into events on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    Sse,
    /// Bedrock's binary frames (`crate::bedrock`).
    AwsEventStream,
}

fn stream_response(
    events: Vec<Bytes>,
    reply: &Reply,
    shared: Arc<Shared>,
    framing: Framing,
) -> Response {
    let (sent, tail) = match reply.fault {
        Some(Fault::StallAfter(n)) => (n, Tail::Stall),
        Some(Fault::MalformedAfter(n)) => (n, Tail::Malformed),
        Some(Fault::OverloadedAfter(n)) => (n, Tail::Overloaded),
        _ => (events.len(), Tail::End),
    };
    let delay = reply.chunk_delay;
    let events = events.into_iter().take(sent).collect();
    let body = async_stream_body(events, tail, delay, shared, framing);
    let content_type = match framing {
        Framing::Sse => "text/event-stream",
        Framing::AwsEventStream => "application/vnd.amazon.eventstream",
    };
    Response::builder()
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[derive(Clone, Copy)]
enum Tail {
    End,
    Stall,
    Malformed,
    Overloaded,
}

fn async_stream_body(
    events: Vec<Bytes>,
    tail: Tail,
    delay: Duration,
    shared: Arc<Shared>,
    framing: Framing,
) -> Body {
    let stream = futures::stream::unfold(
        (
            events.into_iter().enumerate(),
            Some(tail),
            Watch::new(shared),
        ),
        move |(mut events, tail, mut watch)| async move {
            if let Some((i, event)) = events.next() {
                if i > 0 && !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                return Some((Ok::<_, Infallible>(event), (events, tail, watch)));
            }
            match tail? {
                Tail::End => {
                    watch.complete();
                    None
                }
                Tail::Stall => {
                    futures::future::pending::<()>().await;
                    None
                }
                Tail::Malformed if framing == Framing::AwsEventStream => Some((
                    Ok(crate::bedrock::chunk_frame(
                        "{\"type\": \"content_block_delta\"",
                    )),
                    (events, Some(Tail::End), watch),
                )),
                Tail::Malformed => Some((
                    Ok(Bytes::from(
                        "data: {\"choices\": [{\"delta\": {\"content\"\n\n",
                    )),
                    (events, Some(Tail::End), watch),
                )),
                // Bedrock's throttle in a stream is an exception message.
                Tail::Overloaded if framing == Framing::AwsEventStream => Some((
                    Ok(crate::bedrock::exception_frame(
                        "throttlingException",
                        &format!("bedrock {UPSTREAM_MODEL}: Too many requests"),
                    )),
                    (events, Some(Tail::End), watch),
                )),
                Tail::Overloaded => {
                    let error = json!({"type": "error", "error": {"type": "overloaded_error",
                        "message": format!("anthropic {UPSTREAM_MODEL} overloaded")}});
                    Some((
                        Ok(Bytes::from(format!("event: error\ndata: {error}\n\n"))),
                        (events, Some(Tail::End), watch),
                    ))
                }
            }
        },
    );
    Body::from_stream(stream.boxed())
}

/// Splits text into pieces of a few characters, on char boundaries, as upstreams stream it.
fn pieces(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn sse(name: Option<&str>, data: &Value) -> String {
    match name {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

fn stop_reason(reply: &Reply) -> &'static str {
    if reply.max_tokens_hit {
        "max_tokens"
    } else if reply.calls_tool() {
        "tool_use"
    } else {
        "end_turn"
    }
}

fn anthropic_usage(reply: &Reply) -> Value {
    let u = &reply.usage;
    let one_hour = reply.cache_write_1h.min(u.cache_write);
    json!({"input_tokens": u.input, "output_tokens": u.output,
        "cache_creation_input_tokens": u.cache_write, "cache_read_input_tokens": u.cache_read,
        "cache_creation": {"ephemeral_5m_input_tokens": u.cache_write - one_hour,
            "ephemeral_1h_input_tokens": one_hour}})
}

fn anthropic_json(reply: &Reply, model: &str) -> Value {
    let content: Vec<Value> = reply
        .blocks
        .iter()
        .map(|b| match b {
            MockBlock::Text(text) => json!({"type": "text", "text": text}),
            MockBlock::ToolUse { id, name, input } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
            MockBlock::Thinking {
                thinking,
                signature,
            } => json!({"type": "thinking", "thinking": thinking, "signature": signature}),
        })
        .collect();
    json!({"id": "msg_mock", "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason(reply), "stop_sequence": null,
        "usage": anthropic_usage(reply)})
}

fn anthropic_events(reply: &Reply, model: &str) -> Vec<String> {
    let mut start_usage = anthropic_usage(reply);
    start_usage["output_tokens"] = json!(1);
    let mut out = vec![
        sse(
            Some("message_start"),
            &json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message",
                "role": "assistant", "model": model, "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": start_usage}}),
        ),
        sse(Some("ping"), &json!({"type": "ping"})),
    ];
    for (index, block) in reply.blocks.iter().enumerate() {
        let (start, deltas): (Value, Vec<Value>) = match block {
            MockBlock::Text(text) => (
                json!({"type": "text", "text": ""}),
                pieces(text, 6)
                    .into_iter()
                    .map(|p| json!({"type": "text_delta", "text": p}))
                    .collect(),
            ),
            MockBlock::ToolUse { id, name, input } => (
                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                pieces(&input.to_string(), 5)
                    .into_iter()
                    .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                    .collect(),
            ),
            MockBlock::Thinking {
                thinking,
                signature,
            } => {
                let mut deltas: Vec<Value> = pieces(thinking, 8)
                    .into_iter()
                    .map(|p| json!({"type": "thinking_delta", "thinking": p}))
                    .collect();
                deltas.push(json!({"type": "signature_delta", "signature": signature}));
                (
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                    deltas,
                )
            }
        };
        out.push(sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            out.push(sse(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        out.push(sse(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    out.push(sse(
        Some("message_delta"),
        &json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(reply), "stop_sequence": null},
            "usage": {"output_tokens": reply.usage.output}}),
    ));
    out.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
    out
}

fn finish_reason(reply: &Reply) -> &'static str {
    if reply.max_tokens_hit {
        "length"
    } else if reply.calls_tool() {
        "tool_calls"
    } else {
        "stop"
    }
}

fn openai_usage(u: &MockUsage) -> Value {
    let prompt = u.input + u.cache_read;
    json!({"prompt_tokens": prompt, "completion_tokens": u.output,
        "total_tokens": prompt + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cache_read}})
}

fn openai_json(reply: &Reply, model: &str) -> Value {
    let text: String = reply
        .blocks
        .iter()
        .filter_map(|b| match b {
            MockBlock::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let calls: Vec<Value> = reply
        .blocks
        .iter()
        .filter_map(|b| match b {
            MockBlock::ToolUse { id, name, input } => Some(json!({"id": id, "type": "function",
                "function": {"name": name, "arguments": input.to_string()}})),
            _ => None,
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({"id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(reply)}],
        "usage": openai_usage(&reply.usage)})
}

fn openai_events(reply: &Reply, model: &str, include_usage: bool) -> Vec<String> {
    let chunk = |choices: Value| {
        sse(
            None,
            &json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
                "model": model, "choices": choices}),
        )
    };
    let delta = |delta: Value| chunk(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
    // Real upstreams open with an empty content string: the source of empty text blocks.
    let mut out = vec![delta(json!({"role": "assistant", "content": ""}))];
    let mut tool_index = 0;
    for block in &reply.blocks {
        match block {
            MockBlock::Text(text) => out.extend(
                pieces(text, 6)
                    .into_iter()
                    .map(|p| delta(json!({"content": p}))),
            ),
            MockBlock::Thinking { thinking, .. } => out.extend(
                pieces(thinking, 8)
                    .into_iter()
                    .map(|p| delta(json!({"reasoning_content": p}))),
            ),
            MockBlock::ToolUse { id, name, input } => {
                out.push(delta(json!({"tool_calls": [{"index": tool_index, "id": id,
                    "type": "function", "function": {"name": name, "arguments": ""}}]})));
                out.extend(pieces(&input.to_string(), 5).into_iter().map(|p| {
                    delta(json!({"tool_calls": [{"index": tool_index,
                        "function": {"arguments": p}}]}))
                }));
                tool_index += 1;
            }
        }
    }
    out.push(chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": finish_reason(reply)}]),
    ));
    if include_usage {
        out.push(sse(
            None,
            &json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
                "model": model, "choices": [], "usage": openai_usage(&reply.usage)}),
        ));
    }
    out.push("data: [DONE]\n\n".to_owned());
    out
}

/// Azure's content-filter verdict on a prompt or a choice: nothing filtered.
fn azure_filter_results() -> Value {
    let safe = json!({"filtered": false, "severity": "safe"});
    json!({"hate": safe, "self_harm": safe, "sexual": safe, "violence": safe})
}

/// The OpenAI answer with what Azure adds: the prompt's and each choice's filter results.
fn azure_json(reply: &Reply, model: &str) -> Value {
    let mut json = openai_json(reply, model);
    json["prompt_filter_results"] =
        json!([{"prompt_index": 0, "content_filter_results": azure_filter_results()}]);
    json["choices"][0]["content_filter_results"] = azure_filter_results();
    json
}

/// The OpenAI stream as Azure sends it: first a chunk with no choices, an empty model and the
/// prompt's filter results, then the same chunks.
fn azure_events(reply: &Reply, model: &str, include_usage: bool) -> Vec<String> {
    let prompt = sse(
        None,
        &json!({"choices": [], "created": 0, "id": "", "model": "", "object": "",
            "prompt_filter_results": [{"prompt_index": 0,
                "content_filter_results": azure_filter_results()}]}),
    );
    std::iter::once(prompt)
        .chain(openai_events(reply, model, include_usage))
        .collect()
}

/// Every upstream provider with an adapter, as a ModelRoute names it: the tests that run a
/// client through each adapter loop over these.
pub const PROVIDERS: [&str; 6] = [
    "anthropic",
    "openai",
    "azure-openai",
    "bedrock",
    "gemini",
    "vertex",
];

/// One upstream of a generated ModelRoute.
#[derive(Clone, Debug)]
pub struct UpstreamDef {
    pub name: String,
    /// `anthropic`, `openai` or `azure-openai`.
    pub provider: &'static str,
    pub base_url: String,
    /// The `apiVersion` of an `azure-openai` upstream.
    pub api_version: Option<String>,
    /// The `region` of a `bedrock` upstream.
    pub region: Option<String>,
    /// The Secret a `bedrock` upstream's `awsCredentialsSecretRef` names; `None`: the
    /// gateway's environment.
    pub aws_credentials: Option<&'static str>,
    /// The Secret `apiKeySecretRef` names (key `apiKey`), for the providers with a key.
    pub api_key_secret: &'static str,
    /// The `project` of a `vertex` upstream.
    pub project: Option<String>,
    /// The service account key file a `vertex` upstream's `googleCredentialsSecretRef` names
    /// (in a Secret of its own); `None`: the metadata server.
    pub google_key_file: Option<String>,
    pub weight: u32,
    pub first_byte_ms: u64,
    pub idle_ms: u64,
    /// Cleartext HTTP/2 to the mock.
    pub http2: bool,
}

impl UpstreamDef {
    pub fn anthropic(mock: &MockUpstream) -> UpstreamDef {
        UpstreamDef {
            name: "primary".to_owned(),
            provider: "anthropic",
            base_url: mock.url.clone(),
            api_version: None,
            region: None,
            aws_credentials: None,
            api_key_secret: MOCK_KEY_SECRET,
            project: None,
            google_key_file: None,
            weight: 1,
            first_byte_ms: 10_000,
            idle_ms: 10_000,
            http2: false,
        }
    }

    pub fn openai(mock: &MockUpstream) -> UpstreamDef {
        UpstreamDef {
            provider: "openai",
            base_url: format!("{}/v1", mock.url),
            ..UpstreamDef::anthropic(mock)
        }
    }

    /// The mock as an Azure OpenAI resource: its root is the endpoint, the route's model the
    /// deployment.
    pub fn azure(mock: &MockUpstream) -> UpstreamDef {
        UpstreamDef {
            provider: "azure-openai",
            api_version: Some(AZURE_API_VERSION.to_owned()),
            ..UpstreamDef::anthropic(mock)
        }
    }

    /// The mock as Amazon Bedrock in [`crate::bedrock::REGION`], at the route's `baseUrl` (a
    /// VPC endpoint's place), signing with the Secret of [`crate::bedrock::CREDENTIALS_SECRET`].
    pub fn bedrock(mock: &MockUpstream) -> UpstreamDef {
        UpstreamDef {
            provider: "bedrock",
            region: Some(crate::bedrock::REGION.to_owned()),
            aws_credentials: Some(crate::bedrock::CREDENTIALS),
            ..UpstreamDef::anthropic(mock)
        }
    }

    /// The mock as the adapter `provider` (one of [`PROVIDERS`]) calls it.
    pub fn of(provider: &str, mock: &MockUpstream) -> UpstreamDef {
        match provider {
            "anthropic" => UpstreamDef::anthropic(mock),
            "openai" => UpstreamDef::openai(mock),
            "azure-openai" => UpstreamDef::azure(mock),
            "bedrock" => UpstreamDef::bedrock(mock),
            "gemini" => UpstreamDef::gemini(mock),
            "vertex" => UpstreamDef::vertex(mock),
            other => panic!("no {other} adapter"),
        }
    }

    /// The mock as the Gemini API, at the route's `baseUrl`.
    pub fn gemini(mock: &MockUpstream) -> UpstreamDef {
        UpstreamDef {
            provider: "gemini",
            ..UpstreamDef::anthropic(mock)
        }
    }

    /// The mock as Vertex AI in [`crate::vertex::REGION`] of [`crate::vertex::PROJECT`], at
    /// the route's `baseUrl`, with the test service account's key file, whose `token_uri` is
    /// the mock's.
    pub fn vertex(mock: &MockUpstream) -> UpstreamDef {
        UpstreamDef {
            provider: "vertex",
            region: Some(crate::vertex::REGION.to_owned()),
            project: Some(crate::vertex::PROJECT.to_owned()),
            google_key_file: Some(crate::vertex::key_file(
                &format!("{}/token", mock.url),
                false,
            )),
            ..UpstreamDef::anthropic(mock)
        }
    }

    /// Another Secret for `apiKeySecretRef` (e.g. [`crate::gemini::WRONG_KEY_SECRET`]).
    pub fn api_key_secret(mut self, secret: &'static str) -> UpstreamDef {
        self.api_key_secret = secret;
        self
    }

    /// Another key file (`Some(file)`), or none: the gateway asks the metadata server.
    pub fn google_key_file(mut self, file: Option<String>) -> UpstreamDef {
        self.google_key_file = file;
        self
    }

    /// Another Secret of AWS credentials ([`crate::bedrock::WRONG_CREDENTIALS`]), or none: the
    /// gateway signs with its environment's.
    pub fn aws_credentials(mut self, secret: Option<&'static str>) -> UpstreamDef {
        self.aws_credentials = secret;
        self
    }

    /// Another `region` (the mock refuses a signature scoped to any but its own).
    pub fn region(mut self, region: &str) -> UpstreamDef {
        self.region = Some(region.to_owned());
        self
    }

    /// Another `apiVersion` (the mock refuses any but [`AZURE_API_VERSION`]).
    pub fn api_version(mut self, version: &str) -> UpstreamDef {
        self.api_version = Some(version.to_owned());
        self
    }

    /// An upstream nothing listens on: every connection is refused.
    ///
    /// The port stays bound (never listening) until the test process ends: a port only
    /// released could be taken at once by the gateway or mock another test starts, and the
    /// "refused" upstream would then answer (a CI run got a 502 for the expected 503).
    pub fn refused(provider: &'static str) -> UpstreamDef {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a socket");
        socket
            .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .expect("a free port");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .expect("a bound port");
        Box::leak(Box::new(socket));
        UpstreamDef {
            name: "refused".to_owned(),
            provider,
            base_url: format!("http://127.0.0.1:{port}"),
            api_version: None,
            region: None,
            aws_credentials: None,
            api_key_secret: MOCK_KEY_SECRET,
            project: None,
            google_key_file: None,
            weight: 1,
            first_byte_ms: 10_000,
            idle_ms: 10_000,
            http2: false,
        }
    }

    pub fn named(mut self, name: &str) -> UpstreamDef {
        self.name = name.to_owned();
        self
    }

    pub fn weight(mut self, weight: u32) -> UpstreamDef {
        self.weight = weight;
        self
    }

    /// The route asks for cleartext HTTP/2 (`http2: true`).
    pub fn http2(mut self) -> UpstreamDef {
        self.http2 = true;
        self
    }

    pub fn timeouts(mut self, first_byte_ms: u64, idle_ms: u64) -> UpstreamDef {
        self.first_byte_ms = first_byte_ms;
        self.idle_ms = idle_ms;
        self
    }
}

/// A gateway whose every model goes through the `provider` adapter (`anthropic` or `openai`)
/// to a mock upstream playing an agent's model ([`Unscripted::Agent`]): it calls `tool` with
/// `input` until the conversation carries a tool result, then answers `answer`.
pub struct AgentUpstream {
    pub mock: MockUpstream,
    pub gw: crate::gateway::Gateway,
    /// The folder the gateway reads its routes from, kept for as long as it runs.
    _manifests: RoutedManifests,
}

impl AgentUpstream {
    pub async fn start(provider: &str, tool: &str, input: Value, answer: &str) -> AgentUpstream {
        let agent = Unscripted::Agent {
            tool: tool.to_owned(),
            input,
            answer: answer.to_owned(),
        };
        let mock = MockUpstream::serve("127.0.0.1:0", agent, true).await;
        let manifests = RoutedManifests::new(&[UpstreamDef::of(provider, &mock)]);
        let gw = crate::gateway::Gateway::builder()
            .manifests(&manifests.path)
            .start()
            .await;
        AgentUpstream {
            mock,
            gw,
            _manifests: manifests,
        }
    }
}

/// A manifest folder: the standalone tiers and keys, and every virtual model routed to
/// `upstreams` (svc/auto keeps choosing among the others). Removed on drop.
pub struct RoutedManifests {
    pub path: std::path::PathBuf,
}

impl RoutedManifests {
    pub fn new(upstreams: &[UpstreamDef]) -> RoutedManifests {
        let path = std::env::temp_dir().join(unique_name("e2e-upstream-manifests"));
        write_routed_manifests(&path, upstreams);
        RoutedManifests { path }
    }
}

/// Writes the folder [`RoutedManifests`] describes into `path`, which is kept.
pub fn write_routed_manifests(path: &std::path::Path, upstreams: &[UpstreamDef]) {
    std::fs::create_dir_all(path).expect("create the manifest folder");
    let standalone = workspace_root().join("deploy").join("standalone");
    for file in ["tiers.yaml", "apikeys.yaml"] {
        std::fs::copy(standalone.join(file), path.join(file)).expect("copy a manifest");
    }
    let routes = std::fs::read_to_string(standalone.join("models.yaml"))
        .expect("read the standalone models");
    std::fs::write(path.join("models.yaml"), reroute(&routes, upstreams))
        .expect("write models.yaml");
    let mut secrets = format!("{SECRET}---\n{}", crate::bedrock::CREDENTIALS_SECRET);
    for u in upstreams {
        if let Some(file) = &u.google_key_file {
            secrets.push_str("---\n");
            secrets.push_str(&crate::vertex::secret_yaml(&google_secret(u), file));
        }
    }
    std::fs::write(path.join("secrets.yaml"), secrets).expect("write secrets.yaml");
}

impl RoutedManifests {
    /// Sets `affinity` on every route that has upstreams.
    pub fn affinity(&self, affinity: &str) {
        let path = self.path.join("models.yaml");
        let routes = std::fs::read_to_string(&path).expect("read models.yaml");
        let routes = routes.replace(
            "\n  upstreams:\n",
            &format!("\n  affinity: {affinity}\n  upstreams:\n"),
        );
        std::fs::write(path, routes).expect("write models.yaml");
    }
}

impl Drop for RoutedManifests {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The upstream API key routes refer to; the mock records what the gateway sent.
pub const UPSTREAM_API_KEY: &str = "upstream-secret-key-8812";

/// The Secret of [`UPSTREAM_API_KEY`].
pub const MOCK_KEY_SECRET: &str = "mock-upstream-key";

const SECRET: &str = "apiVersion: v1
kind: Secret
metadata:
  name: mock-upstream-key
type: Opaque
stringData:
  apiKey: upstream-secret-key-8812
---
apiVersion: v1
kind: Secret
metadata:
  name: mock-upstream-key-wrong
type: Opaque
stringData:
  apiKey: upstream-secret-key-not-this-one
";

/// The Secret holding a vertex upstream's key file.
fn google_secret(upstream: &UpstreamDef) -> String {
    format!("mock-google-{}", upstream.name)
}

/// Replaces every `upstreams:` list of the standalone routes with `upstreams`.
fn reroute(routes: &str, upstreams: &[UpstreamDef]) -> String {
    let mut list = String::from("  upstreams:\n");
    for u in upstreams {
        let api_version = u
            .api_version
            .as_deref()
            .map(|v| format!("      apiVersion: \"{v}\"\n"))
            .unwrap_or_default();
        // Bedrock signs with AWS credentials, and names its models `provider.name-vN:M`;
        // Vertex takes a Google token, and names them `name@version`.
        let (model, credentials) = match (&u.region, &u.project) {
            (Some(region), Some(project)) => (
                crate::vertex::MODEL_ID,
                format!(
                    "      region: {region}\n      project: {project}\n{}",
                    u.google_key_file
                        .as_ref()
                        .map(|_| format!(
                            "      googleCredentialsSecretRef:\n        name: {}\n        key: key.json\n",
                            google_secret(u)
                        ))
                        .unwrap_or_default()
                ),
            ),
            (Some(region), None) => (
                crate::bedrock::MODEL_ID,
                format!(
                    "      region: {region}\n{}",
                    u.aws_credentials
                        .map(|name| format!(
                            "      awsCredentialsSecretRef:\n        name: {name}\n"
                        ))
                        .unwrap_or_default()
                ),
            ),
            (None, _) => (
                UPSTREAM_MODEL,
                format!(
                    "      apiKeySecretRef:\n        name: {}\n        key: apiKey\n",
                    u.api_key_secret
                ),
            ),
        };
        list.push_str(&format!(
            "    - name: {}\n      provider: {}\n      model: \"{model}\"\n      baseUrl: {}\n      weight: {}\n{credentials}      timeouts:\n        connectMs: 2000\n        firstByteMs: {}\n        idleMs: {}\n      http2: {}\n{api_version}",
            u.name, u.provider, u.base_url, u.weight, u.first_byte_ms, u.idle_ms, u.http2
        ));
    }
    // svc/embed is rerouted only where every upstream serves embeddings; elsewhere it keeps
    // its simulated upstream (the compiler refuses embeddings on the other providers).
    let embeddings = upstreams
        .iter()
        .all(|u| matches!(u.provider, "openai" | "azure-openai"));
    let mut out = String::new();
    let mut skipping = false;
    let mut embed_route = false;
    for line in routes.lines() {
        if line == "---" {
            embed_route = false;
        }
        if line == "  model: svc/embed" {
            embed_route = true;
        }
        if line == "  upstreams:" && (embeddings || !embed_route) {
            out.push_str(&list);
            skipping = true;
            continue;
        }
        if skipping && line.starts_with("    ") {
            continue;
        }
        skipping = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}
