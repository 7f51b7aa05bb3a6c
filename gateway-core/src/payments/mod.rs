//! Top-ups: the amounts the spec allows, the credits a payment buys, their confirmation (from
//! the admin API, the operator CLI or a payment provider's webhook, all through [`confirm`]),
//! the webhooks' signature check ([`signature`]), and [`stripe`].

mod provider;
pub mod reload;
pub mod signature;
pub mod stripe;
pub mod webhook;

use std::sync::Arc;

use thiserror::Error;

pub use provider::{CheckoutError, NoPayments, Order, PaymentProvider, Started, TestPayments};

use stripe::Stripe;

use reload::AutoReloads;
use store::accounts::{Accounts, StoreError};
use store::audit::Actor;
use store::developers::DeveloperStore;
use store::ledger::{Confirmation, Ledger, LedgerError, NewTopUp};

/// The payment provider chosen at start-up, and Stripe itself when it is the one: its webhook
/// and the auto-reload sweep need Stripe, not just a provider.
#[derive(Clone)]
pub struct Payments {
    pub provider: Arc<dyn PaymentProvider>,
    pub stripe: Option<Arc<Stripe>>,
}

impl Payments {
    pub fn stripe(stripe: Stripe) -> Self {
        let stripe = Arc::new(stripe);
        Self {
            provider: stripe.clone(),
            stripe: Some(stripe),
        }
    }

    pub fn other(provider: impl PaymentProvider + 'static) -> Self {
        Self {
            provider: Arc::new(provider),
            stripe: None,
        }
    }
}

/// What payments move and record: the accounts credited, the ledger, the saved cards of
/// auto-reload, the dashboard's checkouts, and the price of a credit.
#[derive(Clone)]
pub struct Books {
    pub accounts: Arc<dyn Accounts>,
    pub ledger: Arc<dyn Ledger>,
    pub auto_reloads: Arc<dyn AutoReloads>,
    pub checkouts: Arc<dyn DeveloperStore>,
    pub credits_per_usd: u64,
}

/// The spec's top-up bounds: packs from $10, custom amounts up to $10,000.
pub const MIN_TOP_UP_CENTS: u64 = 1_000;
pub const MAX_TOP_UP_CENTS: u64 = 1_000_000;

#[derive(Debug, Error)]
pub enum PaymentError {
    #[error("usd_cents: a top-up is from $10 (1000) to $10,000 (1000000), not {0}")]
    Amount(u64),
    #[error("reference: must not be empty")]
    EmptyReference,
    #[error("account_id: account `{0}` does not exist")]
    UnknownAccount(String),
    #[error("reference: top-up `{0}` is already confirmed; nothing changed")]
    Duplicate(String),
    /// A delivery whose body is not what the provider sends (a field missing, another currency).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Signature(#[from] signature::SignatureError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Credits bought by `usd_cents` at `credits_per_usd`, rounded down to a whole credit.
pub fn credits_for(usd_cents: u64, credits_per_usd: u64) -> u64 {
    usd_cents.saturating_mul(credits_per_usd) / 100
}

pub fn check_amount(usd_cents: u64) -> Result<(), PaymentError> {
    if (MIN_TOP_UP_CENTS..=MAX_TOP_UP_CENTS).contains(&usd_cents) {
        Ok(())
    } else {
        Err(PaymentError::Amount(usd_cents))
    }
}

/// Confirms a top-up of an existing account; idempotent by reference (see
/// [`Confirmation::first`]).
pub async fn confirm(
    accounts: &dyn Accounts,
    ledger: &dyn Ledger,
    credits_per_usd: u64,
    top_up: TopUpRequest<'_>,
) -> Result<Confirmation, PaymentError> {
    check_amount(top_up.usd_cents)?;
    if top_up.reference.trim().is_empty() {
        return Err(PaymentError::EmptyReference);
    }
    if accounts.account(top_up.account_id).await?.is_none() {
        return Err(PaymentError::UnknownAccount(top_up.account_id.to_owned()));
    }
    let credits = credits_for(top_up.usd_cents, credits_per_usd);
    Ok(ledger
        .top_up(NewTopUp {
            account_id: top_up.account_id,
            reference: top_up.reference,
            usd_cents: top_up.usd_cents,
            credits,
            payment_id: top_up.payment_id,
            by: top_up.by,
        })
        .await?)
}

pub struct TopUpRequest<'a> {
    pub account_id: &'a str,
    pub reference: &'a str,
    pub usd_cents: u64,
    /// The provider's payment (Stripe's PaymentIntent), when it can be refunded or disputed.
    pub payment_id: Option<&'a str>,
    /// Who confirms it, for the audit log.
    pub by: &'a Actor,
}

/// Dollars as typed by an operator (`25`, `25.5`, `25.50`) in cents.
pub fn parse_usd(text: &str) -> Option<u64> {
    let (whole, fraction) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    if whole.is_empty()
        || fraction.len() > 2
        || !(whole.bytes().chain(fraction.bytes())).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let cents: u64 = format!("{fraction:0<2}").parse().ok()?;
    whole
        .parse::<u64>()
        .ok()?
        .checked_mul(100)?
        .checked_add(cents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dollar_buys_credits_per_usd_credits() {
        assert_eq!(credits_for(1_000, 100_000), 1_000_000);
        assert_eq!(credits_for(1_050, 100_000), 1_050_000);
        assert_eq!(credits_for(1_001, 1), 10);
    }

    #[test]
    fn operators_type_dollars_with_at_most_two_decimals() {
        assert_eq!(parse_usd("25"), Some(2_500));
        assert_eq!(parse_usd("25.5"), Some(2_550));
        assert_eq!(parse_usd("25.05"), Some(2_505));
        assert_eq!(parse_usd("25.055"), None);
        assert_eq!(parse_usd("-5"), None);
        assert_eq!(parse_usd(".5"), None);
    }

    #[test]
    fn top_ups_are_from_ten_to_ten_thousand_dollars() {
        assert!(check_amount(999).is_err());
        assert!(check_amount(1_000).is_ok());
        assert!(check_amount(1_000_000).is_ok());
        assert!(check_amount(1_000_001).is_err());
    }
}
