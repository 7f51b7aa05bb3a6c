//! Start-up of both modes: config from a manifest folder (or, in a cluster, the Secret the
//! operator publishes), the stores chosen for the mode, the seeded keys and the dev account,
//! then both listeners.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use crds::config::{GatewayConfig, ProviderKind, Route};
use thiserror::Error;

use crate::accounts::{KeyKind, MemoryAccounts, StoreError};
use crate::auth::{self, KeySpec};
use crate::config::published::{Published, PublishedError};
use crate::config::{CommonArgs, ServeArgs};
use crate::ids;
use crate::ledger::{LedgerError, MemoryLedger};
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
    #[error("published config: {0}")]
    Published(#[from] PublishedError),
    #[error("the config Secret's watch ended before a config arrived")]
    NoPublishedConfig,
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
    let config = crds::manifests::load_dir(&args.manifests)?;
    run(args, Arc::new(MemoryLimiter::default()), config, None).await
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
    let (config, published) = match args.config_secret {
        Some(secret) => {
            let mut published = Published::connect(secret).await?;
            let config = published
                .first()
                .await
                .ok_or(StartError::NoPublishedConfig)?;
            (config, Some(published))
        }
        None => (crds::manifests::load_dir(&args.common.manifests)?, None),
    };
    run(args.common, Arc::new(limiter), config, published).await
}

async fn run(
    args: CommonArgs,
    limiter: Arc<dyn Limiter>,
    config: GatewayConfig,
    published: Option<Published>,
) -> Result<(), StartError> {
    if !config.tiers.contains_key(&args.dev_tier) {
        return Err(StartError::MissingTier(args.dev_tier));
    }
    let delay = args.simulated_chunk_delay_ms;
    let credits_per_usd = args.credits_per_usd;
    let catalog = move |mut config: GatewayConfig| {
        if let Some(delay) = delay {
            override_simulated_delay(&mut config, delay);
        }
        Catalog::new(config, credits_per_usd)
    };
    let version = config.version.clone();
    let tokens = Tokenizer::default();
    let state = AppState::new(Services {
        catalog: ArcSwap::from_pointee(catalog(config)),
        tokens,
        accounts: Arc::new(MemoryAccounts::default()),
        ledger: Arc::new(MemoryLedger::default()),
        limiter,
        providers: Providers::new(Arc::new(Simulated::new(tokens))),
        shutdown: Shutdown::default(),
        credits_per_usd: args.credits_per_usd,
    });
    seed_granted_keys(&state).await?;
    let dev_key = seed_dev_key(&state, &args).await?;
    if let Some(published) = published {
        let state = state.clone();
        tokio::spawn(published.follow(version, move |config| {
            state.replace_catalog(catalog(config));
        }));
    }
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
