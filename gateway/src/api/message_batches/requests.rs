//! A Message Batch create's body, parsed as it arrives: `{"requests": [{"custom_id",
//! "params"}, …]}` is followed by a push parser ([`actson`]), and each request is handed to
//! the create once its last byte is in ([`Requests::feed`]), to be checked and written while
//! the rest is still coming. So a create holds one request (and what it has not yet written)
//! instead of its whole body: 100,000 requests need no more memory budget than their largest
//! one and the `custom_id`s seen ([`BYTES_PER_SEEN_ID`]).
//!
//! Why `actson`: it is fed bytes as they come and never blocks, so the body stays an async
//! stream read on the request's own task, under its deadline; a blocking reader (`struson`,
//! serde_json's `StreamDeserializer`) needs a thread per create bridged to the stream, and
//! serde_json streams only a sequence of top-level values, not the elements of an array inside
//! an object. Each request, once whole, is parsed by serde_json as every body is, so its
//! errors read as before (`requests[3].params: field required`).

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::ops::Range;

use actson::feeder::PushJsonFeeder;
use actson::{JsonEvent, JsonParser};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::errored;
use crate::edge::body::{from_value, parse};
use crate::error::ApiError;
use gateway_core::turn::{self, Turns};
use gateway_core::wire::anthropic::translate::request_from_messages;
use gateway_core::wire::anthropic::MessagesRequest;
use store::batches::NewItem;

/// The longest `custom_id` (Anthropic's limit).
const MAX_CUSTOM_ID: usize = 64;
/// What each `custom_id` seen holds until the batch is stored (its 128-bit hash in a hash set,
/// whose table may be twice the entries), so that a later request reusing one is refused.
pub const BYTES_PER_SEEN_ID: usize = 40;
/// What each item held until it is written holds beside its strings.
pub const BYTES_PER_ITEM: usize = 128;

/// One request of the body, its bytes as sent, and its place among the requests.
pub struct RawRequest {
    pub index: usize,
    pub bytes: Vec<u8>,
}

/// Where the parser is in the body's outline.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Before the body's object.
    Start,
    /// In the body's object, outside `requests`.
    Body,
    /// The value of the body's `requests` comes next.
    RequestsNext,
    /// In the `requests` array, between requests.
    Requests,
    /// After the `requests` array.
    After,
}

/// The body's parser: fed its pieces as they arrive, it hands back each request once whole.
pub struct Requests {
    parser: JsonParser<PushJsonFeeder>,
    place: Place,
    /// Containers open, the body's object included.
    depth: usize,
    /// The bytes fed from `window_at` on: from the start of the request being read, if any.
    window: Vec<u8>,
    window_at: usize,
    /// Where the request being read starts in the body.
    request_at: Option<usize>,
    /// Requests begun so far.
    count: usize,
    max: usize,
    seen_requests: bool,
}

impl Requests {
    /// A body of at most `max` requests.
    pub fn new(max: usize) -> Self {
        Self {
            parser: JsonParser::new(PushJsonFeeder::new()),
            place: Place::Start,
            depth: 0,
            window: Vec::new(),
            window_at: 0,
            request_at: None,
            count: 0,
            max,
            seen_requests: false,
        }
    }

    /// The body's bytes held: those of the request being read.
    pub fn held(&self) -> usize {
        self.window.len()
    }

    /// Parses the next piece of the body; the requests it completed go to `out`. 400 as soon as
    /// the body cannot be a batch.
    pub fn feed(&mut self, mut piece: &[u8], out: &mut Vec<RawRequest>) -> Result<(), ApiError> {
        while !piece.is_empty() {
            let n = self.parser.feeder.push_bytes(piece);
            self.window.extend_from_slice(&piece[..n]);
            piece = &piece[n..];
            self.events(out)?;
        }
        Ok(())
    }

