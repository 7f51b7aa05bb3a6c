//! Start-up of both modes: config from a manifest folder (or, in a cluster, the Secret the
//! operator publishes), the stores chosen for the mode, the seeded keys and the dev account,
//! the background sweeps, then both listeners.

use std::sync::Arc;

use axum::extract::FromRef;
use crds::config::{GatewayConfig, ProviderKind, Route};
use thiserror::Error;

use crate::api::message_batches;
use crate::flags::dev_account::DevAccountArgs;
use crate::flags::payments::PaymentsArgs;
use crate::flags::published::{Published, PublishedError};
use crate::flags::{CommonArgs, ServeArgs, StandaloneArgs};
use crate::manifests;
use crate::serve::{self, ServeError, HARD_STOP_AFTER_GRACE};
use crate::state::{AppState, Services, Settings};
use gateway_core::auth::{self, KeySpec};
use gateway_core::ids;
use gateway_core::ledger_export::retention;
use gateway_core::limits::{
    AddressBrake, Dimension, Failover, LimitError, Limiter, MemoryLimiter, RedisLimiter,
};
use gateway_core::payments::reload::{AutoReloads, MemoryAutoReloads, PostgresAutoReloads};
use gateway_core::payments::stripe::{self, StripeSettingsError};
use gateway_core::payments::{
    self, NoPayments, PaymentError, PaymentProvider, Payments, TestPayments,
};
use gateway_core::providers::Providers;
use gateway_core::reaper;
use gateway_core::responses_store::Backend as ResponsesBackend;
use gateway_core::routing::breaker::Breakers;
use gateway_core::routing::Catalog;
use gateway_core::shutdown::Shutdown;
use gateway_core::tokens::Tokenizer;
use store::accounts::promotion::{standing, ENTERPRISE};
use store::accounts::{
    promotion, Accounts, KeyKind, MemoryAccounts, PostgresAccounts, PromotionRules, StoreError,
};
use store::audit::{Actor, ActorKind, AuditLog, PostgresAuditLog};
use store::batches::{BatchStore, MemoryBatchStore, PostgresBatchStore};
use store::db::{Database, DbError};
use store::developers::{DeveloperStore, MemoryDeveloperStore, PostgresDeveloperStore};
use store::files::{FileStore, MemoryFileStore, PostgresFileStore};
use store::ledger::partitions;
use store::ledger::{Ledger, LedgerError, MemoryLedger, PostgresLedger, CLOSE_WAIT};

mod warnings;

