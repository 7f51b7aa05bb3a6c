//! The operator binary: `compile` checks a manifest folder offline with exactly the gateway's
//! validation; `run` is the controller that publishes the config, sweeps promotions and scales
//! the gateway in a cluster.

mod controller;
mod error;
mod grants;
mod isolation;
mod leader_election;
mod metrics;
mod publish;
mod scale;
mod status;
mod sweep;
#[cfg(test)]
mod testing;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use crds::config::{GatewayConfig, Route, Secret};
use kube::{Api, Client};
use store::accounts::{promotion, Accounts, PostgresAccounts, PromotionRules};
use store::audit::{Actor, ActorKind};
use store::db::{Database, DbSettings, PgTlsFiles, Pooler};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a folder of Tier, ModelRoute, ApiKey and Secret manifests and print the
    /// resulting GatewayConfig as YAML.
    Compile {
        /// Folder of *.yaml / *.yml manifests (not recursive).
        #[arg(long, value_name = "DIR")]
        manifests: PathBuf,
        /// Print secret values instead of `<redacted>`.
        #[arg(long)]
        show_secrets: bool,
    },
    /// Run the controllers against the cluster of KUBECONFIG (or the in-cluster config).
    Run(Box<RunArgs>),
}

#[derive(Args)]
struct RunArgs {
    /// Namespace of the gateway's resources, the config Secret and the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Secret the compiled config is published in (gateways: `--config-secret NS/NAME`). It
    /// must exist: the operator patches it by server-side apply but never creates a Secret.
    #[arg(long, env = "OPERATOR_CONFIG_SECRET", default_value = "gateway-config")]
    config_secret: String,
    /// A Secret the operator reads, by name: one that ModelRoutes' upstream API keys or ApiKey
    /// seeds refer to. Repeat the flag (or separate names by commas). No other Secret is read,
    /// so the operator's RBAC can name them; a resource referring to another is `Invalid`.
    #[arg(
        long = "secret",
        value_name = "NAME",
        env = "OPERATOR_SECRETS",
        value_delimiter = ','
    )]
    secrets: Vec<String>,
    /// The gateway Deployment: when nothing can be published, a Warning event on it says why
    /// (`kubectl describe deployment`); `--scale-deployment` when absent.
    #[arg(long, env = "OPERATOR_GATEWAY_DEPLOYMENT")]
    gateway_deployment: Option<String>,
    /// This replica's name in the Lease and in events.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lease that elects the replica running the sweep and the scaler.
    #[arg(long, env = "OPERATOR_LEASE", default_value = "gateway-operator")]
    lease: String,
    /// How long a Lease holder stays leader without renewing.
    #[arg(long, env = "OPERATOR_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// The ledger's Postgres, for the promotion sweep and the audit of ApiKey grants; neither
    /// runs when absent.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Bound on every database call of a sweep.
    #[arg(long, env = "OPERATOR_DATABASE_TIMEOUT_MS", default_value_t = 10_000)]
    database_timeout_ms: u64,
    /// PEM bundle of the CA that signed the ledger's Postgres' certificate: the gateway's
    /// flag of the same name (`sslmode` becomes `verify-full` unless the URL says `verify-ca`).
    #[arg(long, env = "GATEWAY_DATABASE_CA_FILE")]
    database_ca_file: Option<PathBuf>,
    /// PEM certificate shown to Postgres; with its key.
    #[arg(
        long,
        env = "GATEWAY_DATABASE_CLIENT_CERT_FILE",
        requires = "database_client_key_file"
    )]
    database_client_cert_file: Option<PathBuf>,
    /// PEM private key of `--database-client-cert-file`.
    #[arg(
        long,
        env = "GATEWAY_DATABASE_CLIENT_KEY_FILE",
        requires = "database_client_cert_file"
    )]
    database_client_key_file: Option<PathBuf>,
    /// Time between two promotion sweeps (and two recordings of the ApiKey grants, which also
    /// run at every published config).
    #[arg(long, env = "OPERATOR_SWEEP_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    sweep_interval: Duration,
    /// Recompile even without a change, as a safety net for missed watch events.
    #[arg(long, env = "OPERATOR_RESYNC", default_value = "5m", value_parser = parse_duration)]
    resync: Duration,
    /// Address of the Prometheus `/metrics` endpoint; none when absent.
    #[arg(long, env = "OPERATOR_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    scaling: ScalingArgs,
}

