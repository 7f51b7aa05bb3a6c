//! Server-Sent Events: reading a streamed body event by event, and the grammars of the
//! Anthropic (`/v1/messages`), OpenAI (`/v1/chat/completions`) and Responses API
//! (`/v1/responses`) streams.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::leak;
use crate::response::{RateLimit, Resp};

/// One SSE event: its `event:` name (if any) and its `data:` lines joined by `\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

impl SseEvent {
    /// The event name, `message` when the event has none (as in the SSE spec).
    pub fn name(&self) -> &str {
        self.event.as_deref().unwrap_or("message")
    }

    /// The data as JSON; panics when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {self:?}"))
    }
}

/// A streamed response read incrementally.
pub struct SseStream {
    pub status: u16,
    pub headers: HeaderMap,
    response: Option<reqwest::Response>,
    buf: Vec<u8>,
    pending: Option<SseEvent>,
    /// The transport error that ended the body, if it did not end cleanly.
    pub transport_error: Option<String>,
}

impl SseStream {
    pub fn new(response: reqwest::Response) -> SseStream {
        let headers = response.headers().clone();
        leak::assert_headers_clean(&headers);
        SseStream {
            status: response.status().as_u16(),
            headers,
            response: Some(response),
            buf: Vec::new(),
            pending: None,
            transport_error: None,
        }
    }

    /// A stream whose body was read whole some other way (the router tests call the router
    /// in process); its events are read from `body` as from the wire.
    pub fn from_body(status: u16, headers: HeaderMap, body: Vec<u8>) -> SseStream {
        leak::assert_headers_clean(&headers);
        SseStream {
            status,
            headers,
            response: None,
            buf: body,
            pending: None,
            transport_error: None,
        }
    }

    /// The `Content-Type` header.
    pub fn content_type(&self) -> String {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    /// The X-RateLimit-* headers of the stream's response.
    pub fn rate_limit(&self) -> RateLimit {
        RateLimit::from_headers(&self.headers)
            .unwrap_or_else(|e| panic!("{e} on a stream response"))
    }

    /// Panics unless the stream was accepted (200, `text/event-stream`).
    pub fn expect_sse(&self) {
        assert_eq!(self.status, 200, "stream not accepted");
        assert!(
            self.content_type().starts_with("text/event-stream"),
            "content-type of a stream: {:?}",
            self.content_type()
        );
    }

    /// For a rejected stream: reads the rest of the body as a normal response.
    pub async fn into_resp(mut self) -> Resp {
        let response = self.response.take().expect("body not read yet");
        assert!(self.buf.is_empty(), "into_resp after reading events");
        Resp::read(response).await
    }

    /// Drops the connection (a client disconnect).
    pub fn disconnect(mut self) {
        self.response.take();
    }

    /// The next event, `None` at the end of the body (clean or not, see `transport_error`).
    pub async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                let line = String::from_utf8(line).expect("SSE is UTF-8");
                if let Some(event) = self.feed_line(&line) {
                    return Some(event);
                }
            }
            let chunk = match self.response.as_mut() {
                Some(response) => response.chunk().await,
                None => return self.pending.take().map(finish),
            };
            match chunk {
                Ok(Some(bytes)) => self.buf.extend_from_slice(&bytes),
                Ok(None) => {
                    self.response = None;
                    if !self.buf.is_empty() {
                        let rest =
                            String::from_utf8(std::mem::take(&mut self.buf)).expect("SSE is UTF-8");
                        let _ = self.feed_line(&rest);
                    }
                }
                Err(e) => {
                    self.transport_error = Some(e.to_string());
                    self.response = None;
                }
            }
        }
    }

    /// Like [`next_event`](Self::next_event), panicking when nothing arrives within `within`.
    pub async fn next_event_within(&mut self, within: Duration) -> Option<SseEvent> {
        tokio::time::timeout(within, self.next_event())
            .await
            .unwrap_or_else(|_| panic!("no SSE event within {within:?}"))
    }

    /// Reads until the named event arrives (returned) or the body ends (panic).
    pub async fn read_until(&mut self, name: &str, seen: &mut Vec<SseEvent>) -> SseEvent {
        while let Some(event) = self.next_event_within(Duration::from_secs(30)).await {
            seen.push(event.clone());
            if event.name() == name {
                return event;
            }
        }
        panic!("stream ended before a {name:?} event; saw {seen:#?}");
    }

    /// Reads every remaining event.
    pub async fn collect(mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next_event_within(Duration::from_secs(60)).await {
            events.push(event);
        }
        if let Some(error) = &self.transport_error {
            panic!("stream ended with a transport error ({error}) after {events:#?}");
        }
        events
    }

    fn feed_line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.pending.take().map(finish);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        let event = self.pending.get_or_insert(SseEvent {
            event: None,
            data: String::new(),
        });
        match field {
            "event" => event.event = Some(value.to_string()),
            "data" => {
                if !event.data.is_empty() {
                    event.data.push('\n');
                }
                event.data.push_str(value);
            }
            _ => {}
        }
        None
    }
}

