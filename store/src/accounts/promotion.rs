//! The promotion sweep: a key's tier follows its account's confirmed lifetime top-up, upwards
//! only. The rules come from the compiled config's tiers; each store applies them in one step
//! ([`super::Accounts::promote_tiers`]). The operator calls it on its timer in a cluster;
//! standalone mode runs [`every`] in process.

use std::sync::Arc;
use std::time::Duration;

use crds::config::{GatewayConfig, TierConfig, TIER_IDS};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::Accounts;
use crate::audit::{Actor, ActorKind};

/// Tiers a key can be promoted into, in promotion order, with their thresholds (US cents).
/// Tiers without a threshold (enterprise) are absent: keys in them are never touched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromotionRules {
    tiers: Vec<(String, u64)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Promotion {
    pub key_id: String,
    pub account_id: String,
    pub from: String,
    pub to: String,
}

impl PromotionRules {
    pub fn from_config(config: &GatewayConfig) -> Self {
        Self::new(TIER_IDS.iter().filter_map(|id| {
            let cents = config.tiers.get(*id)?.promotion_at_lifetime_cents?;
            Some(((*id).to_owned(), cents))
        }))
    }

    /// Tiers in promotion order with their thresholds.
    pub fn new(tiers: impl IntoIterator<Item = (String, u64)>) -> Self {
        Self {
            tiers: tiers.into_iter().collect(),
        }
    }

    pub fn tiers(&self) -> &[(String, u64)] {
        &self.tiers
    }

    /// The tier a key in `tier` moves to with this lifetime top-up; `None` to stay.
    pub fn target(&self, tier: &str, lifetime_cents: u64) -> Option<&str> {
        let current = self.tiers.iter().position(|(id, _)| id == tier)?;
        let best = self
            .tiers
            .iter()
            .rposition(|(_, cents)| *cents <= lifetime_cents)?;
        (best > current).then(|| self.tiers[best].0.as_str())
    }
}

/// The tier only a manual grant gives (custom limits); never reached by top-ups.
pub const ENTERPRISE: &str = "enterprise";

/// The actor id of the promotion sweep's audit rows.
pub const SWEEP: &str = "promotion_sweep";

/// Where confirmed lifetime top-up puts an account: its tier, and the next tier with the
/// top-up still needed to reach it. Enterprise is granted by hand, never reached this way.
pub struct Standing {
    pub tier: String,
    pub next: Option<(String, u64)>,
}

/// The standing of `lifetime_cents` among `tiers` (the compiled config's).
pub fn standing<'a>(
    tiers: impl IntoIterator<Item = (&'a String, &'a TierConfig)>,
    lifetime_cents: u64,
) -> Standing {
    let mut ladder: Vec<(&String, u64)> = tiers
        .into_iter()
        .filter_map(|(id, t)| t.promotion_at_lifetime_cents.map(|at| (id, at)))
        .collect();
    ladder.sort_by_key(|(_, at)| *at);
    let tier = ladder
        .iter()
        .rev()
        .find(|(_, at)| *at <= lifetime_cents)
        .map_or_else(|| "free".to_owned(), |(id, _)| (*id).clone());
    let next = ladder
        .iter()
        .find(|(_, at)| *at > lifetime_cents)
        .map(|(id, at)| ((*id).clone(), at - lifetime_cents));
    Standing { tier, next }
}

/// Runs the sweep every `interval` until `stop`.
pub async fn every(
    accounts: Arc<dyn Accounts>,
    rules: PromotionRules,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval.max(Duration::from_secs(1)));
    let by = Actor::new(ActorKind::Sweep, SWEEP, None);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match accounts.promote_tiers(&rules, &by).await {
            Ok(promotions) => {
                for p in promotions {
                    tracing::info!(key_id = %p.key_id, account_id = %p.account_id, from = %p.from, to = %p.to, "key promoted");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "promotion sweep failed; retrying at the next tick")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> PromotionRules {
        PromotionRules::new([
            ("free".to_owned(), 0),
            ("pay_as_you_go".to_owned(), 1),
            ("high_volume".to_owned(), 50_000),
        ])
    }

    #[test]
    fn a_key_moves_up_to_the_highest_tier_its_lifetime_top_up_reaches() {
        assert_eq!(rules().target("free", 0), None);
        assert_eq!(rules().target("free", 1_000), Some("pay_as_you_go"));
        assert_eq!(rules().target("free", 50_000), Some("high_volume"));
        assert_eq!(rules().target("pay_as_you_go", 60_000), Some("high_volume"));
    }

    #[test]
    fn a_key_never_moves_down_and_enterprise_is_never_touched() {
        assert_eq!(rules().target("high_volume", 0), None);
        assert_eq!(rules().target("pay_as_you_go", 1), None);
        assert_eq!(rules().target("enterprise", 1_000_000), None);
    }
}
