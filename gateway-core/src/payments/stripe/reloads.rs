//! The auto-reload sweep: every `interval`, the accounts whose rule is due get their saved card
//! charged. `payments::reload` keeps the rules and the cards; only Stripe charges them, so the
//! sweep runs only when Stripe is the payment provider.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Stripe;
use crate::payments::reload::AutoReloads;

/// Runs a sweep every `interval` until `draining`.
pub async fn every(
    stripe: Arc<Stripe>,
    store: Arc<dyn AutoReloads>,
    interval: Duration,
    draining: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = draining.cancelled() => return,
            _ = ticks.tick() => sweep(&stripe, store.as_ref()).await,
        }
    }
}

async fn sweep(stripe: &Stripe, store: &dyn AutoReloads) {
    let due = match store.due().await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "auto-reload sweep failed; retrying at the next tick");
            return;
        }
    };
    for reload in due {
        let outcome = stripe.charge(&reload).await;
        tracing::info!(account = %reload.account_id, attempt = reload.attempt, ?outcome, "auto-reload");
        if let Err(e) = store.finish(&reload, &outcome).await {
            tracing::warn!(error = %e, account = %reload.account_id, "auto-reload outcome not recorded");
        }
    }
}
