//! Why a Message Batches call is refused; the gateway's `error` module turns each into the envelope.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BatchError {
    #[error("id: no message batch with id `{0}`")]
    NotFound(String),
    /// The key's cap of batches processing at once (429).
    #[error("this key has {0} message batches processing, its limit; retry once one has ended")]
    TooManyInProgress(u32),
    /// The key's cap of items queued or running over all its batches (429).
    #[error("this batch's {0} requests would pass this key's limit of {1} requests queued or running; retry once some have ended")]
    TooManyQueuedItems(u64, u64),
    /// Results and deletion need every item ended.
    #[error("message batch `{0}` is still processing; {1} once it has ended")]
    Processing(String, &'static str),
}
