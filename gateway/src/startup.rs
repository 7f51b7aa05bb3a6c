//! Start-up of both modes: config from a manifest folder (or, in a cluster, the Secret the
//! operator publishes), the stores chosen for the mode, the seeded keys and the dev account,
//! the background sweeps, then both listeners.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use crds::config::{GatewayConfig, ProviderKind, Route};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::auth::{self, KeySpec};
use crate::client_address::TrustedProxies;
use crate::config::published::{Published, PublishedError};
use crate::config::{CommonArgs, ServeArgs, StandaloneArgs};
use crate::dashboard::DashboardConfig;
use crate::ids;
use crate::limits::{
    AddressBrake, Dimension, Failover, LimitError, Limiter, MemoryLimiter, RedisLimiter,
};
use crate::payments::reload::{self, AutoReloads, MemoryAutoReloads, PostgresAutoReloads};
use crate::payments::stripe::{StripeConfig, StripeConfigError};
use crate::payments::{self, NoPayments, PaymentError, PaymentProvider, TestPayments};
use crate::providers::Providers;
use crate::responses_store::Backend as ResponsesBackend;
use crate::routing::breaker::BreakerPolicy;
use crate::routing::Catalog;
use crate::seal::Sealer;
use crate::serve::{self, ServeError, HARD_STOP_AFTER_GRACE};
use crate::shutdown::Shutdown;
use crate::state::{AppState, Services};
use crate::tokens::Tokenizer;
use store::accounts::promotion::{standing, ENTERPRISE};
use store::accounts::{
    promotion, Accounts, KeyKind, MemoryAccounts, PostgresAccounts, PromotionRules, StoreError,
};
use store::db::{Database, DbError};
use store::developers::{DeveloperStore, MemoryDeveloperStore, PostgresDeveloperStore};
use store::ledger::{Ledger, LedgerError, MemoryLedger, PostgresLedger, CLOSE_WAIT};

mod warnings;

