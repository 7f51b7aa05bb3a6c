//! Ids and secrets: a type prefix and random base62, like the public APIs' ids.

use rand::distr::{Alphanumeric, SampleString};

fn random(len: usize) -> String {
    Alphanumeric.sample_string(&mut rand::rng(), len)
}

pub fn message() -> String {
    format!("msg_{}", random(24))
}

pub fn chat_completion() -> String {
    format!("chatcmpl_{}", random(24))
}

pub fn tool_use() -> String {
    format!("toolu_{}", random(24))
}

pub fn account() -> String {
    format!("acct_{}", random(16))
}

pub fn key() -> String {
    format!("key_{}", random(16))
}

/// A new API key secret: 40 random base62 characters, about 238 bits.
pub fn key_secret() -> String {
    format!("sk-svc-{}", random(40))
}

pub fn admin_token() -> String {
    random(32)
}

/// A gateway process, as recorded on the reservations it holds.
pub fn instance() -> String {
    format!("gw_{}", random(16))
}

/// Credits a gateway process holds for one account's turns.
pub fn allotment() -> String {
    format!("allot_{}", random(16))
}

pub fn lease() -> String {
    random(16)
}

/// The `request-id` of an answer that created no message.
pub fn request() -> String {
    format!("req_{}", random(24))
}

pub fn user() -> String {
    format!("user_{}", random(16))
}

/// Length of a session or CSRF token: 32 random base62 characters, about 190 bits.
pub const SESSION_TOKEN_CHARS: usize = 32;

pub fn session_token() -> String {
    random(SESSION_TOKEN_CHARS)
}

pub fn payment_reference() -> String {
    format!("pay_{}", random(20))
}

pub fn response() -> String {
    format!("resp_{}", random(24))
}

/// The id of a Responses API item, prefixed by its type as the public API does.
pub fn response_item(kind: &str) -> String {
    let prefix = match kind {
        "message" => "msg",
        "function_call" => "fc",
        "function_call_output" => "fco",
        "reasoning" => "rs",
        "custom_tool_call" => "ctc",
        _ => "item",
    };
    format!("{prefix}_{}", random(24))
}