#[derive(Args)]
struct ScalingArgs {
    /// Gateway Deployment whose replicas the operator sets; no scaling when absent.
    #[arg(long, env = "OPERATOR_SCALE_DEPLOYMENT")]
    scale_deployment: Option<String>,
    /// Label selector of the gateway pods to scrape.
    #[arg(
        long,
        env = "OPERATOR_SCALE_POD_SELECTOR",
        default_value = "app.kubernetes.io/name=gateway"
    )]
    scale_pod_selector: String,
    /// Port of the gateway pods serving `/metrics`: their admin port, or their metrics port
    /// when they have one (`--metrics-listen`).
    #[arg(
        long,
        alias = "gateway-admin-port",
        env = "OPERATOR_GATEWAY_METRICS_PORT",
        default_value_t = 8081
    )]
    gateway_metrics_port: u16,
    #[arg(long, env = "OPERATOR_MIN_REPLICAS", default_value_t = 2)]
    min_replicas: u32,
    #[arg(long, env = "OPERATOR_MAX_REPLICAS", default_value_t = 20)]
    max_replicas: u32,
    /// Streams in flight one gateway pod is sized for.
    #[arg(long, env = "OPERATOR_STREAMS_PER_POD", default_value_t = 200.0)]
    streams_per_pod: f64,
    /// Requests per second one gateway pod is sized for.
    #[arg(long, env = "OPERATOR_RPS_PER_POD", default_value_t = 100.0)]
    rps_per_pod: f64,
    /// Scaling down follows the highest recommendation of this window.
    #[arg(long, env = "OPERATOR_SCALE_DOWN_WINDOW", default_value = "5m", value_parser = parse_duration)]
    scale_down_window: Duration,
    /// Time between two scaling rounds.
    #[arg(long, env = "OPERATOR_SCALE_EVERY", default_value = "15s", value_parser = parse_duration)]
    scale_every: Duration,
}

