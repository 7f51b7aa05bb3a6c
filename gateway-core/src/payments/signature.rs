//! The webhook signature, as payment providers such as Stripe send it: a header
//! `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">` (several `v1` entries while a
//! secret is being rotated). The timestamp is inside the signed text, so an old delivery
//! cannot be replayed with a fresh one; deliveries older than the tolerance are refused.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use thiserror::Error;
use time::OffsetDateTime;

type HmacSha256 = Hmac<Sha256>;

/// How far a delivery's timestamp may be from our clock.
pub const TOLERANCE_SECS: i64 = 300;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SignatureError {
    #[error("missing the webhook's signature header")]
    Missing,
    #[error("malformed webhook signature header: expected `t=<unix seconds>,v1=<hex>`")]
    Malformed,
    #[error("the webhook signature does not match the body")]
    Mismatch,
    #[error(
        "the webhook timestamp is more than {TOLERANCE_SECS} seconds from now; refusing a replay"
    )]
    Expired,
}

/// `None` only for a key HMAC refuses, which for HMAC-SHA256 is none.
fn mac(secret: &str, timestamp: i64, body: &[u8]) -> Option<HmacSha256> {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).ok()?;
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(mac)
}

/// The header value a provider sends for `body` at `timestamp`.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = mac(secret, timestamp, body).map(|m| m.finalize().into_bytes());
    format!(
        "t={timestamp},v1={}",
        tag.map(hex::encode).unwrap_or_default()
    )
}

/// A signature header taken apart: its timestamp and its tags.
struct Signed {
    timestamp: i64,
    tags: Vec<Vec<u8>>,
}

/// Takes `header` apart and checks its timestamp against `now`: all that can be checked
/// without the body.
fn parse(header: &str, now: i64) -> Result<Signed, SignatureError> {
    let mut timestamp = None;
    let mut tags = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => {
                timestamp = Some(t.parse::<i64>().map_err(|_| SignatureError::Malformed)?)
            }
            Some(("v1", tag)) => {
                tags.push(hex::decode(tag).map_err(|_| SignatureError::Malformed)?)
            }
            Some(_) => {}
            None => return Err(SignatureError::Malformed),
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if tags.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if (now - timestamp).abs() > TOLERANCE_SECS {
        return Err(SignatureError::Expired);
    }
    Ok(Signed { timestamp, tags })
}

/// Checks `header` against `body` at time `now` (unix seconds), in constant time.
pub fn verify(secret: &str, header: &str, body: &[u8], now: i64) -> Result<(), SignatureError> {
    let signed = parse(header, now)?;
    let expected = mac(secret, signed.timestamp, body).ok_or(SignatureError::Mismatch)?;
    if !signed
        .tags
        .iter()
        .any(|tag| expected.clone().verify_slice(tag).is_ok())
    {
        return Err(SignatureError::Mismatch);
    }
    Ok(())
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, SignatureError> {
    headers
        .get(name)
        .ok_or(SignatureError::Missing)?
        .to_str()
        .map_err(|_| SignatureError::Malformed)
}

/// What can be checked of a delivery's signature header `name` before its body is read: that
/// it is there, well formed and fresh. Unsigned or stale deliveries are refused without
/// buffering their body.
pub fn check_header(headers: &HeaderMap, name: &str) -> Result<(), SignatureError> {
    parse(
        header(headers, name)?,
        OffsetDateTime::now_utc().unix_timestamp(),
    )
    .map(|_| ())
}

/// Checks the signature header `name` of a delivery against its raw `body`, now.
pub fn verify_delivery(
    secret: &str,
    headers: &HeaderMap,
    name: &str,
    body: &[u8],
) -> Result<(), SignatureError> {
    verify(
        secret,
        header(headers, name)?,
        body,
        OffsetDateTime::now_utc().unix_timestamp(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"reference":"pay_1"}"#;

    #[test]
    fn a_signature_made_with_the_secret_is_accepted() {
        let header = sign("whsec", 1_000, BODY);
        assert_eq!(verify("whsec", &header, BODY, 1_000), Ok(()));
        assert_eq!(
            verify("whsec", &header, BODY, 1_000 + TOLERANCE_SECS),
            Ok(())
        );
    }

    #[test]
    fn another_secret_or_another_body_is_refused() {
        let header = sign("other", 1_000, BODY);
        assert_eq!(
            verify("whsec", &header, BODY, 1_000),
            Err(SignatureError::Mismatch)
        );
        let header = sign("whsec", 1_000, BODY);
        assert_eq!(
            verify("whsec", &header, b"{}", 1_000),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn a_delivery_older_than_the_tolerance_is_refused() {
        let header = sign("whsec", 1_000, BODY);
        let late = 1_000 + TOLERANCE_SECS + 1;
        assert_eq!(
            verify("whsec", &header, BODY, late),
            Err(SignatureError::Expired)
        );
    }

    #[test]
    fn a_rewritten_timestamp_breaks_the_signature() {
        let header = sign("whsec", 1_000, BODY).replace("t=1000", "t=2000");
        assert_eq!(
            verify("whsec", &header, BODY, 2_000),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn any_of_several_v1_tags_may_match_during_a_secret_rotation() {
        let old = sign("old", 1_000, BODY);
        let new = sign("whsec", 1_000, BODY);
        let both = format!(
            "{old},{}",
            new.split_once(',').map(|(_, v)| v).unwrap_or("")
        );
        assert_eq!(verify("whsec", &both, BODY, 1_000), Ok(()));
    }

    #[test]
    fn headers_without_a_timestamp_or_tag_are_malformed() {
        assert_eq!(
            verify("whsec", "v1=00", BODY, 0),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            verify("whsec", "t=1", BODY, 0),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            verify("whsec", "garbage", BODY, 0),
            Err(SignatureError::Malformed)
        );
    }
}