fn finish(event: SseEvent) -> SseEvent {
    leak::assert_sse_data_clean(&event.data);
    event
}

/// One content block of an Anthropic stream, assembled from its deltas.
#[derive(Clone, Debug, Default)]
pub struct Block {
    /// `content_block` of `content_block_start`.
    pub start: Value,
    pub text: String,
    pub thinking: String,
    pub signature: String,
    pub partial_json: String,
}

impl Block {
    pub fn kind(&self) -> &str {
        self.start["type"].as_str().unwrap_or_default()
    }
}

/// An Anthropic message stream that followed the event grammar.
#[derive(Clone, Debug)]
pub struct MessageStream {
    /// `message` of `message_start`.
    pub message: Value,
    pub blocks: Vec<Block>,
    /// `delta` of `message_delta`.
    pub delta: Value,
    /// `usage` of `message_delta`.
    pub usage: Value,
    pub events: Vec<SseEvent>,
}

impl MessageStream {
    pub fn id(&self) -> &str {
        self.message["id"].as_str().unwrap_or_default()
    }

    /// Text of all text blocks.
    pub fn text(&self) -> String {
        self.blocks
            .iter()
            .filter(|b| b.kind() == "text")
            .map(|b| b.text.as_str())
            .collect()
    }

    pub fn credits(&self) -> u64 {
        self.usage["credits_consumed"]
            .as_u64()
            .unwrap_or_else(|| panic!("message_delta usage lacks credits_consumed: {}", self.usage))
    }
}

