//! Command line and environment: each flag has a `GATEWAY_*` variable; secrets (the admin
//! token, the dev key) are never echoed by `--help` from the environment.

pub mod published;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use crds::config::SCOPES;

use crate::limits::OutagePolicy;
use crate::responses_store::ResponsesStoreArgs;
use crate::telemetry::LogFormat;
use published::SecretRef;
use store::db::Pooler;

#[derive(Debug, Parser)]
#[command(name = "gateway", version, about = "LLM API gateway")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text or as one JSON object per line; neither ever holds a key, a prompt
    /// or a completion.
    #[arg(
        long,
        global = true,
        env = "GATEWAY_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One process, no external services: in-process limits and credits, config from a folder
    /// of manifests, every model on the built-in simulated provider unless routed elsewhere.
    Standalone(StandaloneArgs),
    /// Cluster mode: rate limits and stream slots shared with every other pod through Redis;
    /// accounts, keys and credits in Postgres with `--database-url` (without it they stay in
    /// process: every pod seeds the same dev key, if given, and manifest keys, with credits of
    /// its own).
    Serve(ServeArgs),
    /// Applies the database migrations (embedded in the binary) and exits.
    Migrate(DatabaseArgs),
    /// API keys in the database.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Accounts in the database.
    #[command(subcommand)]
    Accounts(AccountsCommand),
    /// The message ledger.
    #[command(subcommand)]
    Messages(MessagesCommand),
}

#[derive(Debug, Args)]
pub struct StandaloneArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Seconds between promotion sweeps (tiers follow confirmed lifetime top-ups).
    #[arg(long, env = "GATEWAY_PROMOTION_INTERVAL_SECS", default_value_t = 300)]
    pub promotion_interval_secs: u64,
}