    /// The body has ended: 400 unless it was a whole batch of at least one request.
    pub fn finish(&mut self, out: &mut Vec<RawRequest>) -> Result<(), ApiError> {
        self.parser.feeder.done();
        self.events(out)?;
        if !self.seen_requests {
            return Err(ApiError::invalid("requests: field required"));
        }
        if self.count == 0 {
            return Err(self.count_refused("not 0"));
        }
        Ok(())
    }

    fn count_refused(&self, not: &str) -> ApiError {
        ApiError::invalid(format!(
            "requests: a batch holds 1 to {} requests, {not}",
            self.max
        ))
    }

    /// Takes the parser's events until it needs more input (or the body has ended).
    fn events(&mut self, out: &mut Vec<RawRequest>) -> Result<(), ApiError> {
        loop {
            let event = match self.parser.next_event() {
                Ok(Some(JsonEvent::NeedMoreInput)) | Ok(None) => break,
                Ok(Some(event)) => event,
                Err(e) => {
                    return Err(ApiError::invalid(format!(
                        "invalid JSON body: {e} at byte {}",
                        self.parser.parsed_bytes()
                    )))
                }
            };
            self.event(event, out)?;
        }
        // Everything fed is parsed: the bytes before the request being read are dropped.
        let parsed = self.parser.parsed_bytes();
        let keep_from = self.request_at.unwrap_or(parsed);
        let drop = keep_from
            .saturating_sub(self.window_at)
            .min(self.window.len());
        self.window.drain(..drop);
        self.window_at += drop;
        Ok(())
    }

    fn event(&mut self, event: JsonEvent, out: &mut Vec<RawRequest>) -> Result<(), ApiError> {
        let opens = matches!(event, JsonEvent::StartObject | JsonEvent::StartArray);
        let closes = matches!(event, JsonEvent::EndObject | JsonEvent::EndArray);
        // Within a request: only its end matters here; serde_json parses it once whole.
        if self.request_at.is_some() {
            if opens {
                self.depth += 1;
            } else if closes {
                self.depth -= 1;
                if self.depth == 2 {
                    self.request_done(out);
                }
            }
            return Ok(());
        }
        match (self.place, event) {
            (Place::Start, JsonEvent::StartObject) => self.place = Place::Body,
            (Place::Start, _) => {
                return Err(ApiError::invalid(
                    "the body must be a JSON object: {\"requests\": [...]}",
                ))
            }
            (Place::Body | Place::After, JsonEvent::FieldName)
                if self.depth == 1 && self.parser.current_str().ok() == Some("requests") =>
            {
                if self.seen_requests {
                    return Err(ApiError::invalid("requests: duplicate field"));
                }
                self.seen_requests = true;
                self.place = Place::RequestsNext;
            }
            (Place::RequestsNext, JsonEvent::StartArray) => self.place = Place::Requests,
            (Place::RequestsNext, _) => {
                return Err(ApiError::invalid(
                    "requests: expected an array of {\"custom_id\", \"params\"} objects",
                ))
            }
            (Place::Requests, JsonEvent::StartObject) => {
                self.count += 1;
                if self.count > self.max {
                    return Err(self.count_refused("not more"));
                }
                // The `{` was the last byte parsed.
                self.request_at = Some(self.parser.parsed_bytes().saturating_sub(1));
            }
            (Place::Requests, JsonEvent::EndArray) => self.place = Place::After,
            (Place::Requests, _) => {
                return Err(ApiError::invalid(format!(
                    "requests[{}]: expected an object with custom_id and params",
                    self.count
                )))
            }
            // Other fields of the body are ignored, as a parsed body's are.
            _ => {}
        }
        if opens {
            self.depth += 1;
        } else if closes {
            self.depth = self.depth.saturating_sub(1);
        }
        Ok(())
    }

    /// The request being read has ended with the last byte parsed.
    fn request_done(&mut self, out: &mut Vec<RawRequest>) {
        let Some(start) = self.request_at.take() else {
            return;
        };
        let end = self.parser.parsed_bytes();
        let from = start.saturating_sub(self.window_at).min(self.window.len());
        let to = end.saturating_sub(self.window_at).min(self.window.len());
        out.push(RawRequest {
            index: self.count - 1,
            bytes: self.window[from..to].to_vec(),
        });
    }
}