/// Checks the Anthropic stream grammar and assembles the message:
/// `message_start`, then per block `content_block_start(i)`, its deltas, `content_block_stop(i)`
/// with i = 0, 1, ..., then one `message_delta`, then `message_stop` as the last event; `ping`
/// anywhere in between. Every event's name equals its payload's `type`; delta kinds match
/// their block's kind.
pub fn assemble_message_stream(events: &[SseEvent]) -> MessageStream {
    let fail = |why: &str| -> ! { panic!("{why}; events: {events:#?}") };
    let mut message = None;
    let mut blocks: Vec<Block> = Vec::new();
    let mut open: Option<usize> = None;
    let mut delta = None;
    let mut usage = None;
    let mut stopped = false;
    for (i, event) in events.iter().enumerate() {
        let data = event.json();
        if data["type"] != event.name() {
            fail(&format!(
                "event {i} is named {:?} but its data has type {}",
                event.name(),
                data["type"]
            ));
        }
        if stopped {
            fail("event after message_stop");
        }
        if i == 0 && event.name() != "message_start" {
            fail("first event is not message_start");
        }
        match event.name() {
            "message_start" => {
                if message.is_some() {
                    fail("two message_start events");
                }
                message = Some(data["message"].clone());
            }
            "ping" => {}
            "content_block_start" => {
                if open.is_some() || delta.is_some() {
                    fail("content_block_start while a block is open or after message_delta");
                }
                if data["index"].as_u64() != Some(blocks.len() as u64) {
                    fail(&format!(
                        "content_block_start index {} expected {}",
                        data["index"],
                        blocks.len()
                    ));
                }
                open = Some(blocks.len());
                blocks.push(Block {
                    start: data["content_block"].clone(),
                    ..Block::default()
                });
            }
            "content_block_delta" => {
                let Some(index) = open else {
                    fail("content_block_delta outside a block")
                };
                if data["index"].as_u64() != Some(index as u64) {
                    fail("content_block_delta for a block that is not open");
                }
                let block = &mut blocks[index];
                let d = &data["delta"];
                let piece = |field: &str| {
                    d[field]
                        .as_str()
                        .unwrap_or_else(|| fail(&format!("delta lacks {field}")))
                };
                match (block.kind(), d["type"].as_str().unwrap_or_default()) {
                    ("text", "text_delta") => block.text.push_str(piece("text")),
                    ("thinking", "thinking_delta") => block.thinking.push_str(piece("thinking")),
                    ("thinking", "signature_delta") => block.signature.push_str(piece("signature")),
                    ("tool_use", "input_json_delta") => {
                        block.partial_json.push_str(piece("partial_json"))
                    }
                    (kind, delta_kind) => {
                        fail(&format!("delta {delta_kind:?} in a {kind:?} block"))
                    }
                }
            }
            "content_block_stop" => {
                if open.map(|i| i as u64) != data["index"].as_u64() {
                    fail("content_block_stop for a block that is not open");
                }
                open = None;
            }
            "message_delta" => {
                if open.is_some() || delta.is_some() {
                    fail("message_delta while a block is open, or twice");
                }
                delta = Some(data["delta"].clone());
                usage = Some(data["usage"].clone());
            }
            "message_stop" => {
                if delta.is_none() {
                    fail("message_stop before message_delta");
                }
                stopped = true;
            }
            other => fail(&format!("unexpected event {other:?}")),
        }
    }
    if !stopped {
        fail("stream did not end with message_stop");
    }
    if blocks.is_empty() {
        fail("stream has no content block");
    }
    MessageStream {
        message: message.unwrap_or_else(|| fail("no message_start")),
        blocks,
        delta: delta.unwrap_or_default(),
        usage: usage.unwrap_or_default(),
        events: events.to_vec(),
    }
}

/// A chat-completions stream that followed the OpenAI chunk grammar.
#[derive(Clone, Debug)]
pub struct ChatStream {
    pub id: String,
    pub model: String,
    pub content: String,
    pub finish_reason: Option<String>,
    /// `usage` of the usage chunk (only with `stream_options.include_usage`).
    pub usage: Option<Value>,
    /// Tool calls by index: (id, name, arguments assembled from the deltas).
    pub tool_calls: Vec<(String, String, String)>,
    pub chunks: Vec<Value>,
}