#[derive(Debug, Error)]
pub enum StartError {
    #[error("manifests: {0}")]
    Manifests(#[from] crds::manifests::ManifestError),
    #[error("--print-manifests: {0}")]
    PrintManifests(#[from] manifests::PrintError),
    #[error(
        "serve needs --config-secret (the operator's config) or --manifests DIR: the example \
         set built into the binary is standalone's, with a key whose secret is public"
    )]
    NoCatalog,
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
    Stripe(#[from] StripeSettingsError),
}

/// Stripe when it is configured, `otherwise` when it is not.
fn payments(
    args: &PaymentsArgs,
    otherwise: impl PaymentProvider + 'static,
) -> Result<Payments, StartError> {
    Ok(match args.stripe().build()? {
        Some(stripe) => Payments::stripe(stripe),
        None => Payments::other(otherwise),
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
    payments: Payments,
    auto_reloads: Arc<dyn AutoReloads>,
    developers: Arc<dyn DeveloperStore>,
    audit: Arc<dyn AuditLog>,
    responses: ResponsesBackend,
    batches: Arc<dyn BatchStore>,
    files: Arc<dyn FileStore>,
}

/// `gateway standalone`: everything in process, the promotion sweep on a timer.
pub async fn standalone(mut args: StandaloneArgs) -> Result<(), StartError> {
    if let Some(dir) = &args.print_manifests {
        for file in manifests::print(dir)? {
            println!("{}", file.display());
        }
        return Ok(());
    }
    // The test payment provider confirms through the signed webhook, so it needs a secret;
    // without one given, a random one only this process knows.
    args.common
        .payments
        .payment_webhook_secret
        .get_or_insert_with(ids::session_token);
    // Nobody else knows a secret made here, so it is shown once, on the ready line.
    let common = &mut args.common;
    if common.server.admin_token.is_none() {
        let token = ids::admin_token();
        common.generated.push(("admin_token", token.clone()));
        common.server.admin_token = Some(token);
    }
    if common.dev_account.dev_key.is_none() {
        let key = ids::key_secret();
        common.generated.push(("key", key.clone()));
        common.dev_account.dev_key = Some(key);
    }
    let stores = in_process_stores(&args.common)?;
    let interval = args.promotion.interval();
    let config = manifests::load(args.common.catalog.manifests.as_deref())?;
    warnings::standalone(
        &config,
        args.common.server.listen,
        stores.payments.stripe.is_some(),
    );
    run(
        args.common,
        stores,
        config,
        None,
        None,
        |services, rules| {
            tokio::spawn(promotion::every(
                services.accounts.clone(),
                rules,
                interval,
                services.shutdown.draining.clone(),
            ));
        },
    )
    .await
}

/// The edge's state as `standalone` builds it from `args` (in-process stores, the config of
/// the manifest folder, the seeded keys), without its background tasks or listeners: what the
/// router tests serve (`gateway/tests/router.rs`).
pub async fn in_process(args: &CommonArgs) -> Result<AppState, StartError> {
    let stores = in_process_stores(args)?;
    let config = manifests::load(args.catalog.manifests.as_deref())?;
    let (services, _) = assemble(args, stores, catalog_builder(args)(config)).await?;
    Ok(AppState::new(services))
}

/// `standalone`'s stores: all in process.
fn in_process_stores(args: &CommonArgs) -> Result<Stores, StartError> {
    let ledger = Arc::new(MemoryLedger::default());
    let audit = ledger.audit_log().clone();
    let (batches, files) = memory_batch_stores();
    Ok(Stores {
        accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
        auto_reloads: Arc::new(MemoryAutoReloads::new(ledger.clone(), audit.clone())),
        ledger,
        limiter: Arc::new(MemoryLimiter::default()),
        payments: payments(
            &args.payments,
            TestPayments {
                webhook_secret: args.payments.payment_webhook_secret.clone(),
            },
        )?,
        developers: Arc::new(MemoryDeveloperStore::new(audit.clone())),
        audit,
        responses: ResponsesBackend::memory(args.responses.memory_limits()),
        batches,
        files,
    })
}

/// The in-process batch and file stores: the batches read their input files from that file
/// store, and decide with it whether a file may be deleted or swept.
fn memory_batch_stores() -> (Arc<dyn BatchStore>, Arc<dyn FileStore>) {
    let files = Arc::new(MemoryFileStore::default());
    (Arc::new(MemoryBatchStore::reading(files.clone())), files)
}

/// `gateway serve`: limits shared through Redis under the chosen outage policy; accounts,
/// keys and credits in Postgres with `--database-url`, with the reaper running in every pod.
pub async fn cluster(args: ServeArgs) -> Result<(), StartError> {
    if args.common.server.admin_token.is_none() {
        return Err(StartError::NoAdminToken);
    }
    if args.published.config_secret.is_none() && args.common.catalog.manifests.is_none() {
        return Err(StartError::NoCatalog);
    }
    if args.common.dashboard.public_url.is_none() {
        tracing::warn!(
            "no --public-url: the dashboard's email links and Stripe's return URLs name this \
             pod's own address, which browsers outside the cluster cannot reach"
        );
    }
    // Alive from the start, whatever the stores and the config do meanwhile.
    let awaited = args
        .published
        .config_secret
        .as_ref()
        .map(ToString::to_string);
    let admin = Some(serve::WaitingAdmin::bind(args.common.server.admin_listen, awaited).await?);
    let redis = RedisLimiter::connect(&args.redis.settings()).await?;
    let limiter = Arc::new(Failover::new(
        redis,
        args.outage.redis_outage,
        args.outage.pods,
    ));
    let (config, published) = match &args.published.config_secret {
        Some(secret) => {
            let mut published = Published::connect(secret.clone()).await?;
            let config = published
                .first()
                .await
                .ok_or(StartError::NoPublishedConfig)?;
            (config, Some(published))
        }
        // A folder: checked at the start.
        None => (
            manifests::load(args.common.catalog.manifests.as_deref())?,
            None,
        ),
    };
    let Some(database) = args.database.connection.settings() else {
        let ledger = Arc::new(MemoryLedger::default());
        let audit = ledger.audit_log().clone();
        let (batches, files) = memory_batch_stores();
        let stores = Stores {
            accounts: Arc::new(MemoryAccounts::new(ledger.clone())),
            auto_reloads: Arc::new(MemoryAutoReloads::new(ledger.clone(), audit.clone())),
            ledger,
            limiter,
            payments: payments(&args.common.payments, NoPayments)?,
            developers: Arc::new(MemoryDeveloperStore::new(audit.clone())),
            audit,
            responses: ResponsesBackend::memory(args.common.responses.memory_limits()),
            batches,
            files,
        };
        return run(args.common, stores, config, published, admin, |_, _| {}).await;
    };
    let db = Database::connect_with(&database)?;
    // A certificate refused is a setting to fix, not an outage to serve through.
    if let Some(e) = db.refused_tls().await {
        return Err(e.into());
    }
    if args.database.migrate {
        db.migrate().await?;
    }
    // The longest a stopping process may still write after SIGTERM.
    let draining = args.common.server.shutdown_grace() + HARD_STOP_AFTER_GRACE + CLOSE_WAIT;
    let reaping = args.ledger.reaping(draining);
    // Allotments are spent only while the heartbeat is younger than half the stale time, so
    // a process cut off from Postgres stops before the reaper returns them.
    let ledger = Arc::new(
        PostgresLedger::new(db.clone())
            .with_allotments(args.ledger.allotment_turns, reaping.stale / 2),
    );
    // Registered before serving, so the first turns hold a lease and can use allotments.
    if let Err(e) = ledger.heartbeat().await {
        tracing::warn!(error = %e, "ledger heartbeat failed");
    }
    // Today's partition and the next days', before the first turn (every pod, idempotent);
    // the hourly job keeps them ahead and retains.
    let today = time::OffsetDateTime::now_utc().date();
    if let Err(e) = partitions::create_ahead(&db, today).await {
        tracing::warn!(error = %e, "could not create the ledger's partitions ahead; the hourly job retries");
    }
    let retention = args.ledger.retention.retention(reaping.max_turn);
    let retention_db = db.clone();
    let stores = Stores {
        accounts: Arc::new(PostgresAccounts::new(db.clone())),
        auto_reloads: Arc::new(PostgresAutoReloads::new(db.clone())),
        ledger: ledger.clone(),
        limiter,
        payments: payments(&args.common.payments, NoPayments)?,
        developers: Arc::new(PostgresDeveloperStore::new(db.clone())),
        audit: Arc::new(PostgresAuditLog::new(db.clone())),
        batches: Arc::new(PostgresBatchStore::new(db.clone())),
        files: Arc::new(PostgresFileStore::new(db.clone())),
        responses: ResponsesBackend::postgres(
            db,
            args.common.responses.retention(),
            args.common.responses.quota(),
        ),
    };
    run(
        args.common,
        stores,
        config,
        published,
        admin,
        |services, _| {
            tokio::spawn(reaper::run(
                ledger,
                reaping,
                services.shutdown.draining.clone(),
            ));
            tokio::spawn(retention::every(
                retention_db,
                retention,
                services.shutdown.draining.clone(),
            ));
        },
    )
    .await
}

/// How a mode turns a config into its catalog: the prices in credits, and the simulated
/// upstreams' delay when `--simulated-chunk-delay-ms` overrides it.
fn catalog_builder(args: &CommonArgs) -> impl Fn(GatewayConfig) -> Catalog + Send + 'static {
    let delay = args.catalog.simulated_chunk_delay_ms;
    let credits_per_usd = args.payments.credits_per_usd();
    move |mut config: GatewayConfig| {
        if let Some(delay) = delay {
            override_simulated_delay(&mut config, delay);
        }
        Catalog::new(config, credits_per_usd)
    }
}

/// Every service of a mode on its stores, and the keys it seeds: the one wiring both modes,
/// and the router tests, share.
async fn assemble(
    args: &CommonArgs,
    stores: Stores,
    catalog: Catalog,
) -> Result<(Services, ResponsesBackend), StartError> {
    let tokens = Tokenizer::default();
    let responses = stores.responses;
    let services = Services {
        catalog,
        tokens,
        accounts: stores.accounts,
        ledger: stores.ledger,
        unauthenticated: AddressBrake::new(
            "ip",
            Dimension::Unauthenticated,
            args.brakes.unauthenticated_per_minute,
            stores.limiter.clone(),
        ),
        sign_ins: AddressBrake::new(
            "signin",
            Dimension::SignIns,
            args.brakes.sign_ins_per_minute,
            stores.limiter.clone(),
        ),
        sign_ups: AddressBrake::new(
            "signup",
            Dimension::SignUps,
            args.brakes.sign_ups_per_minute,
            stores.limiter.clone(),
        ),
        limiter: stores.limiter,
        providers: Arc::new(Providers::new(tokens)),
        breakers: Breakers::new((&args.breaker).into()),
        shutdown: Shutdown::default(),
        developers: stores.developers,
        audit: stores.audit,
        payments: stores.payments,
        auto_reloads: stores.auto_reloads,
        responses: responses.store(),
        reasoning_seal: args.responses.sealer(),
        batches: stores.batches,
        files: stores.files,
        settings: Settings {
            credits_per_usd: args.payments.credits_per_usd(),
            dashboard: (&args.dashboard).into(),
            payment_webhook_secret: args.payments.payment_webhook_secret.clone(),
            trusted_proxies: args.server.trusted_proxies(),
            batches: (&args.batches).into(),
        },
    };
    seed_granted_keys(&services).await?;
    if let Some(dev_key) = &args.dev_account.dev_key {
        seed_dev_key(&services, &args.dev_account, dev_key).await?;
    }
    Ok((services, responses))
}

/// Runs the gateway on `config`, then on each version `published` brings.
async fn run(
    args: CommonArgs,
    stores: Stores,
    config: GatewayConfig,
    published: Option<Published>,
    admin: Option<serve::WaitingAdmin>,
    background: impl FnOnce(&Services, PromotionRules),
) -> Result<(), StartError> {
    let rules = PromotionRules::from_config(&config);
    let catalog = catalog_builder(&args);
    let version = config.version.clone();
    let (services, responses) = assemble(&args, stores, catalog(config)).await?;
    background(&services, rules);
    let draining = services.shutdown.draining.clone();
    if let Some(stripe) = services.payments.stripe.clone() {
        tokio::spawn(stripe::reloads::every(
            stripe,
            services.auto_reloads.clone(),
            args.payments.auto_reload_interval(),
            draining.clone(),
        ));
    }
    tokio::spawn(crate::dashboard::domains::recheck_every(
        services.developers.clone(),
        services.settings.dashboard.domains.clone(),
        draining.clone(),
    ));
    tokio::spawn(responses.purge_until(draining));
    let limiter = services.limiter.clone();
    let state = AppState::new(services);
    tokio::spawn(message_batches::worker::run(
        FromRef::from_ref(&state),
        state.shutdown().clone(),
    ));
    if let Some(published) = published {
        if let Some(pods) = published.pods() {
            limiter.set_pods(pods);
        }
        let state = state.clone();
        tokio::spawn(published.follow(
            version,
            move |config| state.replace_catalog(catalog(config)),
            move |pods| limiter.set_pods(pods),
        ));
    }
    let admin_bound = match admin {
        Some(admin) => Some(admin.hand_over().await?),
        None => None,
    };
    let listen = args
        .server
        .listen(admin_bound, args.generated)
        .ok_or(StartError::NoAdminToken)?;
    serve::run(state, listen).await?;
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
async fn seed_granted_keys(services: &Services) -> Result<(), StartError> {
    let seeds: Vec<(String, bool, crds::config::KeySeed)> = services
        .catalog
        .grants()
        .filter_map(|(id, g)| {
            let enterprise = g.tier.as_deref() == Some(ENTERPRISE);
            g.seed.clone().map(|seed| (id.clone(), enterprise, seed))
        })
        .collect();
    for (key_id, enterprise, seed) in seeds {
        let account = seed_account(services, &seed.account, 0).await?;
        if let Some(usd_cents) = seed.top_up_usd_cents {
            seed_top_up(services, &account.id, &format!("seed-{key_id}"), usd_cents).await?;
        }
        let minted = auth::mint(KeySpec {
            id: Some(key_id.clone()),
            tier: starting_tier(services, &account.id, enterprise).await?,
            account_id: account.id,
            name: key_id,
            kind: KeyKind::Api,
            scopes: Vec::new(),
            secret: Some(seed.secret.expose().to_owned()),
            expires_at: None,
            spend_cap: None,
        });
        seed_key(services, minted.record).await?;
    }
    Ok(())
}

/// Who seeds keys and top-ups from the manifests (the operator's custom resources) and the
/// dev-account flags, as the audit log names them.
fn seeder() -> Actor {
    Actor::new(ActorKind::Operator, "seed", None)
}

/// Confirms a seeded account's top-up once, by its reference, as if it had been paid.
async fn seed_top_up(
    services: &Services,
    account_id: &str,
    reference: &str,
    usd_cents: u64,
) -> Result<(), StartError> {
    let request = payments::TopUpRequest {
        account_id,
        reference,
        usd_cents,
        payment_id: None,
        by: &seeder(),
    };
    let confirmed = payments::confirm(
        services.accounts.as_ref(),
        services.ledger.as_ref(),
        services.settings.credits_per_usd,
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
    services: &Services,
    account_id: &str,
    enterprise: bool,
) -> Result<String, StartError> {
    if enterprise {
        return Ok(ENTERPRISE.to_owned());
    }
    let lifetime = services
        .ledger
        .balance(account_id)
        .await?
        .lifetime_top_up_cents;
    Ok(standing(services.catalog.tiers(), lifetime).tier)
}

/// The account of this name, created with `credits` when new (a database shared by pods or
/// kept across restarts already has it).
async fn seed_account(
    services: &Services,
    name: &str,
    credits: u64,
) -> Result<store::accounts::Account, StartError> {
    if let Some(account) = services.accounts.account_by_name(name).await? {
        return Ok(account);
    }
    let account = match services.accounts.create_account(name).await {
        Ok(account) => account,
        // Another pod created it first.
        Err(StoreError::Conflict(_)) => services
            .accounts
            .account_by_name(name)
            .await?
            .ok_or_else(|| StoreError::Conflict(format!("account `{name}` vanished")))?,
        Err(e) => return Err(e.into()),
    };
    services
        .ledger
        .add_credits(&account.id, credits, &seeder())
        .await?;
    Ok(account)
}

/// Stores a seeded key; one already stored (by another pod, or before a restart) is kept.
async fn seed_key(services: &Services, key: store::accounts::KeyRecord) -> Result<(), StartError> {
    match services.accounts.insert_key(key, &seeder()).await {
        Err(StoreError::Conflict(_)) => {
            tracing::info!("seeded key already stored; keeping it");
            Ok(())
        }
        other => Ok(other?),
    }
}

/// The dev account, with its confirmed top-up (once, by its reference) when one is asked
/// for, and its key, at the tier that top-up gives unless it is granted enterprise.
async fn seed_dev_key(
    services: &Services,
    args: &DevAccountArgs,
    key: &str,
) -> Result<(), StartError> {
    let account = seed_account(services, "dev", args.dev_credits).await?;
    let usd_cents = payments::parse_usd(&args.dev_top_up_usd)
        .ok_or_else(|| StartError::DevTopUp(args.dev_top_up_usd.clone()))?;
    if usd_cents > 0 {
        seed_top_up(services, &account.id, DEV_TOP_UP_REFERENCE, usd_cents).await?;
    }
    let tier = starting_tier(services, &account.id, args.dev_enterprise).await?;
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
    seed_key(services, minted.record).await
}
