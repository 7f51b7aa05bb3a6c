//! The state of the HTTP edge, per surface. Start-up hands over every store and setting at once
//! ([`Services`]); [`AppState::new`] cuts them into what each surface uses, once, and axum's
//! `FromRef` gives each handler and layer its surface's part (`State<Arc<TurnApi>>`, ...), so a
//! handler sees only what it uses and a request clones one `Arc` for it.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::extract::FromRef;

use crate::api::message_batches::settings::BatchSettings;
use crate::client_address::TrustedProxies;
use crate::dashboard::settings::DashboardSettings;
use gateway_core::limits::{AddressBrake, Limiter};
use gateway_core::payments::reload::AutoReloads;
use gateway_core::payments::{Books, Payments};
use gateway_core::providers::Providers;
use gateway_core::responses_store::ResponseStore;
use gateway_core::routing::breaker::Breakers;
use gateway_core::routing::Catalog;
use gateway_core::seal::Sealer;
use gateway_core::shutdown::Shutdown;
use gateway_core::tokens::Tokenizer;
use gateway_core::turn::{TurnServices, Turns};
use store::accounts::Accounts;
use store::audit::AuditLog;
use store::batches::BatchStore;
use store::developers::DeveloperStore;
use store::files::FileStore;
use store::ledger::Ledger;

/// Every store and setting start-up chose, before they are cut per surface.
pub struct Services {
    pub catalog: Catalog,
    pub tokens: Tokenizer,
    pub accounts: Arc<dyn Accounts>,
    pub ledger: Arc<dyn Ledger>,
    pub limiter: Arc<dyn Limiter>,
    /// `/v1` requests without a valid key, per client address (a key-guessing brake).
    pub unauthenticated: AddressBrake,
    /// Dashboard sign-in attempts, per client address.
    pub sign_ins: AddressBrake,
    /// Dashboard sign-ups, per client address (each one is an account and its free credits).
    pub sign_ups: AddressBrake,
    pub providers: Arc<Providers>,
    pub breakers: Breakers,
    pub shutdown: Shutdown,
    /// Dashboard users, sessions and checkouts.
    pub developers: Arc<dyn DeveloperStore>,
    /// The audit log's read side (the stores write it).
    pub audit: Arc<dyn AuditLog>,
    pub payments: Payments,
    /// Auto-reload rules and saved cards.
    pub auto_reloads: Arc<dyn AutoReloads>,
    /// Stored responses of `/v1/responses`.
    pub responses: Arc<dyn ResponseStore>,
    /// Seals the thinking handed to stateless Responses API clients.
    pub reasoning_seal: Sealer,
    /// Message Batches and their items.
    pub batches: Arc<dyn BatchStore>,
    /// Uploads of `/v1/files`.
    pub files: Arc<dyn FileStore>,
    pub settings: Settings,
}

/// What the operator chose at start-up (`flags/`), apart from the services built from it.
pub struct Settings {
    pub credits_per_usd: u64,
    pub dashboard: DashboardSettings,
    /// The payment provider's webhook secret; the webhook is off without it.
    pub payment_webhook_secret: Option<String>,
    /// Whose `X-Forwarded-For` names the client.
    pub trusted_proxies: TrustedProxies,
    pub batches: BatchSettings,
}

/// The catalog every surface reads, replaced whole when a new config is published; a reader
/// keeps the snapshot it loaded (a turn, the models it resolved) whatever is published meanwhile.
#[derive(Clone)]
pub struct LiveCatalog(Arc<ArcSwap<Catalog>>);

impl LiveCatalog {
    fn new(catalog: Catalog) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(catalog)))
    }

    pub fn load(&self) -> Arc<Catalog> {
        self.0.load_full()
    }
}

/// The `/v1` model endpoints (messages, chat completions, responses, count_tokens, models):
/// what a turn uses, and the Responses API's stored responses and seal.
pub struct TurnApi {
    catalog: LiveCatalog,
    /// Held once, so a turn clones two `Arc`s: this and its catalog snapshot.
    services: Arc<TurnServices>,
    pub responses: Arc<dyn ResponseStore>,
    pub reasoning_seal: Sealer,
}

