//! Ids and secrets: a type prefix and random base62, like the public APIs' ids. The ids the
//! stores mint are here; the gateway's own (messages, keys, sessions, protocol ids) build on
//! [`random`].

use rand::distr::{Alphanumeric, SampleString};

/// `len` random base62 characters (about 5.95 bits each).
pub fn random(len: usize) -> String {
    Alphanumeric.sample_string(&mut rand::rng(), len)
}

pub fn account() -> String {
    format!("acct_{}", random(16))
}

/// A gateway process, as recorded on the reservations it holds.
pub fn instance() -> String {
    format!("gw_{}", random(16))
}

/// Credits a gateway process holds for one account's turns.
pub fn allotment() -> String {
    format!("allot_{}", random(16))
}