#[derive(Clone, Debug, Args)]
pub struct DatabaseArgs {
    /// `postgres://user:password@host:port/db` (also `?host=/socket/dir`).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Bound on every database call; past it a request needing credits gets 503.
    #[arg(long, env = "GATEWAY_DATABASE_TIMEOUT_MS", default_value_t = 2_000)]
    pub database_timeout_ms: u64,
    /// Connections per process.
    #[arg(long, env = "GATEWAY_DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: u32,
    /// What listens at the database URL: `none` (Postgres itself, or a pooler in session
    /// mode) or `transaction` (PgBouncer with `pool_mode = transaction`: each statement runs
    /// in a transaction of its own, unnamed; migrations are refused, run them directly).
    #[arg(long, env = "GATEWAY_DATABASE_POOLER", value_enum, default_value_t = Pooler::None)]
    pub database_pooler: Pooler,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Creates a key (and its account when new); prints the secret once.
    Create {
        #[command(flatten)]
        db: DatabaseArgs,
        /// Account name.
        #[arg(long)]
        account: String,
        /// Grants the key the enterprise tier (custom limits via its ApiKey resource). Without
        /// it the key starts at the tier its account's confirmed lifetime top-up gives (by the
        /// Tier manifests in --manifests) and only the promotion sweep moves it.
        #[arg(long)]
        enterprise: bool,
        /// Folder of the Tier manifests that set the starting tier.
        #[arg(long, env = "GATEWAY_MANIFESTS", default_value = "deploy/standalone")]
        manifests: PathBuf,
        /// When the key stops working (RFC 3339, e.g. 2027-01-31T00:00:00Z); default never.
        #[arg(long, value_parser = rfc3339)]
        expires_at: Option<time::OffsetDateTime>,
        /// Credits the key may spend per UTC month; default no cap.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        spend_cap: Option<u64>,
        /// apiCredits granted to the account when it is created (not a top-up).
        #[arg(long, default_value_t = 0)]
        credits: u64,
        #[arg(long, value_enum, default_value = "api")]
        kind: KindArg,
        /// Surfaces the key may use (messages, chat, responses, models, account); none: all.
        #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(SCOPES))]
        scopes: Vec<String>,
        #[arg(long, default_value = "key")]
        name: String,
    },
    /// Revokes a key by id.
    Revoke {
        #[command(flatten)]
        db: DatabaseArgs,
        id: String,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum KindArg {
    Api,
    Cli,
}

#[derive(Debug, Subcommand)]
pub enum AccountsCommand {
    /// Confirms a top-up; idempotent by payment reference.
    Topup {
        #[command(flatten)]
        db: DatabaseArgs,
        /// Account name.
        name: String,
        /// US dollars, e.g. 25 or 25.50 ($10 to $10,000).
        #[arg(long)]
        usd: String,
        /// The payment's unique reference.
        #[arg(long)]
        reference: String,
        #[arg(long, env = "GATEWAY_CREDITS_PER_USD", default_value_t = 100_000)]
        credits_per_usd: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum MessagesCommand {
    /// Prints the ledger row of a message as JSON.
    Show {
        #[command(flatten)]
        db: DatabaseArgs,
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// `redis://host:port[/db]`, or `redis-cluster://host:port` for Redis Cluster.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: String,
    /// Bound on every Redis call.
    #[arg(long, env = "GATEWAY_REDIS_TIMEOUT_MS", default_value_t = 250)]
    pub redis_timeout_ms: u64,
    /// While Redis is unreachable: refuse with 503, or limit each pod locally.
    #[arg(
        long,
        env = "GATEWAY_REDIS_OUTAGE",
        value_enum,
        default_value = "fail-closed"
    )]
    pub redis_outage: OutagePolicy,
    /// Gateway pods sharing the limits; failing open, each pod takes this share of them.
    #[arg(long, env = "GATEWAY_PODS", default_value_t = 1)]
    pub pods: u32,
    /// `NAMESPACE/NAME` of the Secret the operator publishes the config in, followed through
    /// the Kubernetes API (KUBECONFIG or the pod's service account) instead of `--manifests`.
    #[arg(long, env = "GATEWAY_CONFIG_SECRET")]
    pub config_secret: Option<SecretRef>,
    /// Lifetime of a stream slot's lease, renewed every third of it while the stream runs.
    #[arg(long, env = "GATEWAY_STREAM_LEASE_SECS", default_value_t = 10)]
    pub stream_lease_secs: u64,
    /// Accounts, keys and the ledger in Postgres: `postgres://user:password@host:port/db`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Bound on every database call; past it a request needing credits gets 503.
    #[arg(long, env = "GATEWAY_DATABASE_TIMEOUT_MS", default_value_t = 2_000)]
    pub database_timeout_ms: u64,
    /// Database connections per process.
    #[arg(long, env = "GATEWAY_DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: u32,
    /// What listens at the database URL: `none` (Postgres itself, or a pooler in session
    /// mode) or `transaction` (PgBouncer with `pool_mode = transaction`: each statement runs
    /// in a transaction of its own, unnamed; migrations are refused, run them directly).
    #[arg(long, env = "GATEWAY_DATABASE_POOLER", value_enum, default_value_t = Pooler::None)]
    pub database_pooler: Pooler,
    /// Apply the database migrations at start.
    #[arg(long, env = "GATEWAY_MIGRATE")]
    pub migrate: bool,
    /// A process silent this long is dead: the reaper releases its reservations (heartbeat
    /// every third of it).
    #[arg(long, env = "GATEWAY_REAPER_STALE_SECS", default_value_t = 30)]
    pub reaper_stale_secs: u64,
    /// No turn runs longer: older reservations are released even if their process lives (its
    /// settle failed, e.g. during a database outage).
    #[arg(long, env = "GATEWAY_REAPER_MAX_TURN_SECS", default_value_t = 3_600)]
    pub reaper_max_turn_secs: u64,
    /// Credits each process holds ahead for an account, in turns like the one asking (0: off,
    /// every turn is reserved in Postgres on the request path). With it on, an account's
    /// turns reserve in memory and their ledger rows are written just after the turn; see
    /// docs/ledger.md, "Allotments".
    #[arg(long, env = "GATEWAY_ALLOTMENT_TURNS", default_value_t = 32)]
    pub allotment_turns: u64,
}

/// The flags both modes share.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Address of the public API.
    #[arg(long, env = "GATEWAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of the admin API; keep it on loopback or a private network.
    #[arg(long, env = "GATEWAY_ADMIN_LISTEN", default_value = "127.0.0.1:8081")]
    pub admin_listen: SocketAddr,
    /// A listener of its own for `/metrics` and the probes, so that scrapers reach them
    /// without reaching the admin API (which keeps serving them too).
    #[arg(long, env = "GATEWAY_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Bearer token of the admin API (at least 16 characters); without it, `standalone` makes a
    /// random one and shows it once on the ready line, and `serve` refuses to start.
    #[arg(long, env = "GATEWAY_ADMIN_TOKEN", hide_env_values = true, value_parser = long_secret)]
    pub admin_token: Option<String>,
    /// Folder of Tier, ModelRoute, ApiKey and Secret manifests.
    #[arg(
        long,
        alias = "config",
        env = "GATEWAY_MANIFESTS",
        default_value = "deploy/standalone"
    )]
    pub manifests: PathBuf,
    /// The development API key to create (`sk-svc-` and at least 20 characters); without it,
    /// `standalone` makes a random one and shows it once on the ready line, and `serve` creates
    /// no dev account.
    #[arg(long, env = "GATEWAY_DEV_KEY", hide_env_values = true, value_parser = dev_key)]
    pub dev_key: Option<String>,
    /// A confirmed top-up of the development account, in US dollars (0: none), as if it had
    /// paid: its key starts at the tier that top-up gives (the default, $10, gives
    /// pay_as_you_go). Confirmed once, however often the gateway starts.
    #[arg(long, env = "GATEWAY_DEV_TOP_UP_USD", default_value = "10")]
    pub dev_top_up_usd: String,
    /// Grants the development key the enterprise tier instead.
    #[arg(long, env = "GATEWAY_DEV_ENTERPRISE")]
    pub dev_enterprise: bool,
    /// apiCredits of the development account.
    #[arg(long, env = "GATEWAY_DEV_CREDITS", default_value_t = 10_000_000)]
    pub dev_credits: u64,
    /// Delay between streamed chunks of every simulated upstream, overriding the manifests.
    #[arg(long, env = "GATEWAY_SIMULATED_CHUNK_DELAY_MS")]
    pub simulated_chunk_delay_ms: Option<u64>,
    /// Seconds open streams may take to finish after SIGTERM.
    #[arg(long, env = "GATEWAY_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Seconds between SIGTERM and closing the listener, during which the process reports not
    /// ready but still serves new connections (with `Connection: close`): the time load
    /// balancers and Kubernetes endpoints take to stop sending it traffic. The grace period
    /// starts after it. The chart sets 5.
    #[arg(long, env = "GATEWAY_SHUTDOWN_DELAY_SECS", default_value_t = 0)]
    pub shutdown_delay_secs: u64,
    /// Credits granted per US dollar of top-up (1 credit = $0.00001 by default).
    #[arg(long, env = "GATEWAY_CREDITS_PER_USD", default_value_t = 100_000)]
    pub credits_per_usd: u64,
    /// Mark dashboard cookies `Secure` on every request (behind TLS). Without it they are
    /// `Secure` only when `X-Forwarded-Proto: https` says the request came over TLS.
    #[arg(long, env = "GATEWAY_DASHBOARD_SECURE_COOKIES")]
    pub dashboard_secure_cookies: bool,
    /// apiCredits granted to each account signed up in the dashboard (a trial; not a top-up,
    /// so it does not count towards tiers).
    #[arg(long, env = "GATEWAY_SIGNUP_CREDITS", default_value_t = 0)]
    pub signup_credits: u64,
    /// Shared secret of the payment provider's signed webhook (`POST /webhooks/payments`);
    /// without it the webhook is off.
    #[arg(
        long,
        env = "GATEWAY_PAYMENT_WEBHOOK_SECRET",
        hide_env_values = true,
        value_parser = long_secret
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
    /// Consecutive failed attempts that take an upstream out of rotation.
    #[arg(long, env = "GATEWAY_BREAKER_FAILURES", default_value_t = 5)]
    pub breaker_failures: u32,
    /// How long an upstream stays out before one turn probes it.
    #[arg(long, env = "GATEWAY_BREAKER_COOLDOWN_MS", default_value_t = 30_000)]
    pub breaker_cooldown_ms: u64,
    /// Secret that seals the reasoning `/v1/responses` hands to stateless clients
    /// (`include: ["reasoning.encrypted_content"]`). Give every pod the same one; without it
    /// each process picks a random one, and sealed reasoning only comes back to that process.
    #[arg(
        long,
        env = "GATEWAY_RESPONSES_SECRET",
        hide_env_values = true,
        value_parser = long_secret
    )]
    pub responses_secret: Option<String>,
    #[command(flatten)]
    pub responses_store: ResponsesStoreArgs,
    /// Seconds a client connection may take to send a complete request head, counted from
    /// when it opens or its previous response ended: also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, env = "GATEWAY_HEADER_READ_TIMEOUT_SECS", default_value_t = 30)]
    pub header_read_timeout_secs: u64,
    /// Seconds a request body may take to arrive, plus one second per
    /// `--body-min-bytes-per-sec` bytes received (a minimum rate, so large bodies on slow links
    /// still arrive); past it, 408.
    #[arg(long, env = "GATEWAY_BODY_READ_TIMEOUT_SECS", default_value_t = 30)]
    pub body_read_timeout_secs: u64,
    /// The slowest upload rate a request body may keep up past `--body-read-timeout-secs`.
    #[arg(long, env = "GATEWAY_BODY_MIN_BYTES_PER_SEC", default_value_t = 32 * 1024)]
    pub body_min_bytes_per_sec: u64,
    /// Open client connections of the public listener at most; more wait to be accepted.
    /// Lowered at start to leave 256 file descriptors (or a quarter of the limit, whichever is
    /// smaller) for the admin listener, probes, upstream, Redis and Postgres connections.
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Networks (`10.0.0.0/8`) or addresses of the proxies in front of the gateway, comma
    /// separated: only their `X-Forwarded-For` names the client whose address the
    /// per-address limits count. Without them the header is ignored and the peer is the client.
    #[arg(long, env = "GATEWAY_TRUSTED_PROXIES", value_delimiter = ',',
          value_parser = crate::client_address::parse_network)]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// `/v1` requests without a valid API key accepted per client address and minute (a
    /// key-guessing brake); past it, every `/v1` request from the address gets 429 until the
    /// minute ends.
    #[arg(long, env = "GATEWAY_UNAUTHENTICATED_PER_MINUTE", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub unauthenticated_per_minute: u32,
    /// Dashboard sign-in attempts accepted per client address and minute, whatever the email.
    #[arg(long, env = "GATEWAY_SIGN_INS_PER_MINUTE", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sign_ins_per_minute: u32,
    /// Dashboard sign-ups accepted per client address and minute: each one creates an account
    /// and grants it the sign-up credits, so a script must not mint them at will.
    #[arg(long, env = "GATEWAY_SIGN_UPS_PER_MINUTE", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sign_ups_per_minute: u32,
    /// Secrets `standalone` generated because none was given, shown once on the ready line.
    #[arg(skip)]
    pub generated: Vec<(&'static str, String)>,
}

