//! The embeddings wire format (`POST /v1/embeddings`), as OpenAI's SDKs send and read it.
//! `input` is text: a string or a list of strings. OpenAI also takes token arrays (lists of
//! token ids of its own tokenizers); they are refused, since the gateway's upstreams do not
//! share one tokenizer and their ids would mean other text on each.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub input: Input,
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    #[serde(default)]
    pub dimensions: Option<u32>,
    #[serde(default)]
    pub user: Option<String>,
}

/// `input` as sent; [`Input::texts`] tells text from what is refused.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    One(String),
    Many(Vec<String>),
    /// Token arrays, or anything else: refused with a message naming the field.
    Other(Value),
}

impl Input {
    /// The texts, or why `input` is refused.
    pub fn texts(self) -> Result<Vec<String>, String> {
        match self {
            Input::One(text) => Ok(vec![text]),
            Input::Many(texts) => Ok(texts),
            Input::Other(value) => Err(match value {
                Value::Array(items)
                    if items.iter().all(|i| {
                        i.is_u64() || i.as_array().is_some_and(|a| a.iter().all(Value::is_u64))
                    }) =>
                {
                    "input: token arrays are not accepted; send the text, as a string or a list \
                     of strings"
                        .to_owned()
                }
                _ => "input: must be a string or a list of strings".to_owned(),
            }),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    /// The vector's little-endian f32 bytes, in standard base64 (as OpenAI encodes it).
    Base64,
}

#[derive(Debug, Serialize)]
pub struct EmbeddingsResponse {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingsUsage,
}

#[derive(Debug, Serialize)]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: Vector,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

impl Vector {
    pub fn encode(vector: Vec<f32>, format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => Vector::Float(vector),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }
}

#[derive(Debug, Serialize)]
pub struct EmbeddingsUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(json: &str) -> Result<Vec<String>, String> {
        serde_json::from_str::<Input>(json).unwrap().texts()
    }

    #[test]
    fn a_string_and_a_list_of_strings_are_text_and_token_arrays_are_refused() {
        assert_eq!(input(r#""a""#).unwrap(), ["a"]);
        assert_eq!(input(r#"["a","b"]"#).unwrap(), ["a", "b"]);
        assert!(input("[1,2]").unwrap_err().contains("token arrays"));
        assert!(input("[[1],[2,3]]").unwrap_err().contains("token arrays"));
        assert!(input(r#"{"a":1}"#).unwrap_err().starts_with("input:"));
        assert!(input(r#"["a",1]"#).unwrap_err().starts_with("input:"));
    }

    #[test]
    fn base64_is_the_little_endian_f32_bytes() {
        let Vector::Base64(text) = Vector::encode(vec![1.0, -2.5], EncodingFormat::Base64) else {
            panic!("not base64");
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        assert_eq!(bytes[..4], 1.0f32.to_le_bytes());
        assert_eq!(bytes[4..], (-2.5f32).to_le_bytes());
    }
}