/// Checks the chat-completions stream grammar: unnamed `data:` events, each a
/// `chat.completion.chunk` with one shared `chatcmpl_` id and model, one `finish_reason`, an
/// optional usage chunk with empty `choices` after it, and `data: [DONE]` last.
pub fn assemble_chat_stream(events: &[SseEvent]) -> ChatStream {
    let fail = |why: &str| -> ! { panic!("{why}; events: {events:#?}") };
    let Some((last, chunks)) = events.split_last() else {
        fail("empty stream")
    };
    if last.data != "[DONE]" {
        fail("stream does not end with data: [DONE]");
    }
    let mut out = ChatStream {
        id: String::new(),
        model: String::new(),
        content: String::new(),
        finish_reason: None,
        usage: None,
        tool_calls: Vec::new(),
        chunks: Vec::new(),
    };
    for event in chunks {
        if event.name() != "message" {
            fail(&format!("chat chunk with an event name {:?}", event.name()));
        }
        let chunk = event.json();
        if chunk["object"] != "chat.completion.chunk" {
            fail("chunk object is not chat.completion.chunk");
        }
        let id = chunk["id"].as_str().unwrap_or_default();
        let model = chunk["model"].as_str().unwrap_or_default();
        if out.id.is_empty() {
            out.id = id.to_string();
            out.model = model.to_string();
            if !id.starts_with("chatcmpl_") {
                fail("chunk id does not start with chatcmpl_");
            }
        } else if id != out.id || model != out.model {
            fail("chunks disagree on id or model");
        }
        if out.usage.is_some() {
            fail("chunk after the usage chunk");
        }
        if !chunk["usage"].is_null() {
            if !chunk["choices"].as_array().is_some_and(|c| c.is_empty()) {
                fail("usage chunk with non-empty choices");
            }
            out.usage = Some(chunk["usage"].clone());
        }
        for choice in chunk["choices"].as_array().cloned().unwrap_or_default() {
            if out.finish_reason.is_some() {
                fail("choice delta after finish_reason");
            }
            let delta = &choice["delta"];
            if let Some(text) = delta["content"].as_str() {
                out.content.push_str(text);
            }
            for call in delta["tool_calls"].as_array().cloned().unwrap_or_default() {
                let index = call["index"]
                    .as_u64()
                    .unwrap_or_else(|| fail("tool call without index"))
                    as usize;
                if index == out.tool_calls.len() {
                    out.tool_calls.push(Default::default());
                } else if index > out.tool_calls.len() {
                    fail("tool call index skipped");
                }
                let entry = &mut out.tool_calls[index];
                if let Some(id) = call["id"].as_str() {
                    entry.0.push_str(id);
                }
                if let Some(name) = call["function"]["name"].as_str() {
                    entry.1.push_str(name);
                }
                if let Some(args) = call["function"]["arguments"].as_str() {
                    entry.2.push_str(args);
                }
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                out.finish_reason = Some(reason.to_string());
            }
        }
        out.chunks.push(chunk);
    }
    if out.finish_reason.is_none() {
        fail("no chunk carries a finish_reason");
    }
    out
}

/// A Responses API stream that followed the event lifecycle.
#[derive(Clone, Debug)]
pub struct ResponseStream {
    /// `response` of the terminal event (`response.completed`, `.incomplete` or `.failed`).
    pub response: Value,
    /// The terminal event's name.
    pub end: String,
    /// Output items as `response.output_item.done` gave them, by output index.
    pub items: Vec<Value>,
    /// `output_text` assembled from the deltas, over every message item.
    pub text: String,
    /// Function-call arguments assembled from the deltas, by output index.
    pub arguments: Vec<String>,
    /// Reasoning summary text assembled from the deltas.
    pub summary: String,
    /// The `error` event after `response.failed`, if any.
    pub error: Option<Value>,
    pub events: Vec<SseEvent>,
}

impl ResponseStream {
    pub fn names(&self) -> Vec<&str> {
        self.events.iter().map(|e| e.name()).collect()
    }
}

