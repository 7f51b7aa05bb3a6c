//! Ledger ids that carry their time (migration 0020): `msg_` (or `chatcmpl_`, `resp_`) and 24
//! base62 characters, the first 9 the microsecond the turn started (its row's `created_at`),
//! the other 15 random (about 89 bits). `messages` is partitioned by `created_at`, so a
//! lookup by id decodes the time and probes one partition's primary key. The digits are in
//! ASCII order, so ids sort by time.
//!
//! Ids minted before 0020 are random: they decode to a time their row does not have, and a
//! lookup that misses falls back to a search on the id alone (one probe per partition).

use time::OffsetDateTime;

use crate::ids::random;

const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Characters of the time: 62^9 microseconds is about 428 years from 1970.
const TIME_CHARS: usize = 9;
/// Characters after the prefix's `_`.
const BODY_CHARS: usize = 24;

/// A new id `{prefix}_…` for a turn starting `at` (its row's `created_at`: see [`created_at`]).
pub fn mint(prefix: &str, at: OffsetDateTime) -> String {
    let mut micros = u64::try_from(at.unix_timestamp_nanos() / 1_000).unwrap_or(0);
    let mut time = [b'0'; TIME_CHARS];
    for digit in time.iter_mut().rev() {
        *digit = DIGITS[(micros % 62) as usize];
        micros /= 62;
    }
    let time = std::str::from_utf8(&time).unwrap_or_default();
    format!("{prefix}_{time}{}", random(BODY_CHARS - TIME_CHARS))
}

/// The time an id of the [`mint`] form carries, to the microsecond: the `created_at` of its
/// row. `None` for an id of another form (no lookup by time is possible). A random id of
/// before 0020 has the same form and decodes to a time of no meaning.
pub fn created_at(id: &str) -> Option<OffsetDateTime> {
    let (_, body) = id.split_once('_')?;
    if body.len() != BODY_CHARS || !body.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let micros = body.bytes().take(TIME_CHARS).fold(0i128, |n, b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'A'..=b'Z' => b - b'A' + 10,
            _ => b - b'a' + 36,
        };
        n * 62 + i128::from(digit)
    });
    OffsetDateTime::from_unix_timestamp_nanos(micros * 1_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_carries_the_microsecond_it_was_minted_at_and_sorts_by_it() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(1_795_000_000_123_456_789).unwrap();
        let id = mint("msg", at);
        assert_eq!(id.len(), 4 + BODY_CHARS, "{id}");
        assert_eq!(
            created_at(&id).map(|t| t.unix_timestamp_nanos()),
            Some(1_795_000_000_123_456_000)
        );
        let later = mint("msg", at + time::Duration::microseconds(1));
        assert!(later > id, "{later} sorts after {id}");
        assert_eq!(
            created_at(&mint("chatcmpl", at)),
            created_at(&id),
            "any prefix"
        );
    }

    #[test]
    fn ids_of_another_form_carry_no_time() {
        assert_eq!(created_at("msg_yesterday"), None);
        assert_eq!(created_at("m1"), None);
        assert_eq!(created_at("msg_0123456789abcdefghij-klm"), None);
    }
}
