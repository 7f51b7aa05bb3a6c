//! The listeners: where the public API, the admin API and `/metrics` listen, how long and how
//! many clients may take, whose `X-Forwarded-For` to believe, and how the process stops.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use tokio::net::TcpListener;

use super::secrets::LONG_SECRET;
use crate::client_address::TrustedProxies;
use crate::edge::body_reader::BodyDeadline;
use crate::edge::budget;
use crate::serve;

#[derive(Debug, Args)]
pub struct ServerArgs {
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
    #[arg(long, env = "GATEWAY_ADMIN_TOKEN", hide_env_values = true, value_parser = LONG_SECRET)]
    pub admin_token: Option<String>,
    /// Seconds open streams may take to finish after SIGTERM.
    #[arg(long, env = "GATEWAY_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Seconds between SIGTERM and closing the listener, during which the process reports not
    /// ready but still serves new connections (with `Connection: close`): the time load
    /// balancers and Kubernetes endpoints take to stop sending it traffic. The grace period
    /// starts after it. The chart sets 5.
    #[arg(long, env = "GATEWAY_SHUTDOWN_DELAY_SECS", default_value_t = 0)]
    pub shutdown_delay_secs: u64,
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
    /// Seconds a request body may send nothing before it is cut with 408, however much of it
    /// has arrived.
    #[arg(long, env = "GATEWAY_BODY_IDLE_TIMEOUT_SECS", default_value_t = 10)]
    pub body_idle_timeout_secs: u64,
    /// MiB of memory for the request bodies being read, parsed and tokenized at once, across
    /// all listeners; a body counts four times its bytes (its parsed and translated copies)
    /// plus what its JSON values and objects take parsed, and one account's bodies at most a
    /// quarter of it. Past it a large body waits two seconds, then gets 503 with
    /// `Retry-After`; one that alone needs more gets 413. The default suits the chart's 1 GiB
    /// memory limit.
    #[arg(long, env = "GATEWAY_BODY_MEMORY_BUDGET_MIB", default_value_t = budget::DEFAULT_MIB,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_048_576))]
    pub body_memory_budget_mib: usize,
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
}

impl ServerArgs {
    pub fn trusted_proxies(&self) -> TrustedProxies {
        TrustedProxies::new(self.trusted_proxies.clone())
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// What the listeners are given; `None` without an admin token (the admin API is never
    /// served open).
    pub fn listen(
        &self,
        admin_bound: Option<TcpListener>,
        generated: Vec<(&'static str, String)>,
    ) -> Option<serve::Listen> {
        Some(serve::Listen {
            api: self.listen,
            admin: self.admin_listen,
            admin_bound,
            metrics: self.metrics_listen,
            admin_token: self.admin_token.clone()?,
            generated,
            delay: Duration::from_secs(self.shutdown_delay_secs),
            grace: self.shutdown_grace(),
            edge: self.edge(),
        })
    }

    /// Zero would refuse every client at once; each bound is at least one unit.
    fn edge(&self) -> serve::Edge {
        serve::Edge {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs.max(1)),
            body: BodyDeadline {
                base: Duration::from_secs(self.body_read_timeout_secs.max(1)),
                min_bytes_per_sec: self.body_min_bytes_per_sec.max(1),
                idle: Duration::from_secs(self.body_idle_timeout_secs.max(1)),
            },
            max_connections: self.max_connections.max(1),
            body_memory_budget_mib: self.body_memory_budget_mib,
        }
    }
}