impl TurnApi {
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load()
    }

    /// What a turn uses, with the catalog as it is now.
    pub fn turns(&self) -> Turns {
        Turns::new(self.catalog(), self.services.clone())
    }
}

/// count_tokens reads the tokenizer and the limiter as a turn would.
impl Deref for TurnApi {
    type Target = TurnServices;
    fn deref(&self) -> &TurnServices {
        &self.services
    }
}

/// `/v1/messages/batches`, `/v1/batches` and `/v1/files`, and the worker every process runs
/// for the batches: the turns, the batch and file stores, the accounts an item's key is looked
/// up in when it runs, the batch settings.
pub struct BatchApi {
    pub turns: Arc<TurnApi>,
    pub batches: Arc<dyn BatchStore>,
    pub files: Arc<dyn FileStore>,
    pub accounts: Arc<dyn Accounts>,
    pub settings: BatchSettings,
}

/// `/v1/account` and `/v1/usage`: the caller's balance and usage.
pub struct AccountApi {
    catalog: LiveCatalog,
    pub ledger: Arc<dyn Ledger>,
    pub credits_per_usd: u64,
}

impl AccountApi {
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load()
    }
}

/// The layers every `/v1` request passes: the address brake and the key lookup (auth), the
/// refusal of a key known over its limit and the count of a request no admission counted,
/// and the rate-limit headers (the limiter).
pub struct Gate {
    catalog: LiveCatalog,
    pub accounts: Arc<dyn Accounts>,
    pub limiter: Arc<dyn Limiter>,
    pub unauthenticated: AddressBrake,
    pub trusted_proxies: Arc<TrustedProxies>,
}

impl Gate {
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load()
    }
}

/// The `/developers` pages: users and sessions, keys, balances and usage, billing.
pub struct DashboardState {
    catalog: LiveCatalog,
    pub accounts: Arc<dyn Accounts>,
    pub ledger: Arc<dyn Ledger>,
    pub developers: Arc<dyn DeveloperStore>,
    pub audit: Arc<dyn AuditLog>,
    pub payments: Payments,
    pub auto_reloads: Arc<dyn AutoReloads>,
    /// What a checkout moves and records.
    pub books: Books,
    pub sign_ins: AddressBrake,
    pub sign_ups: AddressBrake,
    pub settings: DashboardSettings,
    pub credits_per_usd: u64,
}

impl DashboardState {
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load()
    }
}

/// The payment webhooks: the provider, the generic webhook's secret, and the books a confirmed
/// payment moves.
pub struct Webhooks {
    pub books: Books,
    pub payments: Payments,
    /// The generic webhook is off (404) without it.
    pub payment_webhook_secret: Option<String>,
}

/// The admin API and the probes: accounts, keys, top-ups, the stores' reachability, draining.
pub struct AdminState {
    catalog: LiveCatalog,
    pub accounts: Arc<dyn Accounts>,
    pub ledger: Arc<dyn Ledger>,
    /// Whose email a dashboard account's owner verified: none takes keys or credits before.
    pub developers: Arc<dyn DeveloperStore>,
    pub audit: Arc<dyn AuditLog>,
    pub limiter: Arc<dyn Limiter>,
    pub shutdown: Shutdown,
    pub credits_per_usd: u64,
}

impl AdminState {
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load()
    }
}

/// The whole edge's state: each surface's part, built once. Cloned per request (one `Arc`),
/// then narrowed by `FromRef` (one more).
#[derive(Clone)]
pub struct AppState(Arc<Surfaces>);

struct Surfaces {
    catalog: LiveCatalog,
    /// The process' own uses: shutdown, and the stores it closes.
    turn_services: Arc<TurnServices>,
    turn_api: Arc<TurnApi>,
    batch_api: Arc<BatchApi>,
    account_api: Arc<AccountApi>,
    gate: Arc<Gate>,
    dashboard: Arc<DashboardState>,
    webhooks: Arc<Webhooks>,
    admin: Arc<AdminState>,
    trusted_proxies: Arc<TrustedProxies>,
}

