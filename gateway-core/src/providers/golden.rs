//! Golden translations: every client request in `tests/golden/requests/<format>/` (Messages,
//! Chat Completions, Responses; Claude Code's and Codex's own requests among them) is
//! translated into the canonical request and from it into each upstream's body, and every
//! upstream stream in `tests/golden/streams/<provider>/` is decoded into the canonical events;
//! each result is a reviewed snapshot in `tests/golden/snapshots/`. A change to one rule shows
//! as a diff in exactly the snapshots it touches (`cargo insta review` to accept one).
//!
//! A fixture the translation refuses is snapshotted as its refusal.

#![cfg(test)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use super::http::{Decoder, SseEvent};
use super::{anthropic, bedrock, gemini, openai, vertex, ProviderCall, ProviderEvent};
use crate::conversation::Request;
use crate::seal::Sealer;
use crate::tokens::Tokenizer;
use crate::wire::anthropic::translate::request_from_messages;
use crate::wire::anthropic::MessagesRequest;
use crate::wire::gemini::translate::request_to_gemini;
use crate::wire::openai::translate::request_from_chat;
use crate::wire::responses::translate::{labeled_input, translate};
use crate::wire::responses::ResponsesRequest;
use crds::config::Upstream;

const CLIENT_FORMATS: [&str; 3] = ["messages", "chat", "responses"];
const UPSTREAMS: [&str; 5] = ["anthropic", "openai", "bedrock", "gemini", "vertex"];
/// The upstreams with a stream decoder of their own: Vertex streams the Messages API's events,
/// which the anthropic decoder reads.
const DECODERS: [&str; 4] = ["anthropic", "openai", "bedrock", "gemini"];

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The fixtures of one folder, by name, sorted; Codex's recorded requests join the
/// Responses fixtures from where its end-to-end test keeps them.
fn fixtures(folder: &Path, extension: &str) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .map(|path| {
            let name = path.file_stem().expect("a file name").to_string_lossy();
            (name.into_owned(), path)
        })
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no fixtures in {}", folder.display());
    found
}

fn codex_requests() -> Vec<(String, PathBuf)> {
    let codex = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/codex");
    fixtures(&codex, "json")
        .into_iter()
        .map(|(name, path)| (format!("codex_{}", name.replace('-', "_")), path))
        .collect()
}

/// A fixture's request body: the file itself, or its `body` where the file is a recorded
/// HTTP request (`method`, `path`, `headers`, `body`), as Codex's are.
fn read_body(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut value: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let recorded = value.get("method").is_some();
    match value.get_mut("body") {
        Some(body) if recorded => body.take(),
        _ => value,
    }
}

/// What the turn sends as `max_tokens` when the client left it open: the served model's
/// most output (affordability and the window can only lower it; neither binds here).
const OPEN_MAX_TOKENS: u32 = 8_192;

/// The canonical request of one client body, or the refusal's message.
fn canonical(format: &str, body: Value) -> Result<Request, String> {
    let unreadable = |e: serde_json::Error| format!("unreadable: {e}");
    let (mut request, open_max_tokens) = match format {
        "messages" => {
            let messages: MessagesRequest = serde_json::from_value(body).map_err(unreadable)?;
            (request_from_messages(messages), false)
        }
        "chat" => {
            let chat = serde_json::from_value(body).map_err(unreadable)?;
            request_from_chat(chat).map_err(|e| e.to_string())?
        }
        "responses" => {
            let req: ResponsesRequest = serde_json::from_value(body).map_err(unreadable)?;
            let translated = translate(&req, labeled_input(&req), true, &Sealer::new(None))
                .map_err(|e| e.to_string())?;
            (translated.request, translated.open_max_tokens)
        }
        other => unreachable!("no client format {other}"),
    };
    if open_max_tokens {
        request.max_tokens = OPEN_MAX_TOKENS;
    }
    Ok(request)
}

fn call(provider: &str, request: Request) -> ProviderCall {
    let model = match provider {
        "anthropic" => "claude-opus-4-1",
        "openai" => "gpt-5",
        "gemini" => "gemini-2.5-pro",
        "vertex" => "claude-opus-4-1@20250805",
        _ => "anthropic.claude-opus-4-1-v1:0",
    };
    let region = match provider {
        "bedrock" => Some("us-east-1"),
        "vertex" => Some("us-east5"),
        _ => None,
    };
    let upstream: Upstream = serde_json::from_value(json!({
        "name": format!("golden-{provider}"),
        "provider": provider,
        "model": model,
        "baseUrl": null,
        "region": region,
        "project": (provider == "vertex").then_some("golden-project"),
        "apiKey": null,
        "weight": 1,
        "timeouts": {"connectMs": 5000, "firstByteMs": 60000, "idleMs": 60000},
        "chunkDelayMs": 0,
    }))
    .expect("an upstream");
    ProviderCall {
        request: Arc::new(request),
        anthropic_beta: None,
        upstream,
        served_model: "svc/opus".to_owned(),
        input_tokens: 100,
    }
}

