//! Why an upload or a batch create is refused for what the account keeps; the gateway's `error`
//! module turns each into the envelope.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StorageError {
    /// The account has no credits left to pay for what it would keep.
    #[error(
        "your apiCredits balance is empty: files and batches are kept only for an account with \
         credits to run them; top up at /developers/billing"
    )]
    NoCredits,
    /// What the account keeps would pass its quota.
    #[error(
        "this account's files and queued batch requests may hold {0} bytes in all; delete files \
         or wait for batches to end before storing more"
    )]
    Quota(u64),
}
