//! A fully read HTTP response and the checks every test makes on it.

use std::fmt;

use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::leak;

/// Status, headers and body of one response. Reading it checks the body and the header values
/// for provider names.
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
}

impl Resp {
    pub async fn read(response: reqwest::Response) -> Resp {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response
            .text()
            .await
            .unwrap_or_else(|e| panic!("reading a {status} body failed: {e}"));
        Resp::checked(status, headers, text)
    }

    /// A response read some other way (the router tests call the router in process), with
    /// the same provider-name checks as [`read`](Self::read).
    pub fn checked(status: u16, headers: HeaderMap, text: String) -> Resp {
        let resp = Resp {
            status,
            headers,
            text,
        };
        leak::assert_headers_clean(&resp.headers);
        match serde_json::from_str::<Value>(&resp.text) {
            Ok(json) => leak::assert_no_provider_names(&json),
            Err(_) => leak::assert_text_clean(&resp.text),
        }
        resp
    }

    /// Reads a response without the provider-name check (the admin API is internal and shows
    /// providers on purpose).
    pub async fn read_unchecked(response: reqwest::Response) -> Resp {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response
            .text()
            .await
            .unwrap_or_else(|e| panic!("reading a {status} body failed: {e}"));
        Resp {
            status,
            headers,
            text,
        }
    }

    /// The body as JSON; panics with the body when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {self}"))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header value").to_string())
    }

    /// An integer header; panics when it is missing or not a number.
    pub fn header_u64(&self, name: &str) -> u64 {
        let value = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header on {self}"));
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} header is not an integer: {value:?}"))
    }

    /// Panics (with the body) unless the status is `status`.
    pub fn expect_status(&self, status: u16) -> &Resp {
        assert_eq!(self.status, status, "unexpected status: {self}");
        self
    }

    /// Expects 200 and returns the JSON body.
    pub fn expect_ok(&self) -> Value {
        self.expect_status(200);
        self.json()
    }

    /// Expects `status` with the spec's error envelope
    /// `{"type":"error","error":{"type":error_type,"message":..}}`; returns the message.
    pub fn expect_error(&self, status: u16, error_type: &str) -> String {
        assert_eq!(self.status, status, "unexpected status: {self}");
        let message = assert_envelope(&self.text);
        let body = self.json();
        assert_eq!(
            body["error"]["type"], error_type,
            "wrong error.type: {self}"
        );
        message
    }

    /// Expects a 400 `invalid_request_error` whose message names one of `fields` as a whole
    /// word (`token` is not named by `max_tokens`).
    pub fn expect_invalid(&self, fields: &[&str]) -> String {
        let message = self.expect_error(400, "invalid_request_error");
        assert!(
            fields.iter().any(|f| names_word(&message, f)),
            "400 message does not name {fields:?}: {message:?}"
        );
        message
    }

    /// Expects a 400 `invalid_request_error` about the field at `path` (as the gateway writes
    /// it: `messages[1].role`, `thinking.budget_tokens`): the message starts with `path: ` or
    /// with a place inside it (`path[0]: `, `path.x: `), or says the field at `path` is missing
    /// (`missing field `path``, `messages[0]: missing field `role``).
    pub fn expect_invalid_field(&self, path: &str) -> String {
        let message = self.expect_error(400, "invalid_request_error");
        let missing = |text: &str| {
            text.strip_prefix("missing field `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(field, _)| field.to_string())
        };
        let named = match (missing(&message), message.split_once(": ")) {
            (Some(field), _) => field,
            (None, Some((at, rest))) => match missing(rest) {
                Some(field) => format!("{at}.{field}"),
                None => at.to_string(),
            },
            (None, None) => String::new(),
        };
        let inside = named == path
            || named
                .strip_prefix(path)
                .is_some_and(|rest| rest.starts_with('[') || rest.starts_with('.'));
        assert!(inside, "400 message is not about `{path}`: {message:?}");
        message
    }

    /// Expects a 429 `rate_limit_error` whose message names `dimension` ("requests per minute",
    /// "input tokens", "concurrent streams") and a delay in seconds, with `Retry-After` in
    /// 1..=60 and every rate-limit header; returns `Retry-After`.
    pub fn expect_rate_limited(&self, dimension: &str) -> u64 {
        let msg = self.expect_error(429, "rate_limit_error");
        assert!(
            msg.contains(dimension),
            "429 message does not name {dimension:?}: {msg}"
        );
        assert!(
            crate::mentions_seconds(&msg),
            "429 message names no delay in seconds: {msg}"
        );
        let retry_after = self.retry_after();
        assert!(
            (1..=60).contains(&retry_after),
            "Retry-After {retry_after} not in 1..=60 on {self}"
        );
        self.rate_limit();
        retry_after
    }

    /// The X-RateLimit-* headers; panics when one is missing.
    pub fn rate_limit(&self) -> RateLimit {
        RateLimit::from_headers(&self.headers).unwrap_or_else(|e| panic!("{e} on {self}"))
    }

    /// The spec's four X-RateLimit-* headers (tier and request window), which answers without
    /// a valid key carry too; panics when one is missing.
    pub fn request_limit(&self) -> RequestLimit {
        RequestLimit::from_headers(&self.headers).unwrap_or_else(|e| panic!("{e} on {self}"))
    }

    /// `Retry-After` in seconds; panics when missing.
    pub fn retry_after(&self) -> u64 {
        self.header_u64("retry-after")
    }
}

