//! A batch's input file, checked whole at the create as OpenAI checks it: each non-blank line
//! a JSON object `{custom_id, method: "POST", url, body}` with a distinct `custom_id` and the
//! batch's endpoint; a line that is not fails the batch (its `errors`). A body its endpoint
//! (`/v1/chat/completions` or `/v1/responses`) would refuse is an item ended at once with that
//! 400. Its items refer to their lines of the file, read again when each runs
//! ([`body_of_line`]): the batch holds no copy of them.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error_result;
use crate::api::responses;
use crate::edge::body::from_value;
use crate::edge::budget::parsed_cost;
use crate::error::ApiError;
use crate::state::TurnApi;
use gateway_core::ids;
use gateway_core::turn::{self, Turns};
use gateway_core::wire::openai::translate::request_from_chat;
use gateway_core::wire::openai::ChatRequest;
use store::batches::{InputLine, NewItem, RequestFormat};

/// What each line of a batch's input is checked against: its endpoint, and whether that
/// endpoint would run its body.
pub struct Check<'a> {
    pub api: &'a TurnApi,
    pub turns: &'a Turns,
    pub endpoint: &'static str,
    pub format: RequestFormat,
}

impl Check<'_> {
    /// Why the endpoint would refuse `body` before running it, if it would.
    fn refused(&self, body: Value) -> Option<String> {
        let checked = match self.format {
            RequestFormat::Responses => responses::check_batch_body(self.api, self.turns, body),
            _ => from_value::<ChatRequest>(body).and_then(|chat| {
                let (request, _) = request_from_chat(chat)?;
                Ok(turn::check(self.turns, &request)?)
            }),
        };
        let id = match self.format {
            RequestFormat::Responses => ids::response(),
            _ => ids::chat_completion(),
        };
        checked.err().map(|e: ApiError| error_result(&e, &id))
    }
}

/// Errors reported of a failed file, at most (the first ones).
const MAX_ERRORS: usize = 100;

/// One of the `errors` of a batch whose input failed validation.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct LineError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<usize>,
}

pub struct Checked {
    pub items: Vec<NewItem>,
    pub errors: Vec<LineError>,
}

#[derive(Deserialize)]
struct Line {
    custom_id: Value,
    method: Value,
    url: Value,
    body: Value,
}

/// Where the line of `content` is that costs the most memory parsed.
pub fn costliest_line(content: &[u8]) -> std::ops::Range<usize> {
    let mut costliest = (0, 0..0);
    let mut start = 0;
    for line in content.split(|&b| b == b'\n') {
        let cost = parsed_cost(line);
        if cost > costliest.0 {
            costliest = (cost, start..start + line.len());
        }
        start += line.len() + 1;
    }
    costliest.1
}

/// The items of `content`, the input file `file_id`, or (any line malformed) none and the
/// errors. An item refers to its line of the file ([`InputLine`]), read when it runs: the
/// batch holds no copy of it.
pub fn read(check: &Check<'_>, file_id: &str, content: &[u8], max_requests: usize) -> Checked {
    let mut items = Vec::new();
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    let mut offset = 0;
    for (i, text) in content.split(|&b| b == b'\n').enumerate() {
        let line = InputLine {
            file_id: file_id.to_owned(),
            offset: offset as u64,
            len: text.len() as u64,
        };
        offset += text.len() + 1;
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let number = i + 1;
        match item(check, text, &mut seen, line) {
            Ok(item) => items.push(item),
            Err((code, param, message)) => {
                if errors.len() < MAX_ERRORS {
                    errors.push(LineError {
                        code: code.to_owned(),
                        message,
                        param: param.map(str::to_owned),
                        line: Some(number),
                    });
                }
            }
        }
    }
    if items.len() > max_requests {
        errors.push(LineError {
            code: "too_many_requests".to_owned(),
            message: format!(
                "a batch holds at most {max_requests} requests, not {}",
                items.len()
            ),
            param: None,
            line: None,
        });
    }
    if items.is_empty() && errors.is_empty() {
        errors.push(LineError {
            code: "empty_file".to_owned(),
            message: "the input file holds no request".to_owned(),
            param: None,
            line: None,
        });
    }
    if !errors.is_empty() {
        items.clear();
    }
    Checked { items, errors }
}

type Malformed = (&'static str, Option<&'static str>, String);

fn item(
    check: &Check<'_>,
    text: &[u8],
    seen: &mut HashSet<String>,
    line_at: InputLine,
) -> Result<NewItem, Malformed> {
    let line: Line = serde_json::from_slice(text).map_err(|e| {
        (
            "invalid_json_line",
            None,
            format!("not a JSON object of custom_id, method, url and body: {e}"),
        )
    })?;
    let custom_id = match line.custom_id {
        Value::String(id) if !id.is_empty() => id,
        _ => {
            return Err((
                "invalid_value",
                Some("custom_id"),
                "custom_id: a non-empty string".to_owned(),
            ))
        }
    };
    if line.method != "POST" {
        return Err((
            "invalid_value",
            Some("method"),
            "method: must be `POST`".to_owned(),
        ));
    }
    if line.url != check.endpoint {
        return Err((
            "mismatched_endpoint",
            Some("url"),
            format!("url: must be the batch's endpoint, `{}`", check.endpoint),
        ));
    }
    if !line.body.is_object() {
        return Err((
            "invalid_value",
            Some("body"),
            "body: a JSON object".to_owned(),
        ));
    }
    if !seen.insert(custom_id.clone()) {
        return Err((
            "duplicate_custom_id",
            Some("custom_id"),
            format!("custom_id: `{custom_id}` is used by another line"),
        ));
    }
    let refused = check.refused(line.body);
    Ok(NewItem {
        custom_id,
        params: String::new(),
        line: refused.is_none().then_some(line_at),
        refused,
    })
}

/// The `body` of an input file's line, as JSON text: what its item runs (the line was checked
/// when its batch was created).
pub fn body_of_line(text: &[u8]) -> Result<String, String> {
    let line: Line = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    Ok(line.body.to_string())
}