#[derive(Deserialize)]
struct Request<'a> {
    custom_id: String,
    #[serde(borrow)]
    params: &'a RawValue,
}

/// The `custom_id`s seen: each request's must be new, otherwise nobody could match the results
/// to them, so the whole batch is refused. Each is kept as a 128-bit hash (two SipHashes of
/// random keys, new for each create) rather than its text, a third of the memory: two ids of
/// one batch share a hash with a chance of about 10^-29 at 100,000 requests.
#[derive(Default)]
pub struct SeenIds {
    ids: HashSet<u128>,
    keys: (RandomState, RandomState),
}

impl SeenIds {
    /// What the ids seen hold.
    pub fn cost(&self) -> usize {
        self.ids.len() * BYTES_PER_SEEN_ID
    }

    /// Whether `id` is new (then it is seen from now on).
    fn insert(&mut self, id: &str) -> bool {
        let high = self.keys.0.hash_one(id);
        let low = self.keys.1.hash_one(id);
        self.ids.insert((u128::from(high) << 64) | u128::from(low))
    }
}

/// One request's fields: 400 naming it when it is not `{"custom_id", "params"}` with a new
/// `custom_id` of 1 to 64 letters, digits, `_` and `-` (the whole batch is refused).
/// Returns its `custom_id` and where its params are in its bytes.
pub fn fields(
    seen: &mut SeenIds,
    request: &RawRequest,
) -> Result<(String, Range<usize>), ApiError> {
    let i = request.index;
    let parsed: Request<'_> = parse(&request.bytes).map_err(|e| {
        let message = match e.message.strip_prefix("invalid JSON body: ") {
            Some(rest) => format!("invalid JSON body: requests[{i}]: {rest}"),
            None => format!("requests[{i}].{}", e.message),
        };
        ApiError::invalid(message)
    })?;
    let id = &parsed.custom_id;
    let valid = (1..=MAX_CUSTOM_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(ApiError::invalid(format!(
            "requests[{i}].custom_id: 1 to {MAX_CUSTOM_ID} letters, digits, `_` or `-`"
        )));
    }
    if !seen.insert(id) {
        return Err(ApiError::invalid(format!(
            "requests[{i}].custom_id: `{id}` is used by another request of the batch"
        )));
    }
    let params = parsed.params.get().as_bytes();
    // The raw value borrows from the request's bytes: its place there is its address's offset.
    let at = (params.as_ptr() as usize).saturating_sub(request.bytes.as_ptr() as usize);
    Ok((parsed.custom_id, at..at + params.len()))
}

