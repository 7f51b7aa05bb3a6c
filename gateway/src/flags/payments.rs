//! Top-ups: what a dollar buys, the test provider's webhook, Stripe, and auto-reloads.

use std::time::Duration;

use clap::Args;

use super::secrets::LONG_SECRET;
use gateway_core::payments::stripe::StripeSettings;

/// Shared by the payment paths and `accounts topup`, which must credit alike.
#[derive(Debug, Args)]
pub struct CreditRateArgs {
    /// Credits granted per US dollar of top-up (1 credit = $0.00001 by default).
    #[arg(long, env = "GATEWAY_CREDITS_PER_USD", default_value_t = 100_000)]
    pub credits_per_usd: u64,
}

#[derive(Debug, Args)]
pub struct PaymentsArgs {
    #[command(flatten)]
    pub rate: CreditRateArgs,
    /// Shared secret of the payment provider's signed webhook (`POST /webhooks/payments`);
    /// without it the webhook is off.
    #[arg(
        long,
        env = "GATEWAY_PAYMENT_WEBHOOK_SECRET",
        hide_env_values = true,
        value_parser = LONG_SECRET
    )]
    pub payment_webhook_secret: Option<String>,
    /// Stripe secret API key (`sk_live_...`, `sk_test_...` or a restricted `rk_...` key that
    /// may write Checkout Sessions and PaymentIntents). With `--stripe-webhook-secret`, top-ups
    /// go through Stripe Checkout; one without the other refuses to start.
    #[arg(long, env = "GATEWAY_STRIPE_API_KEY", hide_env_values = true)]
    pub stripe_api_key: Option<String>,
    /// Signing secret (`whsec_...`) of the Stripe webhook endpoint `POST /webhooks/stripe`.
    #[arg(long, env = "GATEWAY_STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    pub stripe_webhook_secret: Option<String>,
    /// Base URL of Stripe's API; only tests point it elsewhere.
    #[arg(
        long,
        env = "GATEWAY_STRIPE_API_BASE",
        default_value = "https://api.stripe.com"
    )]
    pub stripe_api_base: String,
    /// How often each process looks for balances below their auto-reload threshold (with
    /// Stripe configured).
    #[arg(long, env = "GATEWAY_AUTO_RELOAD_INTERVAL_MS", default_value_t = 5_000)]
    pub auto_reload_interval_ms: u64,
}

impl PaymentsArgs {
    pub fn credits_per_usd(&self) -> u64 {
        self.rate.credits_per_usd
    }

    pub fn stripe(&self) -> StripeSettings<'_> {
        StripeSettings {
            api_key: self.stripe_api_key.as_deref(),
            webhook_secret: self.stripe_webhook_secret.as_deref(),
            api_base: &self.stripe_api_base,
        }
    }

    /// Zero would spin.
    pub fn auto_reload_interval(&self) -> Duration {
        Duration::from_millis(self.auto_reload_interval_ms.max(1))
    }
}
