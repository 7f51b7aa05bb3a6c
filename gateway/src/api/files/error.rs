//! Why a Files API call is refused; the gateway's `error` module turns each into the envelope.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum FileError {
    #[error("file_id: no file with id `{0}`")]
    NotFound(String),
    #[error("purpose: `{0}` is not accepted; the only purpose is `batch`")]
    Purpose(String),
    #[error("multipart body: {0}")]
    Multipart(String),
    #[error(
        "file: a batch input file is JSONL, one JSON object a line; line {line} is not: {reason}"
    )]
    NotJsonl { line: usize, reason: String },
    /// The account's uploads would hold more than its quota.
    #[error(
        "file: this account's files may hold {0} bytes in all; delete some before uploading more"
    )]
    Quota(u64),
    #[error("expires_after: {0}")]
    ExpiresAfter(String),
}