/// The item of a request whose params are `params`: checked as `/v1/messages` checks a body,
/// queued when it would take it, else ended with the `errored` result of the envelope it
/// would answer.
pub fn item(turns: &Turns, custom_id: String, params: &[u8]) -> NewItem {
    let (params, refused) = match serde_json::from_slice::<Value>(params) {
        Ok(value) => {
            let text = value.to_string();
            let checked = from_value::<MessagesRequest>(value)
                .and_then(|r| Ok(turn::check(turns, &request_from_messages(r))?));
            (text, checked.err())
        }
        // Not reached: serde_json found `params` a JSON value.
        Err(e) => (
            String::from_utf8_lossy(params).into_owned(),
            Some(ApiError::invalid(format!("invalid JSON body: {e}"))),
        ),
    };
    NewItem {
        custom_id,
        params,
        refused: refused.map(|e| errored(&e)),
        line: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The requests of `body` fed in pieces of `piece` bytes.
    fn requests(body: &[u8], piece: usize, max: usize) -> Result<Vec<String>, String> {
        let mut reader = Requests::new(max);
        let mut out = Vec::new();
        for part in body.chunks(piece) {
            reader.feed(part, &mut out).map_err(|e| e.message)?;
        }
        reader.finish(&mut out).map_err(|e| e.message)?;
        Ok(out
            .into_iter()
            .enumerate()
            .map(|(n, r)| {
                assert_eq!(r.index, n);
                String::from_utf8(r.bytes).expect("utf-8")
            })
            .collect())
    }

    #[test]
    fn each_request_is_handed_back_whole_however_the_body_is_cut() {
        let body = br#"{"other": {"requests": 1}, "requests": [{"custom_id": "a", "params": {"x": [1, "}"]}},
            {"params": "text", "custom_id": "b"}], "tail": [1]}"#;
        for piece in [1, 2, 7, 1000] {
            assert_eq!(
                requests(body, piece, 10).expect("a valid body"),
                [
                    r#"{"custom_id": "a", "params": {"x": [1, "}"]}}"#,
                    r#"{"params": "text", "custom_id": "b"}"#
                ],
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn only_the_request_being_read_is_held() {
        let mut reader = Requests::new(10);
        let mut out = Vec::new();
        reader
            .feed(
                br#"{"requests": [{"custom_id": "a", "params": {}}, {"cus"#,
                &mut out,
            )
            .expect("valid so far");
        assert_eq!(out.len(), 1);
        assert_eq!(reader.held(), br#"{"cus"#.len());
    }

    #[test]
    fn a_body_not_of_requests_is_refused_naming_what_is_wrong() {
        let refusal = |body: &str| match requests(body.as_bytes(), 3, 2) {
            Ok(r) => panic!("accepted {body}: {r:?}"),
            Err(e) => e,
        };
        assert_eq!(
            refusal(r#"{"requests": []}"#),
            "requests: a batch holds 1 to 2 requests, not 0"
        );
        assert_eq!(refusal(r#"{"other": []}"#), "requests: field required");
        assert_eq!(
            refusal(r#"{"requests": [{}, {}, {}]}"#),
            "requests: a batch holds 1 to 2 requests, not more"
        );
        assert!(refusal(r#"{"requests": {}}"#).starts_with("requests: expected an array"));
        assert!(refusal(r#"{"requests": [{}, 1]}"#).starts_with("requests[1]: expected an object"));
        assert!(refusal(r#"[]"#).starts_with("the body must be a JSON object"));
        assert!(refusal(r#"{"requests": [{"custom_id": "a", "params": {]}"#)
            .starts_with("invalid JSON body"));
        assert!(refusal(r#"{"requests": [{}]} x"#).starts_with("invalid JSON body"));
        assert!(refusal(r#"{"requests": [{}"#).starts_with("invalid JSON body"));
    }

    #[test]
    fn a_request_without_its_fields_or_with_a_used_id_is_refused_naming_it() {
        let mut seen = SeenIds::default();
        let raw = |index: usize, text: &str| RawRequest {
            index,
            bytes: text.as_bytes().to_vec(),
        };
        let refusal = |seen: &mut SeenIds, r: RawRequest| match fields(seen, &r) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.message,
        };
        assert_eq!(
            refusal(&mut seen, raw(4, r#"{"custom_id": "a"}"#)),
            "requests[4].params: field required"
        );
        assert_eq!(
            refusal(&mut seen, raw(5, r#"{"custom_id": "a b", "params": {}}"#)),
            "requests[5].custom_id: 1 to 64 letters, digits, `_` or `-`"
        );
        let first = raw(0, r#"{"custom_id": "a", "params": {"x": 1}}"#);
        let (id, params) = fields(&mut seen, &first).expect("a new id");
        assert_eq!(
            (id.as_str(), &first.bytes[params]),
            ("a", &br#"{"x": 1}"#[..])
        );
        assert_eq!(
            refusal(&mut seen, raw(6, r#"{"custom_id": "a", "params": {}}"#)),
            "requests[6].custom_id: `a` is used by another request of the batch"
        );
        assert_eq!(seen.cost(), BYTES_PER_SEEN_ID);
    }
}