impl fmt::Display for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 2000;
        let mut body = self.text.as_str();
        if body.len() > MAX {
            let mut cut = MAX;
            while !body.is_char_boundary(cut) {
                cut -= 1;
            }
            body = &body[..cut];
        }
        write!(f, "HTTP {} {}", self.status, body)
    }
}

/// Whether `word` occurs in `text` with no identifier character (letter, digit, `_`) on
/// either side.
fn names_word(text: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// Checks `text` is exactly the error envelope (no other top-level fields than `type` and
/// `error`; `error.type` and `error.message` non-empty strings) and returns the message.
pub fn assert_envelope(text: &str) -> String {
    let body: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {text:?}"));
    assert_eq!(
        body["type"], "error",
        "envelope type is not \"error\": {body}"
    );
    let object = body.as_object().expect("envelope is an object");
    assert!(
        object
            .keys()
            .all(|k| k == "type" || k == "error" || k == "request_id"),
        "unexpected top-level fields in the envelope: {body}"
    );
    let error_type = body["error"]["type"].as_str().unwrap_or_default();
    assert!(!error_type.is_empty(), "error.type missing: {body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("error.message missing: {body}"));
    assert!(!message.is_empty(), "error.message empty: {body}");
    message.to_string()
}

/// The spec's rate-limit headers of one response: the tier and its request window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLimit {
    pub tier: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset: u64,
}

impl RequestLimit {
    pub fn from_headers(headers: &HeaderMap) -> Result<RequestLimit, String> {
        let all = RateLimit::read(headers);
        Ok(RequestLimit {
            tier: all.text("x-ratelimit-tier")?,
            limit: all.number("x-ratelimit-limit-requests")?,
            remaining: all.number("x-ratelimit-remaining-requests")?,
            reset: all.number("x-ratelimit-reset-requests")?,
        })
    }
}

/// Reads X-RateLimit-* headers, naming the one missing or malformed.
struct HeaderReader<'a>(&'a HeaderMap);

impl HeaderReader<'_> {
    fn text(&self, name: &str) -> Result<String, String> {
        self.0
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .ok_or_else(|| format!("no {name} header"))
    }

    fn number(&self, name: &str) -> Result<u64, String> {
        let value = self.text(name)?;
        value
            .parse()
            .map_err(|_| format!("{name} is not an integer: {value:?}"))
    }
}

/// The rate-limit headers of one response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub tier: String,
    pub limit_requests: u64,
    pub remaining_requests: u64,
    pub reset_requests: u64,
    pub limit_tokens: u64,
    pub remaining_tokens: u64,
    pub reset_tokens: u64,
    pub limit_streams: u64,
    pub remaining_streams: u64,
}

impl RateLimit {
    /// Reads the nine X-RateLimit-* headers of the contract; names the first one missing.
    fn read(headers: &HeaderMap) -> HeaderReader<'_> {
        HeaderReader(headers)
    }

    pub fn from_headers(headers: &HeaderMap) -> Result<RateLimit, String> {
        let all = Self::read(headers);
        let text = |name: &str| all.text(name);
        let number = |name: &str| all.number(name);
        Ok(RateLimit {
            tier: text("x-ratelimit-tier")?,
            limit_requests: number("x-ratelimit-limit-requests")?,
            remaining_requests: number("x-ratelimit-remaining-requests")?,
            reset_requests: number("x-ratelimit-reset-requests")?,
            limit_tokens: number("x-ratelimit-limit-tokens")?,
            remaining_tokens: number("x-ratelimit-remaining-tokens")?,
            reset_tokens: number("x-ratelimit-reset-tokens")?,
            limit_streams: number("x-ratelimit-limit-streams")?,
            remaining_streams: number("x-ratelimit-remaining-streams")?,
        })
    }
}
