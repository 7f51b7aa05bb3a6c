//! The audit of what ApiKey resources grant. A grant (enterprise tier, limits, scopes,
//! suspension, spend cap) takes effect when the gateways load the published config, so no
//! dashboard or admin call writes its audit row; the Lease holder compares each config it
//! publishes with the grants the ledger database last recorded, and the store writes one audit
//! row per grant that changed (`key_grant_changed`, actor `operator`/`ApiKey`). The comparison
//! is durable, so a restart or a new leader audits nothing twice and misses nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crds::config::{GatewayConfig, KeyGrant};
use serde_json::Value;
use store::accounts::Accounts;
use store::audit::{Actor, ActorKind};
use tokio::sync::watch;

/// The audit log's name for grants made by ApiKey resources.
const GRANTOR: &str = "ApiKey";

/// How soon a failed recording is tried again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(15);

/// What the config grants each key, as the audit log shows it: the grant without its seed
/// (whose secret never leaves the config Secret).
pub fn grants_of(config: &GatewayConfig) -> BTreeMap<String, Value> {
    config
        .keys
        .iter()
        .filter_map(|(key_id, grant)| {
            let shown = KeyGrant {
                seed: None,
                ..grant.clone()
            };
            let mut value = serde_json::to_value(shown).ok()?;
            value.as_object_mut()?.remove("seed");
            Some((key_id.clone(), value))
        })
        .collect()
}

/// Records the grants of every new config, and again every `interval` (a key minted after its
/// ApiKey resource was published gets its row then), while `leading`.
pub async fn run(
    interval: Duration,
    mut leading: watch::Receiver<bool>,
    mut latest: watch::Receiver<Option<Arc<GatewayConfig>>>,
    accounts: Arc<dyn Accounts>,
) {
    let by = Actor::new(ActorKind::Operator, GRANTOR, None);
    loop {
        let lead = *leading.borrow_and_update();
        let config = latest.borrow_and_update().clone();
        let wait = match config.filter(|_| lead) {
            Some(config) => match accounts.record_key_grants(&grants_of(&config), &by).await {
                Ok(changes) => {
                    for change in &changes {
                        tracing::info!(key = %change.key_id, account = %change.account_id, "an ApiKey resource's grant changed; audited");
                    }
                    interval
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot record the ApiKey resources' grants");
                    interval.min(RETRY_AFTER_FAILURE)
                }
            },
            None => interval,
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            changed = leading.changed() => if changed.is_err() { return },
            changed = latest.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::config::{KeySeed, Secret};

    #[test]
    fn a_grant_is_audited_without_its_seeds_secret() {
        let mut config = GatewayConfig::default();
        config.keys.insert(
            "key_1".to_owned(),
            KeyGrant {
                tier: Some("enterprise".to_owned()),
                spend_cap: Some(500),
                seed: Some(KeySeed {
                    account: "acme".to_owned(),
                    secret: Secret("sk-svc-secret".to_owned()),
                    top_up_usd_cents: None,
                }),
                ..KeyGrant::default()
            },
        );
        let grants = grants_of(&config);
        let shown = grants["key_1"].to_string();
        assert!(!shown.contains("sk-svc-secret"), "{shown}");
        assert!(!shown.contains("seed"), "{shown}");
        assert_eq!(grants["key_1"]["tier"], "enterprise");
        assert_eq!(grants["key_1"]["spendCap"], 500);
    }
}
