//! `StringOr<T>`: the "plain string or array of typed blocks" shape both wire formats use for
//! message content. Hand-written rather than `#[serde(untagged)]` so that a bad block reports
//! its own path (`messages[0].content[2].type`) instead of "did not match any variant".

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, value::SeqAccessDeserializer, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StringOr<T> {
    String(String),
    Many(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for StringOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = StringOr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(StringOr::String(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(StringOr::String(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(StringOr::Many)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}
