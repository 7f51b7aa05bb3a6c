//! Start-up of both modes: config from a manifest folder, the stores chosen for the mode, the
//! seeded keys and the dev account, then both listeners.

use std::sync::Arc;
use std::time::Duration;

use crds::config::{GatewayConfig, ProviderKind, Route};
use thiserror::Error;

use crate::accounts::{KeyKind, MemoryAccounts, StoreError};
use crate::auth::{self, KeySpec};
use crate::config::{CommonArgs, ServeArgs};
use crate::dashboard::{DashboardConfig, MemoryDeveloperStore, TestPayments};
use crate::ids;
use crate::ledger::{Ledger, LedgerError, MemoryLedger};
use crate::limits::{Failover, LimitError, Limiter, MemoryLimiter, RedisLimiter};
use crate::providers::{Providers, Simulated};
use crate::routing::Catalog;
use crate::serve::{self, ServeError};
use crate::state::{AppState, Services, Shutdown};
use crate::tokens::Tokenizer;

#[derive(Debug, Error)]
pub enum StartError {
    #[error("manifests: {0}")]
    Manifests(#[from] crds::manifests::ManifestError),
    #[error("the manifests define no `{0}` tier")]
    MissingTier(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Limiter(#[from] LimitError),
}

/// The dev key's id, the same in every process, so that pods share its limits.
const DEV_KEY_ID: &str = "key_dev";

/// `gateway standalone`: everything in process.
pub async fn standalone(args: CommonArgs) -> Result<(), StartError> {
    run(args, Arc::new(MemoryLimiter::default())).await
}

/// `gateway serve`: limits shared through Redis under the chosen outage policy.
pub async fn cluster(args: ServeArgs) -> Result<(), StartError> {
    let redis = RedisLimiter::connect(
        &args.redis_url,
        Duration::from_millis(args.redis_timeout_ms),
        Duration::from_secs(args.stream_lease_secs.max(1)),
    )
    .await?;
    let limiter = Failover::new(redis, args.redis_outage, args.pods);
    run(args.common, Arc::new(limiter)).await
}

async fn run(args: CommonArgs, limiter: Arc<dyn Limiter>) -> Result<(), StartError> {
    let mut config = crds::manifests::load_dir(&args.manifests)?;
    if let Some(delay) = args.simulated_chunk_delay_ms {
        override_simulated_delay(&mut config, delay);
    }
    if !config.tiers.contains_key(&args.dev_tier) {
        return Err(StartError::MissingTier(args.dev_tier));
    }
    let tokens = Tokenizer::default();
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::default());
    let state = AppState::new(Services {
        catalog: Catalog::new(config, args.credits_per_usd),
        tokens,
        accounts: Arc::new(MemoryAccounts::default()),
        ledger: ledger.clone(),
        limiter,
        providers: Providers::new(Arc::new(Simulated::new(tokens))),
        shutdown: Shutdown::default(),
        credits_per_usd: args.credits_per_usd,
        developers: Arc::new(MemoryDeveloperStore::default()),
        payments: Arc::new(TestPayments::new(ledger, args.credits_per_usd)),
        dashboard: DashboardConfig {
            secure_cookies: args.dashboard_secure_cookies,
            signup_credits: args.signup_credits,
        },
    });
    seed_granted_keys(&state).await?;
    let dev_key = seed_dev_key(&state, &args).await?;
    let admin_token = args.admin_token.clone().unwrap_or_else(ids::admin_token);
    serve::run(
        state,
        serve::Listen {
            api: args.listen,
            admin: args.admin_listen,
            admin_token,
            dev_key,
            grace: Duration::from_secs(args.shutdown_grace_secs),
        },
    )
    .await?;
    Ok(())
}

fn override_simulated_delay(config: &mut GatewayConfig, delay: u64) {
    for model in config.models.values_mut() {
        if let Route::Upstreams(upstreams) = &mut model.route {
            upstreams
                .iter_mut()
                .filter(|u| u.provider == ProviderKind::Simulated)
                .for_each(|u| u.chunk_delay_ms = delay);
        }
    }
}

/// Creates the keys that ApiKey manifests seed from a Secret, with their accounts.
async fn seed_granted_keys(state: &AppState) -> Result<(), StartError> {
    let seeds: Vec<(String, String, crds::config::KeySeed)> = state
        .catalog()
        .grants()
        .filter_map(|(id, g)| {
            let tier = g.tier.clone().unwrap_or_else(|| "free".to_owned());
            g.seed.clone().map(|seed| (id.clone(), tier, seed))
        })
        .collect();
    for (key_id, tier, seed) in seeds {
        let account = match state.accounts.account_by_name(&seed.account).await? {
            Some(account) => account,
            None => {
                let account = state.accounts.create_account(&seed.account).await?;
                state.ledger.grant(&account.id, 0).await?;
                account
            }
        };
        let minted = auth::mint(KeySpec {
            id: Some(key_id.clone()),
            account_id: account.id,
            name: key_id,
            kind: KeyKind::Api,
            scopes: Vec::new(),
            tier,
            secret: Some(seed.secret.expose().to_owned()),
        });
        state.accounts.insert_key(minted.record).await?;
    }
    Ok(())
}

async fn seed_dev_key(state: &AppState, args: &CommonArgs) -> Result<String, StartError> {
    let account = state.accounts.create_account("dev").await?;
    state.ledger.grant(&account.id, args.dev_credits).await?;
    let minted = auth::mint(KeySpec {
        id: Some(DEV_KEY_ID.to_owned()),
        account_id: account.id,
        name: "dev".to_owned(),
        kind: KeyKind::Api,
        scopes: Vec::new(),
        tier: args.dev_tier.clone(),
        secret: args.dev_key.clone(),
    });
    state.accounts.insert_key(minted.record).await?;
    Ok(minted.secret)
}