/// `300`, `300s`, `5m`, `1h`, `500ms`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 30s, 5m or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("`{text}`: the unit must be ms, s, m or h")),
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Compile {
            manifests,
            show_secrets,
        } => {
            let mut config = crds::manifests::load_dir(&manifests)?;
            if !show_secrets {
                redact(&mut config);
            }
            let yaml = serde_yaml::to_string(&config).context("cannot print the configuration")?;
            print!("{yaml}");
            Ok(())
        }
        Command::Run(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            tokio::runtime::Runtime::new()
                .context("cannot start the async runtime")?
                .block_on(run(*args))
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("no Kubernetes API: set KUBECONFIG or run in a pod")?;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("operator-{}", std::process::id()));
    tracing::info!(%identity, namespace = %args.namespace, "operator starting");
    let metrics = Arc::new(metrics::Metrics::default());
    if let Some(addr) = args.metrics_listen {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => metrics::serve(listener, metrics).await,
                Err(error) => tracing::error!(%error, %addr, "metrics endpoint failed"),
            }
        });
    }

    let (leading, is_leading) = watch::channel(false);
    let elector = leader_election::Elector {
        api: Api::namespaced(client.clone(), &args.namespace),
        name: args.lease.clone(),
        identity: identity.clone(),
        duration: args.lease_duration,
    };
    tokio::spawn(elector.run(leading));
    tokio::spawn(track_leadership(is_leading.clone(), metrics.clone()));
    let readable: Vec<String> = args
        .secrets
        .iter()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect();
    tracing::info!(config_secret = %args.config_secret, secrets = ?readable, "the Secrets the operator reads");
    let ctx = publish::Context::new(
        client.clone(),
        args.namespace.clone(),
        args.config_secret.clone(),
        readable,
        identity,
    )
    .with_deployment(
        args.gateway_deployment
            .clone()
            .or_else(|| args.scaling.scale_deployment.clone()),
    );
    match &args.database_url {
        Some(url) => {
            let db = Database::connect_with(&DbSettings {
                url: url.clone(),
                pool_size: 2,
                timeout: Duration::from_millis(args.database_timeout_ms),
                pooler: Pooler::None,
                tls: PgTlsFiles {
                    ca_file: args.database_ca_file.clone(),
                    client_cert_file: args.database_client_cert_file.clone(),
                    client_key_file: args.database_client_key_file.clone(),
                },
            })
            .context("invalid --database-url")?;
            // Not fatal: the compiler and the publisher need no Postgres; the sweeps log their
            // failures, this one says which setting to fix.
            let probe = db.clone();
            tokio::spawn(async move {
                if let Some(e) = probe.refused_tls().await {
                    tracing::error!(error = %e, "the promotion sweep cannot reach Postgres");
                }
            });
            let accounts = Arc::new(PostgresAccounts::new(db));
            tokio::spawn(grants::run(
                args.sweep_interval,
                is_leading.clone(),
                ctx.latest.subscribe(),
                accounts.clone(),
            ));
            let latest = ctx.latest.subscribe();
            tokio::spawn(sweep::run(
                args.sweep_interval,
                is_leading.clone(),
                metrics.clone(),
                move || {
                    let accounts = accounts.clone();
                    let config = latest.borrow().clone();
                    async move {
                        let config = config.ok_or(error::Error::NoRules)?;
                        let rules = PromotionRules::from_config(&config);
                        let by = Actor::new(ActorKind::Sweep, promotion::SWEEP, None);
                        Ok(accounts.promote_tiers(&rules, &by).await?)
                    }
                },
            ));
        }
        None => tracing::info!(
            "no --database-url: the promotion sweep and the audit of ApiKey grants are off"
        ),
    }
    if let Some(deployment) = args.scaling.scale_deployment.clone() {
        let s = &args.scaling;
        let scaler = scale::Scaler {
            deployments: Api::namespaced(client.clone(), &args.namespace),
            pods: Api::namespaced(client.clone(), &args.namespace),
            secrets: Api::namespaced(client.clone(), &args.namespace),
            config_secret: args.config_secret.clone(),
            deployment,
            pod_selector: s.scale_pod_selector.clone(),
            metrics_port: s.gateway_metrics_port,
            policy: scale::Policy {
                min: s.min_replicas,
                max: s.max_replicas,
                streams_per_pod: s.streams_per_pod,
                rps_per_pod: s.rps_per_pod,
                scale_down_window: s.scale_down_window,
            },
            every: s.scale_every,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .context("cannot build the HTTP client")?,
        };
        tokio::spawn(scaler.run(is_leading.clone(), metrics.clone()));
    }

    // Every replica publishes: the result is the same and idempotent, so config changes do
    // not wait for a leader to be elected.
    let mut terminate = signal(SignalKind::terminate()).context("cannot wait for SIGTERM")?;
    tokio::select! {
        () = controller::run(controller::State::new(ctx, args.resync, metrics)) => {}
        signal = tokio::signal::ctrl_c() => signal.context("cannot wait for ctrl-c")?,
        // The kubelet stops a pod with SIGTERM, which a container's first process ignores
        // unless it handles it: the pod would wait out its whole grace period for SIGKILL.
        _ = terminate.recv() => tracing::info!("SIGTERM: the operator stops"),
    }
    Ok(())
}

async fn track_leadership(mut leading: watch::Receiver<bool>, metrics: Arc<metrics::Metrics>) {
    loop {
        metrics.leading.set(i64::from(*leading.borrow_and_update()));
        if leading.changed().await.is_err() {
            return;
        }
    }
}

/// Output of this command ends up in terminals, CI logs and bug reports, where upstream API
/// keys and seeded key secrets must not. The version is left as is: it identifies the real
/// configuration.
fn redact(config: &mut GatewayConfig) {
    let redacted = || Secret("<redacted>".to_owned());
    for model in config.models.values_mut() {
        if let Route::Upstreams(upstreams) = &mut model.route {
            for upstream in upstreams {
                if let Some(key) = &mut upstream.api_key {
                    *key = redacted();
                }
            }
        }
    }
    for grant in config.keys.values_mut() {
        if let Some(seed) = &mut grant.seed {
            seed.secret = redacted();
        }
    }
}