#[derive(Debug, Error)]
pub enum StartError {
    #[error("manifests: {0}")]
    Manifests(#[from] crds::manifests::ManifestError),
    #[error("published config: {0}")]
    Published(#[from] PublishedError),
    #[error("the config Secret's watch ended before a config arrived")]
    NoPublishedConfig,
    #[error("--dev-top-up-usd: expected dollars like 10 or 0, not `{0}`")]
    DevTopUp(String),
    #[error("a seeded account's top-up: {0}")]
    SeedPayment(#[from] PaymentError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Limiter(#[from] LimitError),
    #[error("database: {0}")]
    Db(#[from] DbError),
    #[error(
        "serve needs --admin-token (or GATEWAY_ADMIN_TOKEN): a generated one could not be shown"
    )]
    NoAdminToken,
    #[error(transparent)]
    Stripe(#[from] StripeConfigError),
}

/// Stripe when it is configured, `otherwise` when it is not.
fn payments(
    args: &CommonArgs,
    otherwise: impl PaymentProvider + 'static,
) -> Result<Arc<dyn PaymentProvider>, StartError> {
    let stripe = StripeConfig {
        api_key: args.stripe_api_key.as_deref(),
        webhook_secret: args.stripe_webhook_secret.as_deref(),
        api_base: &args.stripe_api_base,
    }
    .build()?;
    Ok(match stripe {
        Some(stripe) => Arc::new(stripe),
        None => Arc::new(otherwise),
    })
}

/// The dev key's id, the same in every process, so that pods share its limits.
const DEV_KEY_ID: &str = "key_dev";
/// The payment reference of the dev account's top-up: confirmed once, by whichever pod starts
/// first.
const DEV_TOP_UP_REFERENCE: &str = "dev-account-top-up";

/// The stores of a mode, chosen once here.
struct Stores {
    accounts: Arc<dyn Accounts>,
    ledger: Arc<dyn Ledger>,
    limiter: Arc<dyn Limiter>,
    payments: Arc<dyn PaymentProvider>,
    auto_reloads: Arc<dyn AutoReloads>,
    developers: Arc<dyn DeveloperStore>,
    responses: ResponsesBackend,
}

/// `gateway standalone`: everything in process, the promotion sweep on a timer.
pub async fn standalone(mut args: StandaloneArgs) -> Result<(), StartError> {
    // The test payment provider confirms through the signed webhook, so it needs a secret;
    // without one given, a random one only this process knows.
    args.common
        .payment_webhook_secret
        .get_or_insert_with(ids::session_token);
    // Nobody else knows a secret made here, so it is shown once, on the ready line.
    let common = &mut args.common;
    if common.admin_token.is_none() {
        let token = ids::admin_token();
        common.generated.push(("admin_token", token.clone()));
        common.admin_token = Some(token);
    }
    if common.dev_key.is_none() {
        let key = ids::key_secret();
        common.generated.push(("key", key.clone()));
        common.dev_key = Some(key);
    }
    let ledger = Arc::new(MemoryLedger::default());
    let stores = Stores {
        accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
        auto_reloads: Arc::new(MemoryAutoReloads::new(ledger.clone())),
        ledger,
        limiter: Arc::new(MemoryLimiter::default()),
        payments: payments(
            &args.common,
            TestPayments {
                webhook_secret: args.common.payment_webhook_secret.clone(),
            },
        )?,
        developers: Arc::new(MemoryDeveloperStore::default()),
        responses: ResponsesBackend::memory(&args.common.responses_store),
    };
    let interval = Duration::from_secs(args.promotion_interval_secs);
    let config = crds::manifests::load_dir(&args.common.manifests)?;
    warnings::standalone(
        &config,
        args.common.listen,
        stores.payments.stripe().is_some(),
    );
    run(args.common, stores, config, None, None, |state, rules| {
        tokio::spawn(promotion::every(
            state.accounts.clone(),
            rules,
            interval,
            state.shutdown.draining.clone(),
        ));
    })
    .await
}

/// `gateway serve`: limits shared through Redis under the chosen outage policy; accounts,
/// keys and credits in Postgres with `--database-url`, with the reaper running in every pod.
pub async fn cluster(args: ServeArgs) -> Result<(), StartError> {
    if args.common.admin_token.is_none() {
        return Err(StartError::NoAdminToken);
    }
    // Alive from the start, whatever the stores and the config do meanwhile.
    let admin = Some(serve::WaitingAdmin::bind(args.common.admin_listen).await?);
    let redis = RedisLimiter::connect(
        &args.redis_url,
        Duration::from_millis(args.redis_timeout_ms),
        Duration::from_secs(args.stream_lease_secs.max(1)),
    )
    .await?;
    let limiter = Arc::new(Failover::new(redis, args.redis_outage, args.pods));
    let (config, published) = match &args.config_secret {
        Some(secret) => {
            let mut published = Published::connect(secret.clone()).await?;
            let config = published
                .first()
                .await
                .ok_or(StartError::NoPublishedConfig)?;
            (config, Some(published))
        }
        None => (crds::manifests::load_dir(&args.common.manifests)?, None),
    };
    let Some(url) = &args.database_url else {
        let ledger = Arc::new(MemoryLedger::default());
        let stores = Stores {
            accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
            auto_reloads: Arc::new(MemoryAutoReloads::new(ledger.clone())),
            ledger,
            limiter,
            payments: payments(&args.common, NoPayments)?,
            developers: Arc::new(MemoryDeveloperStore::default()),
            responses: ResponsesBackend::memory(&args.common.responses_store),
        };
        return run(args.common, stores, config, published, admin, |_, _| {}).await;
    };
    let db = Database::connect_through(
        url,
        args.database_pool_size,
        Duration::from_millis(args.database_timeout_ms),
        args.database_pooler,
    )?;
    if args.migrate {
        db.migrate().await?;
    }
    let reaping = Reaping {
        stale: Duration::from_secs(args.reaper_stale_secs.max(1)),
        max_turn: Duration::from_secs(args.reaper_max_turn_secs.max(1)),
        // The longest a stopping process may still write after SIGTERM.
        draining: Duration::from_secs(args.common.shutdown_grace_secs)
            + HARD_STOP_AFTER_GRACE
            + CLOSE_WAIT,
    };
    // Allotments are spent only while the heartbeat is younger than half the stale time, so
    // a process cut off from Postgres stops before the reaper returns them.
    let ledger = Arc::new(
        PostgresLedger::new(db.clone()).with_allotments(args.allotment_turns, reaping.stale / 2),
    );
    // Registered before serving, so the first turns hold a lease and can use allotments.
    if let Err(e) = ledger.heartbeat().await {
        tracing::warn!(error = %e, "ledger heartbeat failed");
    }
    let stores = Stores {
        accounts: Arc::new(PostgresAccounts::new(db.clone())),
        auto_reloads: Arc::new(PostgresAutoReloads::new(db.clone())),
        ledger: ledger.clone(),
        limiter,
        payments: payments(&args.common, NoPayments)?,
        developers: Arc::new(PostgresDeveloperStore::new(db.clone())),
        responses: ResponsesBackend::postgres(db, &args.common.responses_store),
    };
    run(args.common, stores, config, published, admin, |state, _| {
        tokio::spawn(reaper(ledger, reaping, state.shutdown.draining.clone()));
    })
    .await
}

#[derive(Clone, Copy)]
struct Reaping {
    stale: Duration,
    max_turn: Duration,
    /// How long a stopping process announces it may still write.
    draining: Duration,
}

/// Beats this process' heartbeat and releases orphaned reservations, every third of `stale`.
/// Every pod runs it; the release is idempotent, so they never conflict. The heartbeat goes
/// on through shutdown, until the ledger has written its last row (a stopping process is not
/// dead); from SIGTERM the process announces how long it may take and stops reaping.
async fn reaper(ledger: Arc<PostgresLedger>, reaping: Reaping, draining: CancellationToken) {
    let mut ticks = tokio::time::interval(reaping.stale / 3);
    let mut announced = false;
    loop {
        tokio::select! {
            _ = ledger.closed() => return,
            _ = draining.cancelled(), if !announced => {
                announced = true;
                if let Err(e) = ledger.drain(reaping.draining).await {
                    tracing::warn!(error = %e, "could not announce the drain; the heartbeat keeps the lease");
                }
                continue;
            }
            _ = ticks.tick() => {}
        }
        if let Err(e) = ledger.heartbeat().await {
            tracing::warn!(error = %e, "ledger heartbeat failed");
            continue;
        }
        if announced || !ledger.may_reap(reaping.stale) {
            continue;
        }
        match ledger.reap(reaping.stale, reaping.max_turn).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(released = n, "released orphaned reservations"),
            Err(e) => tracing::warn!(error = %e, "reaper failed; retrying at the next tick"),
        }
    }
}

/// Runs the gateway on `config`, then on each version `published` brings.
async fn run(
    args: CommonArgs,
    stores: Stores,
    config: GatewayConfig,
    published: Option<Published>,
    admin: Option<serve::WaitingAdmin>,
    background: impl FnOnce(&AppState, PromotionRules),
) -> Result<(), StartError> {
    let rules = PromotionRules::from_config(&config);
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
    let responses = stores.responses;
    let state = AppState::new(Services {
        catalog: ArcSwap::from_pointee(catalog(config)),
        tokens,
        accounts: stores.accounts,
        ledger: stores.ledger,
        unauthenticated: AddressBrake::new(
            "ip",
            Dimension::Unauthenticated,
            args.unauthenticated_per_minute,
            stores.limiter.clone(),
        ),
        sign_ins: AddressBrake::new(
            "signin",
            Dimension::SignIns,
            args.sign_ins_per_minute,
            stores.limiter.clone(),
        ),
        sign_ups: AddressBrake::new(
            "signup",
            Dimension::SignUps,
            args.sign_ups_per_minute,
            stores.limiter.clone(),
        ),
        trusted_proxies: TrustedProxies::new(args.trusted_proxies.clone()),
        limiter: stores.limiter,
        providers: Arc::new(Providers::new(
            tokens,
            BreakerPolicy {
                failures: args.breaker_failures.max(1),
                cooldown: Duration::from_millis(args.breaker_cooldown_ms),
            },
        )),
        shutdown: Shutdown::default(),
        credits_per_usd: args.credits_per_usd,
        payment_webhook_secret: args.payment_webhook_secret.clone(),
        developers: stores.developers,
        payments: stores.payments,
        auto_reloads: stores.auto_reloads,
        responses: responses.store(),
        reasoning_seal: Sealer::new(args.responses_secret.as_deref()),
        dashboard: DashboardConfig {
            secure_cookies: args.dashboard_secure_cookies,
            signup_credits: args.signup_credits,
        },
    });
    seed_granted_keys(&state).await?;
    if let Some(dev_key) = &args.dev_key {
        seed_dev_key(&state, &args, dev_key).await?;
    }
    background(&state, rules);
    if state.payments.stripe().is_some() {
        tokio::spawn(reload::every(
            state.payments.clone(),
            state.auto_reloads.clone(),
            Duration::from_millis(args.auto_reload_interval_ms.max(1)),
            state.shutdown.draining.clone(),
        ));
    }
    tokio::spawn(responses.purge_until(state.shutdown.draining.clone()));
    if let Some(published) = published {
        if let Some(pods) = published.pods() {
            state.limiter.set_pods(pods);
        }
        let (state, limiter) = (state.clone(), state.limiter.clone());
        tokio::spawn(published.follow(
            version,
            move |config| state.replace_catalog(catalog(config)),
            move |pods| limiter.set_pods(pods),
        ));
    }
    let admin_token = args.admin_token.clone().ok_or(StartError::NoAdminToken)?;
    let edge = serve::Edge::from_args(&args);
    let admin_bound = match admin {
        Some(admin) => Some(admin.hand_over().await?),
        None => None,
    };
    serve::run(
        state,
        serve::Listen {
            api: args.listen,
            admin: args.admin_listen,
            admin_bound,
            metrics: args.metrics_listen,
            admin_token,
            generated: args.generated,
            delay: Duration::from_secs(args.shutdown_delay_secs),
            grace: Duration::from_secs(args.shutdown_grace_secs),
            edge,
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

/// Creates the keys that ApiKey manifests seed from a Secret, with their accounts (and their
/// accounts' top-ups, which give the keys their tiers).
async fn seed_granted_keys(state: &AppState) -> Result<(), StartError> {
    let seeds: Vec<(String, bool, crds::config::KeySeed)> = state
        .catalog()
        .grants()
        .filter_map(|(id, g)| {
            let enterprise = g.tier.as_deref() == Some(ENTERPRISE);
            g.seed.clone().map(|seed| (id.clone(), enterprise, seed))
        })
        .collect();
    for (key_id, enterprise, seed) in seeds {
        let account = seed_account(state, &seed.account, 0).await?;
        if let Some(usd_cents) = seed.top_up_usd_cents {
            seed_top_up(state, &account.id, &format!("seed-{key_id}"), usd_cents).await?;
        }
        let minted = auth::mint(KeySpec {
            id: Some(key_id.clone()),
            tier: starting_tier(state, &account.id, enterprise).await?,
            account_id: account.id,
            name: key_id,
            kind: KeyKind::Api,
            scopes: Vec::new(),
            secret: Some(seed.secret.expose().to_owned()),
            expires_at: None,
            spend_cap: None,
        });
        seed_key(state, minted.record).await?;
    }
    Ok(())
}

/// Confirms a seeded account's top-up once, by its reference, as if it had been paid.
async fn seed_top_up(
    state: &AppState,
    account_id: &str,
    reference: &str,
    usd_cents: u64,
) -> Result<(), StartError> {
    let request = payments::TopUpRequest {
        account_id,
        reference,
        usd_cents,
        payment_id: None,
    };
    let confirmed = payments::confirm(
        state.accounts.as_ref(),
        state.ledger.as_ref(),
        state.credits_per_usd,
        request,
    )
    .await;
    match confirmed {
        Ok(_) => Ok(()),
        // A database kept from a start with another amount: its top-up stands.
        Err(PaymentError::Ledger(LedgerError::TopUpMismatch)) => {
            tracing::warn!(
                reference,
                "a seeded top-up was confirmed earlier with another amount; kept"
            );
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The tier a seeded key starts at: enterprise when granted, else its account's top-up tier.
async fn starting_tier(
    state: &AppState,
    account_id: &str,
    enterprise: bool,
) -> Result<String, StartError> {
    if enterprise {
        return Ok(ENTERPRISE.to_owned());
    }
    let lifetime = state
        .ledger
        .balance(account_id)
        .await?
        .lifetime_top_up_cents;
    Ok(standing(state.catalog().tiers(), lifetime).tier)
}

/// The account of this name, created with `credits` when new (a database shared by pods or
/// kept across restarts already has it).
async fn seed_account(
    state: &AppState,
    name: &str,
    credits: u64,
) -> Result<store::accounts::Account, StartError> {
    if let Some(account) = state.accounts.account_by_name(name).await? {
        return Ok(account);
    }
    let account = match state.accounts.create_account(name).await {
        Ok(account) => account,
        // Another pod created it first.
        Err(StoreError::Conflict(_)) => state
            .accounts
            .account_by_name(name)
            .await?
            .ok_or_else(|| StoreError::Conflict(format!("account `{name}` vanished")))?,
        Err(e) => return Err(e.into()),
    };
    state.ledger.grant(&account.id, credits).await?;
    Ok(account)
}

/// Stores a seeded key; one already stored (by another pod, or before a restart) is kept.
async fn seed_key(state: &AppState, key: store::accounts::KeyRecord) -> Result<(), StartError> {
    match state.accounts.insert_key(key).await {
        Err(StoreError::Conflict(_)) => {
            tracing::info!("seeded key already stored; keeping it");
            Ok(())
        }
        other => Ok(other?),
    }
}

/// The dev account, with its confirmed top-up (once, by its reference) when one is asked
/// for, and its key, at the tier that top-up gives unless it is granted enterprise.
async fn seed_dev_key(state: &AppState, args: &CommonArgs, key: &str) -> Result<(), StartError> {
    let account = seed_account(state, "dev", args.dev_credits).await?;
    let usd_cents = payments::parse_usd(&args.dev_top_up_usd)
        .ok_or_else(|| StartError::DevTopUp(args.dev_top_up_usd.clone()))?;
    if usd_cents > 0 {
        seed_top_up(state, &account.id, DEV_TOP_UP_REFERENCE, usd_cents).await?;
    }
    let tier = starting_tier(state, &account.id, args.dev_enterprise).await?;
    let minted = auth::mint(KeySpec {
        id: Some(DEV_KEY_ID.to_owned()),
        account_id: account.id,
        name: "dev".to_owned(),
        kind: KeyKind::Api,
        scopes: Vec::new(),
        tier,
        secret: Some(key.to_owned()),
        expires_at: None,
        spend_cap: None,
    });
    seed_key(state, minted.record).await
}
