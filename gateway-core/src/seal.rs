//! Sealed reasoning: a model's thinking (its text and the upstream's signature) handed to a
//! stateless client as the opaque `encrypted_content` of a Responses API reasoning item, and
//! taken back on a later turn only if this deployment issued it unchanged.
//!
//! The seal is an HMAC-SHA256 tag over the payload, under a key derived from the operator's
//! `--responses-secret` (every pod of a cluster must be given the same one) or, without it,
//! from a random per-process secret, which a restart or another pod does not know. The payload
//! is authenticated, not encrypted: it carries the thinking that the reasoning summary shows
//! anyway, and a signature only the upstream can check.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

/// Format version, first in every sealed value, so the format can change without confusion.
const VERSION: &str = "v1";

#[derive(Clone)]
pub struct Sealer {
    /// Keyed and ready; cloned for each seal or check.
    mac: HmacSha256,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SealError {
    #[error(
        "not a reasoning item issued by this service (altered, or sealed under another secret)"
    )]
    Forged,
}

/// What a sealed reasoning item carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thinking {
    pub thinking: String,
    pub signature: String,
}

impl Sealer {
    /// Keyed by the operator's secret; a random one when there is none.
    pub fn new(secret: Option<&str>) -> Self {
        let secret = match secret {
            Some(secret) => secret.as_bytes().to_vec(),
            None => {
                let mut random = [0u8; 32];
                rand::rng().fill_bytes(&mut random);
                random.to_vec()
            }
        };
        // A key of its own for this use, so the secret may be shared with nothing else.
        let mut derive = keyed(&secret);
        derive.update(b"gateway responses reasoning seal v1");
        Self {
            mac: keyed(&derive.finalize().into_bytes()),
        }
    }

    fn mac(&self) -> HmacSha256 {
        self.mac.clone()
    }

    pub fn seal(&self, thinking: &Thinking) -> String {
        let payload = serde_json::to_vec(thinking).unwrap_or_default();
        let payload = URL_SAFE_NO_PAD.encode(payload);
        let mut mac = self.mac();
        mac.update(VERSION.as_bytes());
        mac.update(payload.as_bytes());
        let tag = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{VERSION}.{payload}.{tag}")
    }

    pub fn open(&self, sealed: &str) -> Result<Thinking, SealError> {
        let mut parts = sealed.split('.');
        let (Some(VERSION), Some(payload), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(SealError::Forged);
        };
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| SealError::Forged)?;
        let mut mac = self.mac();
        mac.update(VERSION.as_bytes());
        mac.update(payload.as_bytes());
        mac.verify_slice(&tag).map_err(|_| SealError::Forged)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| SealError::Forged)?;
        serde_json::from_slice(&payload).map_err(|_| SealError::Forged)
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thinking() -> Thinking {
        Thinking {
            thinking: "Paris, surely.".into(),
            signature: "c2lnbmF0dXJl".into(),
        }
    }

    #[test]
    fn a_sealed_thinking_opens_to_itself_under_the_same_secret() {
        let sealer = Sealer::new(Some("s3cret"));
        let sealed = sealer.seal(&thinking());
        assert_eq!(Sealer::new(Some("s3cret")).open(&sealed), Ok(thinking()));
    }

    #[test]
    fn an_altered_or_foreign_seal_is_refused() {
        let sealer = Sealer::new(Some("s3cret"));
        let sealed = sealer.seal(&thinking());
        let mut altered = sealed.clone().into_bytes();
        let middle = altered.len() / 2;
        altered[middle] = if altered[middle] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(sealer.open(&altered), Err(SealError::Forged));
        assert_eq!(
            Sealer::new(Some("other")).open(&sealed),
            Err(SealError::Forged)
        );
        assert_eq!(Sealer::new(None).open(&sealed), Err(SealError::Forged));
        assert_eq!(sealer.open("garbage"), Err(SealError::Forged));
    }
}
