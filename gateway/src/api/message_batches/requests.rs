//! A Message Batch create's body, indexed rather than parsed whole: the index holds each
//! request's `custom_id` and where its `params` are in the body, and the params are then
//! parsed, checked and stored one request at a time ([`Index::items`]). Parsed whole, a body of
//! 100,000 one-message requests took about ten times its bytes (a map per JSON object) and the
//! memory budget refused it; indexed, the create holds the body, the index and the stored
//! params ([`Index::cost`]), and one request's parsed form at a time.

use std::collections::HashSet;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::errored;
use crate::edge::body::{from_value, parse};
use crate::edge::budget::{parsed_cost, BYTES_PER_BODY_BYTE};
use crate::error::ApiError;
use gateway_core::turn::{self, Turns};
use gateway_core::wire::anthropic::translate::request_from_messages;
use gateway_core::wire::anthropic::MessagesRequest;
use store::batches::NewItem;

/// The longest `custom_id` (Anthropic's limit).
const MAX_CUSTOM_ID: usize = 64;
/// What each request of a batch holds beside the body's bytes until the batch is stored: its
/// index entry (a `custom_id` and a range), its item (three strings and their allocations)
/// and its place in the set of `custom_id`s seen. Measured with 100,000 one-message requests:
/// docs/benchmarks.md, "A Message Batch create of 100,000 requests".
pub const BYTES_PER_REQUEST: usize = 256;

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    requests: Vec<Request<'a>>,
}

#[derive(Deserialize)]
struct Request<'a> {
    custom_id: String,
    #[serde(borrow)]
    params: &'a RawValue,
}

/// Where each request of a body is: its `custom_id` and the bytes of its `params`.
pub struct Index {
    requests: Vec<(String, Range<usize>)>,
    /// The bytes of the request whose `params` cost the most parsed.
    costliest: Range<usize>,
}

impl Index {
    /// Indexes `body` (400 with the field's path when it is not `{"requests": [{"custom_id",
    /// "params"}, …]}`) and checks its `custom_id`s: 1 to `max` requests with distinct ids of
    /// 1 to 64 letters, digits, `_` and `-`, otherwise nobody could match the results to them,
    /// so the whole batch is refused.
    pub fn of(body: &[u8], max: usize) -> Result<Self, ApiError> {
        let parsed: Body<'_> = parse(body)?;
        check_custom_ids(&parsed.requests, max)?;
        let start = body.as_ptr() as usize;
        let mut costliest = (0, 0..0);
        let requests = parsed
            .requests
            .into_iter()
            .map(|r| {
                let params = r.params.get().as_bytes();
                // The raw value borrows from `body`: its place there is its address's offset.
                let at = (params.as_ptr() as usize).saturating_sub(start);
                let range = at..at + params.len();
                let cost = parsed_cost(params);
                if cost > costliest.0 {
                    costliest = (cost, range.clone());
                }
                (r.custom_id, range)
            })
            .collect();
        Ok(Self {
            requests,
            costliest: costliest.1,
        })
    }

    /// The memory the create holds once indexed: the body's bytes as any body read counts
    /// them, an item per request, and the costliest request parsed (one is parsed at a time).
    pub fn cost(&self, body: &[u8]) -> usize {
        let costliest = body.get(self.costliest.clone()).unwrap_or_default();
        body.len()
            .saturating_mul(BYTES_PER_BODY_BYTE)
            .saturating_add(self.requests.len().saturating_mul(BYTES_PER_REQUEST))
            .saturating_add(parsed_cost(costliest))
    }

    /// The batch's items: each request checked as `/v1/messages` checks a body, queued when it
    /// would take it, else ended with the `errored` result of the envelope it would answer.
    pub fn items(self, turns: &Turns, body: &[u8]) -> Vec<NewItem> {
        self.requests
            .into_iter()
            .map(|(custom_id, params)| item(turns, custom_id, body.get(params).unwrap_or(b"")))
            .collect()
    }
}

fn check_custom_ids(requests: &[Request<'_>], max: usize) -> Result<(), ApiError> {
    if requests.is_empty() || requests.len() > max {
        return Err(ApiError::invalid(format!(
            "requests: a batch holds 1 to {max} requests, not {}",
            requests.len()
        )));
    }
    let mut seen = HashSet::with_capacity(requests.len());
    for (i, request) in requests.iter().enumerate() {
        let id = &request.custom_id;
        let valid = (1..=MAX_CUSTOM_ID).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ApiError::invalid(format!(
                "requests[{i}].custom_id: 1 to {MAX_CUSTOM_ID} letters, digits, `_` or `-`"
            )));
        }
        if !seen.insert(id.as_str()) {
            return Err(ApiError::invalid(format!(
                "requests[{i}].custom_id: `{id}` is used by another request of the batch"
            )));
        }
    }
    Ok(())
}

fn item(turns: &Turns, custom_id: String, params: &[u8]) -> NewItem {
    let (params, refused) = match serde_json::from_slice::<Value>(params) {
        Ok(value) => {
            let text = value.to_string();
            let checked = from_value::<MessagesRequest>(value)
                .and_then(|r| Ok(turn::check(turns, &request_from_messages(r))?));
            (text, checked.err())
        }
        // Not reached: the index found each `params` a JSON value.
        Err(e) => (
            String::from_utf8_lossy(params).into_owned(),
            Some(ApiError::invalid(format!("invalid JSON body: {e}"))),
        ),
    };
    NewItem {
        custom_id,
        params,
        refused: refused.map(|e| errored(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_requests_params_are_found_where_they_are_in_the_body() {
        let body = br#"{"requests": [{"custom_id": "a", "params": {"x": [1, 2]}},
            {"params": "text", "custom_id": "b"}]}"#;
        let index = Index::of(body, 10).expect("a valid body");
        let found: Vec<(&str, &[u8])> = index
            .requests
            .iter()
            .map(|(id, at)| (id.as_str(), &body[at.clone()]))
            .collect();
        assert_eq!(
            found,
            [("a", &br#"{"x": [1, 2]}"#[..]), ("b", &br#""text""#[..])]
        );
        assert_eq!(&body[index.costliest.clone()], br#"{"x": [1, 2]}"#);
    }

    #[test]
    fn a_body_not_of_requests_is_refused_naming_the_field() {
        let refusal = |body: &str| match Index::of(body.as_bytes(), 10) {
            Ok(_) => panic!("accepted {body}"),
            Err(e) => e.message,
        };
        assert_eq!(
            refusal(r#"{"requests": [{"custom_id": "a"}]}"#),
            "requests[0].params: field required"
        );
        assert_eq!(
            refusal(r#"{"requests": []}"#),
            "requests: a batch holds 1 to 10 requests, not 0"
        );
        assert_eq!(
            refusal(
                r#"{"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]}"#
            ),
            "requests[1].custom_id: `a` is used by another request of the batch"
        );
        assert!(refusal(r#"{"requests": [{"custom_id": "a", "params": {]}"#)
            .starts_with("invalid JSON body"));
    }

    #[test]
    fn the_cost_counts_each_request_and_the_costliest_parsed() {
        let body = br#"{"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "b", "params": {"k": {"v": 1}}}]}"#;
        let index = Index::of(body, 10).expect("a valid body");
        let costliest = br#"{"k": {"v": 1}}"#;
        assert_eq!(
            index.cost(body),
            body.len() * BYTES_PER_BODY_BYTE + 2 * BYTES_PER_REQUEST + parsed_cost(costliest)
        );
    }
}