/// Checks the Responses API stream lifecycle and assembles the response: every event is named
/// after its `type` and numbered by `sequence_number` from 0 without gaps; `response.created`
/// then `response.in_progress` open it; each output item is added at the next output index,
/// receives its parts and deltas while open, and is closed by `response.output_item.done`
/// after its own `.done` events; one terminal event (`response.completed`, `.incomplete` or
/// `.failed`, the latter possibly followed by `error`) ends it, and its `response.output`
/// equals the items as they were closed.
pub fn assemble_response_stream(events: &[SseEvent]) -> ResponseStream {
    let fail = |why: &str| -> ! { panic!("{why}; events: {events:#?}") };
    #[derive(PartialEq)]
    enum State {
        Open,
        Done,
    }
    let mut items: Vec<(Value, State)> = Vec::new();
    let mut text = String::new();
    let mut arguments: Vec<String> = Vec::new();
    let mut summary = String::new();
    let mut end: Option<(String, Value)> = None;
    let mut error = None;
    let mut id = None;
    for (i, event) in events.iter().enumerate() {
        let data = event.json();
        if data["type"] != event.name() {
            fail(&format!(
                "event {i} named {:?} has type {}",
                event.name(),
                data["type"]
            ));
        }
        if data["sequence_number"].as_u64() != Some(i as u64) {
            fail(&format!(
                "event {i} has sequence_number {}",
                data["sequence_number"]
            ));
        }
        if error.is_some() {
            fail("event after error");
        }
        let expected_first = ["response.created", "response.in_progress"];
        if i < 2 && event.name() != expected_first[i] {
            fail(&format!("event {i} is not {}", expected_first[i]));
        }
        if end.is_some() && event.name() != "error" {
            fail("event after the terminal event");
        }
        let output_index = data["output_index"].as_u64().map(|n| n as usize);
        let open_item = |kind: &str| -> usize {
            let Some(index) = output_index else {
                fail(&format!("{} without output_index", event.name()))
            };
            match items.get(index) {
                Some((item, State::Open)) if item["type"] == kind => {
                    if data.get("item_id").is_some() && data["item_id"] != item["id"] {
                        fail("item_id does not match the open item");
                    }
                    index
                }
                _ => fail(&format!("{} for no open {kind} item", event.name())),
            }
        };
        match event.name() {
            "response.created" | "response.in_progress" => {
                let response = &data["response"];
                if response["status"] != "in_progress" || response["object"] != "response" {
                    fail("the opening events show an in-progress response");
                }
                match &id {
                    None => id = Some(response["id"].clone()),
                    Some(id) if *id != response["id"] => fail("the response id changed"),
                    Some(_) => {}
                }
            }
            "response.output_item.added" => {
                if output_index != Some(items.len()) {
                    fail("output_item.added not at the next output index");
                }
                if data["item"]["status"] != "in_progress" {
                    fail("an added item is in progress");
                }
                items.push((data["item"].clone(), State::Open));
                arguments.push(String::new());
            }
            "response.content_part.added" | "response.content_part.done" => {
                open_item("message");
            }
            "response.output_text.delta" => {
                open_item("message");
                text.push_str(data["delta"].as_str().unwrap_or_else(|| fail("delta")));
            }
            "response.output_text.done" => {
                open_item("message");
            }
            "response.function_call_arguments.delta" => {
                let index = open_item("function_call");
                arguments[index].push_str(data["delta"].as_str().unwrap_or_else(|| fail("delta")));
            }
            "response.function_call_arguments.done" => {
                let index = open_item("function_call");
                if data["arguments"].as_str() != Some(arguments[index].as_str())
                    && !(arguments[index].is_empty() && data["arguments"] == "{}")
                {
                    fail("function_call_arguments.done differs from the deltas");
                }
            }
            "response.reasoning_summary_part.added"
            | "response.reasoning_summary_text.done"
            | "response.reasoning_summary_part.done" => {
                open_item("reasoning");
            }
            "response.reasoning_summary_text.delta" => {
                open_item("reasoning");
                summary.push_str(data["delta"].as_str().unwrap_or_else(|| fail("delta")));
            }
            "response.output_item.done" => {
                let kind = data["item"]["type"].as_str().unwrap_or_default().to_owned();
                let index = open_item(&kind);
                if data["item"]["id"] != items[index].0["id"] {
                    fail("output_item.done changed the item id");
                }
                items[index] = (data["item"].clone(), State::Done);
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if event.name() != "response.failed" && items.iter().any(|(_, s)| *s == State::Open)
                {
                    fail("the response ended with an item still open");
                }
                end = Some((event.name().to_owned(), data["response"].clone()));
            }
            "error" => {
                if end
                    .as_ref()
                    .is_none_or(|(name, _)| name != "response.failed")
                {
                    fail("error without response.failed before it");
                }
                error = Some(data.clone());
            }
            other => fail(&format!("unexpected event {other:?}")),
        }
    }
    let Some((end, response)) = end else {
        fail("no terminal event")
    };
    let items: Vec<Value> = items.into_iter().map(|(item, _)| item).collect();
    if end != "response.failed" && response["output"].as_array() != Some(&items) {
        fail("the terminal response's output differs from the items as they were closed");
    }
    ResponseStream {
        response,
        end,
        items,
        text,
        arguments,
        summary,
        error,
        events: events.to_vec(),
    }
}
