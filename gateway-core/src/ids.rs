//! Ids and secrets: a type prefix and random base62, like the public APIs' ids. The ids the
//! stores mint (accounts, instances, allotments) are `store::ids`. A turn's id (a message, a
//! chat completion, a response) carries the microsecond it started, its ledger row's
//! `created_at` ([`message_id`]): the ledger is partitioned by day, and the id tells which.

use store::ids::random;
pub use store::ledger::message_id;
use time::OffsetDateTime;

pub fn message() -> String {
    message_id::mint("msg", OffsetDateTime::now_utc())
}

pub fn chat_completion() -> String {
    message_id::mint("chatcmpl", OffsetDateTime::now_utc())
}

/// An embeddings call's id: its ledger row's (the client never sees it: OpenAI's answer has
/// no id).
pub fn embedding() -> String {
    message_id::mint("emb", OffsetDateTime::now_utc())
}

pub fn tool_use() -> String {
    format!("toolu_{}", random(24))
}

/// A tool call's id as OpenAI-format clients see it (`call_…`), whatever the upstream minted:
/// `toolu_X` becomes `call_X`, an id already `call_…` is kept, any other is prefixed. The
/// client sends it back in its assistant turn and its tool result alike, so the pair still
/// matches when forwarded (adapters make any id safe for their upstream: [`tool_call_for_upstream`]).
pub fn openai_call(id: &str) -> String {
    if id.starts_with("call_") {
        return id.to_owned();
    }
    let rest = id.strip_prefix("toolu_").unwrap_or(id);
    format!("call_{rest}")
}

/// The longest tool call id OpenAI's API takes.
const MAX_TOOL_CALL_ID: usize = 40;

/// A tool call id an upstream accepts, from whatever id a client sent back: ids of letters,
/// digits, `_` and `-` up to 40 characters (what the Messages API's pattern and OpenAI's
/// length limit allow) pass unchanged; any other becomes `prefix` + a hash of it, the same
/// for the call and its result, so the upstream still sees them match.
pub fn tool_call_for_upstream<'a>(id: &'a str, prefix: &str) -> std::borrow::Cow<'a, str> {
    let safe = !id.is_empty()
        && id.len() <= MAX_TOOL_CALL_ID
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if safe {
        return std::borrow::Cow::Borrowed(id);
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(id.as_bytes());
    std::borrow::Cow::Owned(format!("{prefix}{}", &hex::encode(digest)[..24]))
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

/// A stream slot's id in the shared limiter.
pub fn stream_slot() -> String {
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
    message_id::mint("resp", OffsetDateTime::now_utc())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_clients_see_call_ids_whatever_the_upstream_minted() {
        assert_eq!(openai_call("toolu_01AbC"), "call_01AbC");
        assert_eq!(openai_call("call_xyz"), "call_xyz");
        assert_eq!(
            openai_call("functions.get_weather:0"),
            "call_functions.get_weather:0"
        );
    }

    #[test]
    fn a_tool_call_id_an_upstream_would_refuse_becomes_the_same_safe_id_each_time() {
        assert_eq!(tool_call_for_upstream("call_abc-1", "toolu_"), "call_abc-1");
        let odd = tool_call_for_upstream("functions.get_weather:0", "toolu_");
        assert!(odd.starts_with("toolu_") && odd.len() == 30, "{odd}");
        assert_eq!(
            odd,
            tool_call_for_upstream("functions.get_weather:0", "toolu_")
        );
        let long = "x".repeat(41);
        assert_ne!(tool_call_for_upstream(&long, "call_"), long.as_str());
    }
}