/// The body `provider`'s adapter sends for `call`, as JSON.
fn upstream_body(provider: &str, call: &ProviderCall) -> Value {
    let value = match provider {
        "anthropic" => serde_json::to_value(anthropic::body(call)),
        "openai" => serde_json::to_value(openai::body(call)),
        "bedrock" => serde_json::from_slice(&bedrock::body(call).expect("a Bedrock body")),
        "vertex" => serde_json::from_slice(&vertex::body(call).expect("a Vertex body")),
        "gemini" => match request_to_gemini(&call.request) {
            Ok(body) => serde_json::to_value(body),
            Err(refused) => Ok(json!({ "refused": refused.0 })),
        },
        other => unreachable!("no upstream {other}"),
    };
    value.expect("an upstream body is JSON")
}

fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(golden().join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings
}

#[test]
fn every_client_request_translates_to_each_upstreams_body_as_reviewed() {
    let mut translated = 0;
    for format in CLIENT_FORMATS {
        let mut requests = fixtures(&golden().join("requests").join(format), "json");
        if format == "responses" {
            requests.extend(codex_requests());
        }
        for (name, path) in requests {
            let canonical = canonical(format, read_body(&path));
            for provider in UPSTREAMS {
                let snapshot = format!("request__{format}__{name}__to_{provider}");
                let body = match &canonical {
                    Ok(request) => upstream_body(provider, &call(provider, request.clone())),
                    Err(refusal) => json!({ "refused": refusal }),
                };
                settings().bind(|| insta::assert_json_snapshot!(snapshot, body));
                translated += 1;
            }
        }
    }
    // Three formats, at least three fixtures each, five upstreams.
    assert!(translated >= 45, "only {translated} translations checked");
}

/// The `data:` of each server-sent event in `text`.
fn sse_events(text: &str) -> Vec<SseEvent> {
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .collect();
            (!data.is_empty()).then(|| SseEvent {
                data: Bytes::from(data.join("\n")),
            })
        })
        .collect()
}

/// `text` with each id the gateway generated (`toolu_` and 24 random characters, for a call an
/// upstream left unnamed) written as `toolu_GENERATED`, so a snapshot is the same every run.
fn generated_ids_named(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("toolu_") {
        out.push_str(&rest[..at + "toolu_".len()]);
        rest = &rest[at + "toolu_".len()..];
        let id_len = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        // The gateway's ids are 24 characters; an upstream's own (`toolu_01`) stays.
        if id_len >= 20 {
            out.push_str("GENERATED");
            rest = &rest[id_len..];
        }
    }
    out.push_str(rest);
    out
}

/// The canonical events of one upstream stream, or where its decoder refused it.
fn decode(mut decoder: impl Decoder, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |result: Result<Vec<ProviderEvent>, super::ProviderError>| match result {
        Ok(events) => out.extend(
            events
                .iter()
                .map(|e| generated_ids_named(&format!("{e:?}"))),
        ),
        Err(e) => out.push(format!("refused: {e:?}")),
    };
    for event in sse_events(text) {
        push(decoder.event(event));
    }
    push(decoder.end());
    out
}

#[test]
fn every_upstream_stream_decodes_to_the_canonical_events_as_reviewed() {
    let mut decoded = 0;
    for provider in DECODERS {
        for (name, path) in fixtures(&golden().join("streams").join(provider), "sse") {
            let text = std::fs::read_to_string(&path).expect("a stream fixture");
            let events = match provider {
                "anthropic" => decode(anthropic::Stream::default(), &text),
                "openai" => decode(openai::Stream::new(Tokenizer::default(), 100), &text),
                "gemini" => decode(gemini::Stream::new(Tokenizer::default(), 100), &text),
                _ => decode(bedrock::Stream::default(), &text),
            };
            assert!(!events.is_empty(), "{name}: no events");
            let snapshot = format!("stream__{provider}__{name}");
            settings().bind(|| insta::assert_debug_snapshot!(snapshot, events));
            decoded += 1;
        }
    }
    assert!(decoded >= 8, "only {decoded} streams checked");
}