/// The shortest admin token, webhook secret or responses secret accepted. An empty one used to
/// turn admin authentication off or let anyone sign a webhook; a short one can be guessed.
pub const MIN_SECRET_CHARS: usize = 16;
/// The shortest dev key accepted, prefix included.
pub const MIN_DEV_KEY_CHARS: usize = 20;
/// What every API key starts with, so that secret scanners recognise a leaked one.
pub const KEY_PREFIX: &str = "sk-svc-";

/// Value parser of the shared secrets: refused at start when empty or short (the message names
/// the flag, never the value).
fn rfc3339(value: &str) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("expected an RFC 3339 time like 2027-01-31T00:00:00Z: {e}"))
}

fn long_secret(value: &str) -> Result<String, String> {
    if value.trim().chars().count() < MIN_SECRET_CHARS {
        return Err(format!(
            "must be at least {MIN_SECRET_CHARS} characters (an empty or short secret would let \
             anyone in); generate one with `openssl rand -hex 24`"
        ));
    }
    Ok(value.to_owned())
}

/// Value parser of `--dev-key`: it must look like the keys the gateway issues.
fn dev_key(value: &str) -> Result<String, String> {
    if !value.starts_with(KEY_PREFIX)
        || value.chars().count() < MIN_DEV_KEY_CHARS
        || value.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "must start with `{KEY_PREFIX}` and be at least {MIN_DEV_KEY_CHARS} characters \
             without spaces, e.g. `{KEY_PREFIX}` followed by `openssl rand -hex 20`"
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_short_secrets_are_refused() {
        assert!(long_secret("").is_err());
        assert!(long_secret("                    ").is_err());
        assert!(long_secret("0123456789abcde").is_err());
        assert!(long_secret("0123456789abcdef").is_ok());
    }

    #[test]
    fn a_dev_key_must_look_like_a_key() {
        assert!(dev_key("K").is_err());
        assert!(dev_key("sk-svc-1").is_err());
        assert!(dev_key("0123456789abcdef0123456789").is_err());
        assert!(dev_key("sk-svc-0123456789 abcdef").is_err());
        assert!(dev_key("sk-svc-0123456789abcdef").is_ok());
    }
}
