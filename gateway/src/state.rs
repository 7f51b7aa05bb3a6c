//! The one `AppState` every handler gets: the stores and services, chosen once at start-up,
//! and the settings the handlers read.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::client_address::TrustedProxies;
use crate::dashboard::settings::DashboardConfig;
use crate::limits::{AddressBrake, Limiter};
use crate::payments::reload::AutoReloads;
use crate::payments::{Books, PaymentProvider};
use crate::providers::Providers;
use crate::responses_store::ResponseStore;
use crate::routing::Catalog;
use crate::seal::Sealer;
use crate::shutdown::Shutdown;
use crate::tokens::Tokenizer;
use crate::turn::Turns;
use store::accounts::Accounts;
use store::developers::DeveloperStore;
use store::ledger::Ledger;

pub struct Services {
    /// Replaced whole when a new config is published; a turn keeps the models it resolved.
    pub catalog: ArcSwap<Catalog>,
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
    pub shutdown: Shutdown,
    /// Dashboard users, sessions and checkouts.
    pub developers: Arc<dyn DeveloperStore>,
    pub payments: Arc<dyn PaymentProvider>,
    /// Auto-reload rules and saved cards.
    pub auto_reloads: Arc<dyn AutoReloads>,
    /// Stored responses of `/v1/responses`.
    pub responses: Arc<dyn ResponseStore>,
    /// Seals the thinking handed to stateless Responses API clients.
    pub reasoning_seal: Sealer,
    pub settings: Settings,
}

/// What the operator chose at start-up (`config/`), apart from the services built from it.
pub struct Settings {
    pub credits_per_usd: u64,
    pub dashboard: DashboardConfig,
    /// The payment provider's webhook secret; the webhook is off without it.
    pub payment_webhook_secret: Option<String>,
    /// Whose `X-Forwarded-For` names the client.
    pub trusted_proxies: TrustedProxies,
}

#[derive(Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    pub fn new(services: Services) -> Self {
        Self(Arc::new(services))
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.0.catalog.load_full()
    }

    pub fn replace_catalog(&self, catalog: Catalog) {
        self.0.catalog.store(Arc::new(catalog));
    }

    /// What a turn uses, with the catalog as it is now: the turn keeps the models it resolved
    /// whatever config is published meanwhile.
    pub fn turns(&self) -> Turns {
        Turns {
            catalog: self.catalog(),
            tokens: self.tokens,
            limiter: self.limiter.clone(),
            ledger: self.ledger.clone(),
            providers: self.providers.clone(),
            shutdown: self.shutdown.clone(),
        }
    }

    /// What the payment paths move and record.
    pub fn books(&self) -> Books {
        Books {
            accounts: self.accounts.clone(),
            ledger: self.ledger.clone(),
            auto_reloads: self.auto_reloads.clone(),
            checkouts: self.developers.clone(),
            credits_per_usd: self.settings.credits_per_usd,
        }
    }
}

impl Deref for AppState {
    type Target = Services;
    fn deref(&self) -> &Services {
        &self.0
    }
}
