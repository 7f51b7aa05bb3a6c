//! Wire formats: what clients send and receive, exactly as the public APIs define them.

pub mod anthropic;
pub mod gemini;
pub mod one_or_many;
pub mod openai;
pub mod responses;

use serde::{Deserialize, Deserializer};

/// Lets a peer send `null` where a list, flag or string is optional.
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
