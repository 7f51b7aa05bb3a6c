//! What an account keeps through the batch surfaces, paid for and bounded: its uploads
//! (`/v1/files`, content and names) and its batches' queued and running requests share one
//! quota of bytes (`--files-account-max-bytes`), and nothing is kept for an account without
//! credits. An ended item keeps only its result, which its turn was billed for.

pub mod error;

pub use self::error::StorageError;
use crate::error::ApiError;
use crate::state::BatchApi;
use gateway_core::auth::Principal;

/// Refuses (402) an upload or a batch create of an account with no credits available: a
/// create is refused unless the account's balance, less what turns in flight hold, is
/// positive (as a turn with nothing to reserve is). Its items are then each reserved and
/// refused as turns are when they run.
pub async fn require_credits(api: &BatchApi, principal: &Principal) -> Result<(), ApiError> {
    let balance = api.turns.ledger.balance(&principal.account.id).await?;
    if balance.balance.saturating_sub(balance.reserved) == 0 {
        return Err(StorageError::NoCredits.into());
    }
    Ok(())
}

/// The bytes the account's uploads may take: its quota less what its batches' queued
/// requests hold.
pub async fn room_for_files(api: &BatchApi, account_id: &str) -> Result<u64, ApiError> {
    let held = api.batches.held_bytes(account_id).await?;
    Ok(api.settings.files_account_max_bytes.saturating_sub(held))
}

/// The bytes the account's batches' queued requests may take: its quota less what its
/// uploads hold.
pub async fn room_for_batches(api: &BatchApi, account_id: &str) -> Result<u64, ApiError> {
    let held = api.files.held_bytes(account_id).await?;
    Ok(api.settings.files_account_max_bytes.saturating_sub(held))
}
