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
    #[error("expires_after: {0}")]
    ExpiresAfter(String),
    /// Batches still running read their requests from the file.
    #[error("file_id: file `{0}` is the input of a batch still in progress, which reads its requests from it; cancel the batch or wait until it has ended, then delete the file")]
    InUse(String),
    /// The upload's file name is longer than the most a name may take.
    #[error("file: its file name may take {max} bytes at most, not {bytes}")]
    FilenameTooLong { bytes: usize, max: usize },
}
