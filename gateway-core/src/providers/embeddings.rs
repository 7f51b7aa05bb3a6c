//! Embeddings (`POST /v1/embeddings`): the one call an embeddings route makes of its upstream,
//! answered whole (nothing streams). `openai` and `azure-openai` speak OpenAI's embeddings
//! format (the adapter is [`super::OpenAi`]'s, with its address and key); `simulated` answers
//! deterministic unit vectors, the same for the same text, so the product runs without an
//! upstream account. Other providers have no embeddings here: the compiler refuses an
//! embeddings route naming one.

use std::sync::Arc;

use crds::config::{ProviderKind, Upstream};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{ProviderError, Providers};

/// The length of a simulated vector when the request names no `dimensions`: that of OpenAI's
/// `text-embedding-3-small` and `ada-002`.
pub const DEFAULT_DIMENSIONS: u32 = 1536;

/// What one upstream is asked.
#[derive(Clone, Debug)]
pub struct EmbeddingsCall {
    pub inputs: Arc<Vec<String>>,
    pub dimensions: Option<u32>,
    pub user: Option<String>,
}

/// An upstream's answer: one vector per input, in the inputs' order.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingsAnswer {
    pub vectors: Vec<Vec<f32>>,
    /// The upstream's own count of the input; `None` where it reports none (simulated).
    pub prompt_tokens: Option<u32>,
}

impl Providers {
    /// Embeds the call's inputs on `upstream`.
    pub async fn embed(
        &self,
        upstream: &Upstream,
        call: &EmbeddingsCall,
    ) -> Result<EmbeddingsAnswer, ProviderError> {
        match upstream.provider {
            ProviderKind::Openai | ProviderKind::AzureOpenai => {
                self.openai.embed(upstream, call).await
            }
            ProviderKind::Simulated => Ok(simulated(call)),
            // The compiler refuses these on an embeddings route; a config that slipped past it
            // is ours to fix, never the client's.
            ProviderKind::Anthropic
            | ProviderKind::Bedrock
            | ProviderKind::Gemini
            | ProviderKind::Vertex => {
                tracing::error!(upstream = %upstream.name, provider = upstream.provider.as_str(), "embeddings on a provider without them");
                Err(ProviderError::Unavailable)
            }
        }
    }
}

/// OpenAI's embeddings request body, as the upstream is sent it.
#[derive(Serialize)]
pub(super) struct UpstreamRequest<'a> {
    pub model: &'a str,
    pub input: &'a [String],
    /// Always `float`: the gateway encodes for its client itself.
    pub encoding_format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
}

/// The parts of OpenAI's embeddings answer the gateway reads.
#[derive(Deserialize)]
pub(super) struct UpstreamResponse {
    data: Vec<UpstreamEmbedding>,
    #[serde(default)]
    usage: Option<UpstreamUsage>,
}

#[derive(Deserialize)]
struct UpstreamEmbedding {
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct UpstreamUsage {
    prompt_tokens: u32,
}

impl UpstreamResponse {
    /// The vectors in the inputs' order; an answer without exactly one vector per input is
    /// the upstream's failure.
    pub(super) fn answer(self, inputs: usize) -> Result<EmbeddingsAnswer, ProviderError> {
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs];
        for item in self.data {
            let slot = vectors.get_mut(item.index).ok_or_else(|| {
                super::http::malformed("embeddings answer", "an index past the inputs")
            })?;
            *slot = Some(item.embedding);
        }
        let vectors = vectors
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                super::http::malformed("embeddings answer", "an input without vector")
            })?;
        Ok(EmbeddingsAnswer {
            vectors,
            prompt_tokens: self.usage.map(|u| u.prompt_tokens),
        })
    }
}

/// Deterministic unit vectors: each input's SHA-256 seeds a xorshift generator whose numbers
/// in [-1, 1) are then scaled to length 1, as real embeddings are.
fn simulated(call: &EmbeddingsCall) -> EmbeddingsAnswer {
    let dimensions = call.dimensions.unwrap_or(DEFAULT_DIMENSIONS) as usize;
    let vectors = call
        .inputs
        .iter()
        .map(|input| unit_vector(input, dimensions))
        .collect();
    EmbeddingsAnswer {
        vectors,
        prompt_tokens: None,
    }
}

fn unit_vector(input: &str, dimensions: usize) -> Vec<f32> {
    let digest = Sha256::digest(input.as_bytes());
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&digest[..8]);
    // xorshift64 must not start at 0.
    let mut state = u64::from_le_bytes(seed) | 1;
    let mut vector: Vec<f32> = (0..dimensions)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // The top 24 bits, as f32 holds them exactly, mapped onto [-1, 1).
            ((state >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|v| *v /= norm);
    }
    vector
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_vectors_are_deterministic_unit_vectors_of_the_asked_length() {
        let call = |dimensions| EmbeddingsCall {
            inputs: Arc::new(vec!["hello".into(), "world".into()]),
            dimensions,
            user: None,
        };
        let a = simulated(&call(None));
        assert_eq!(a.vectors.len(), 2);
        assert_eq!(a.vectors[0].len(), DEFAULT_DIMENSIONS as usize);
        assert_eq!(a, simulated(&call(None)));
        assert_ne!(a.vectors[0], a.vectors[1]);
        let short = simulated(&call(Some(8)));
        for v in &short.vectors {
            assert_eq!(v.len(), 8);
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{norm}");
        }
    }

    #[test]
    fn an_upstream_answer_is_put_in_the_inputs_order_and_must_cover_every_input() {
        let parse = |json: &str, inputs| {
            serde_json::from_str::<UpstreamResponse>(json)
                .unwrap()
                .answer(inputs)
        };
        let answer = parse(
            r#"{"data":[{"index":1,"embedding":[2.0]},{"index":0,"embedding":[1.0]}],"usage":{"prompt_tokens":3,"total_tokens":3}}"#,
            2,
        )
        .unwrap();
        assert_eq!(answer.vectors, vec![vec![1.0], vec![2.0]]);
        assert_eq!(answer.prompt_tokens, Some(3));
        assert!(parse(r#"{"data":[{"index":0,"embedding":[1.0]}]}"#, 2).is_err());
        assert!(parse(r#"{"data":[{"index":2,"embedding":[1.0]}]}"#, 2).is_err());
    }
}
