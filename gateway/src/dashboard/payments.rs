//! Payment providers: the billing page starts a checkout through one; the confirmation comes
//! back separately and is what credits the account (once per payment reference). Standalone
//! mode has a built-in test provider that confirms every checkout at once.

use std::sync::Arc;

use async_trait::async_trait;
use thiserror::Error;

use crate::ledger::{Ledger, LedgerError};

#[derive(Debug, Error)]
pub enum PaymentError {
    #[error("the payment provider refused the checkout")]
    Refused,
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A top-up the user asked for, under a reference unique to it.
pub struct Order {
    pub reference: String,
    pub account_id: String,
    pub usd_cents: u64,
}

#[async_trait]
pub trait PaymentProvider: Send + Sync {
    /// Starts paying an order. The account is credited only by the confirmation.
    async fn checkout(&self, order: &Order) -> Result<(), PaymentError>;
}

/// Credits bought by a top-up.
pub fn credits_for(usd_cents: u64, credits_per_usd: u64) -> u64 {
    usd_cents.saturating_mul(credits_per_usd) / 100
}

/// The test provider of standalone mode: every checkout is paid at once and confirmed.
pub struct TestPayments {
    ledger: Arc<dyn Ledger>,
    credits_per_usd: u64,
}

impl TestPayments {
    pub fn new(ledger: Arc<dyn Ledger>, credits_per_usd: u64) -> Self {
        Self {
            ledger,
            credits_per_usd,
        }
    }
}

#[async_trait]
impl PaymentProvider for TestPayments {
    async fn checkout(&self, order: &Order) -> Result<(), PaymentError> {
        self.ledger
            .top_up(
                &order.account_id,
                &order.reference,
                order.usd_cents,
                credits_for(order.usd_cents, self.credits_per_usd),
            )
            .await?;
        Ok(())
    }
}