impl AppState {
    /// The API listener is bound: links the dashboard sends go there when no public URL is
    /// configured.
    pub fn api_listening_on(&self, addr: std::net::SocketAddr) {
        self.0.dashboard.settings.public_url.listening_on(addr);
    }

    pub fn new(services: Services) -> Self {
        let Services {
            catalog,
            tokens,
            accounts,
            ledger,
            limiter,
            unauthenticated,
            sign_ins,
            sign_ups,
            providers,
            breakers,
            shutdown,
            developers,
            audit,
            payments,
            auto_reloads,
            responses,
            reasoning_seal,
            batches,
            files,
            settings,
        } = services;
        let catalog = LiveCatalog::new(catalog);
        let trusted_proxies = Arc::new(settings.trusted_proxies);
        let credits_per_usd = settings.credits_per_usd;
        let books = Books {
            accounts: accounts.clone(),
            ledger: ledger.clone(),
            auto_reloads: auto_reloads.clone(),
            checkouts: developers.clone(),
            credits_per_usd,
        };
        let turn_services = Arc::new(TurnServices {
            tokens,
            limiter: limiter.clone(),
            ledger: ledger.clone(),
            providers,
            breakers,
            shutdown: shutdown.clone(),
        });
        let turn_api = Arc::new(TurnApi {
            catalog: catalog.clone(),
            services: turn_services.clone(),
            responses,
            reasoning_seal,
        });
        Self(Arc::new(Surfaces {
            batch_api: Arc::new(BatchApi {
                turns: turn_api.clone(),
                batches,
                files,
                accounts: accounts.clone(),
                settings: settings.batches,
            }),
            turn_api,
            account_api: Arc::new(AccountApi {
                catalog: catalog.clone(),
                ledger: ledger.clone(),
                credits_per_usd,
            }),
            gate: Arc::new(Gate {
                catalog: catalog.clone(),
                accounts: accounts.clone(),
                limiter: limiter.clone(),
                unauthenticated,
                trusted_proxies: trusted_proxies.clone(),
            }),
            dashboard: Arc::new(DashboardState {
                catalog: catalog.clone(),
                accounts: accounts.clone(),
                ledger: ledger.clone(),
                developers: developers.clone(),
                audit: audit.clone(),
                payments: payments.clone(),
                auto_reloads,
                books: books.clone(),
                sign_ins,
                sign_ups,
                settings: settings.dashboard,
                credits_per_usd,
            }),
            webhooks: Arc::new(Webhooks {
                books,
                payments,
                payment_webhook_secret: settings.payment_webhook_secret,
            }),
            admin: Arc::new(AdminState {
                catalog: catalog.clone(),
                accounts,
                ledger,
                developers,
                audit,
                limiter,
                shutdown,
                credits_per_usd,
            }),
            catalog,
            turn_services,
            trusted_proxies,
        }))
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.0.catalog.load()
    }

    pub fn replace_catalog(&self, catalog: Catalog) {
        self.0.catalog.0.store(Arc::new(catalog));
    }

    pub fn shutdown(&self) -> &Shutdown {
        &self.0.turn_services.shutdown
    }

    /// The ledger, for the process to close once the last settlement is written.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.0.turn_services.ledger
    }
}

/// `FromRef` for each surface's part: a handler names the part it uses.
macro_rules! surface {
    ($($field:ident: $part:ty),* $(,)?) => {$(
        impl FromRef<AppState> for Arc<$part> {
            fn from_ref(state: &AppState) -> Self {
                state.0.$field.clone()
            }
        }
    )*};
}

surface! {
    turn_api: TurnApi,
    batch_api: BatchApi,
    account_api: AccountApi,
    gate: Gate,
    dashboard: DashboardState,
    webhooks: Webhooks,
    admin: AdminState,
    trusted_proxies: TrustedProxies,
}
