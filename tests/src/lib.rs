//! Harness for the end-to-end tests: every test starts the real `gateway` binary (standalone
//! mode, ports chosen by the OS), talks HTTP to it over loopback and kills it on drop.
//!
//! - [`Gateway`] / [`GatewayBuilder`]: the process, its ready line, `/v1` and admin helpers;
//!   `standalone` by default, `serve` (cluster mode) with [`GatewayBuilder::serve`].
//! - [`RedisServer`]: a throwaway `redis-server` (start, stop, restart, freeze) for cluster mode.
//! - [`RedisCluster`]: a throwaway Redis Cluster (three masters, three replicas; failover, kill).
//! - [`PostgresServer`]: a throwaway Postgres (start, stop, restart, SQL, the operator CLI).
//! - [`PgBouncer`]: a throwaway PgBouncer in transaction pooling mode in front of it.
//! - [`Nginx`]: a throwaway nginx reverse proxy in front of a gateway, as ingress-nginx forwards.
//! - [`podman`]: the gateway's image run under podman as the chart runs it.
//! - [`TcpProxy`]: a loopback TCP proxy a test can cut (one process partitioned from a server).
//! - [`cluster`]: several `serve` pods on one Redis, and the keys the cluster manifests seed.
//! - [`Resp`]: a fully read response with envelope and rate-limit header accessors.
//! - [`sse`]: Server-Sent Events parsing and the Anthropic / OpenAI stream grammars.
//! - [`kube`]: a real kube-apiserver (with etcd) and operator processes for the operator tests.
//! - [`node`]: the controller manager, the scheduler and a node running the chart's pods with podman.
//! - [`leak`]: the rule that no response names an upstream provider.
//! - [`archive`]: the ledger's Parquet archive decoded by pyarrow, against docs/ledger.md and the rows.
//! - [`bodies`]: request bodies used across the tests.
//! - [`books`]: an account's books after a burst of turns (told = debited = balance decrease).
//! - [`upstream`]: a mock upstream speaking the Anthropic and OpenAI wire formats, scripted
//!   per test, and manifest folders that route every model to it; [`bedrock`]: what it does
//!   as Amazon Bedrock (SigV4 checked, the AWS event stream); [`gemini`]: what it does as the
//!   Gemini API (the key and the body's shape checked).
//! - [`Scrape`]: the samples of a `/metrics` scrape.
//! - [`tls`]: the CA and certificates of the TLS stores (`start_tls` of Postgres, Redis and
//!   Redis Cluster).
//! - [`otlp`]: an OTLP/HTTP (json) trace receiver the gateway exports its spans to.
//! - [`sdk`]: /v1/messages through the official `anthropic` Python SDK.
//! - [`browser`]: headless chromium through chromedriver, for the dashboard.
//! - [`visitor`]: a dashboard visitor over plain HTTP (sign-up, forms, checkouts).
//! - [`stripe`]: a mock Stripe API and webhook sender speaking Stripe's wire format.
//! - [`smtp`]: an SMTP server (aiosmtpd) keeping the dashboard's mail in a maildir.
//! - [`oidc`]: OpenID Providers for single sign-on: npm `oidc-provider`, and a mock whose ID
//!   tokens a test breaks on purpose.
//!
//! Every response read through this harness (bodies, SSE payloads, header values) is checked
//! by [`leak::assert_no_provider_names`].

pub mod archive;
pub mod bedrock;
pub mod bodies;
pub mod books;
pub mod browser;
pub mod cluster;
pub mod contract;
pub mod dns;
pub mod gateway;
pub mod gemini;
pub mod helm;
pub mod kube;
pub mod leak;
pub mod ledger;
pub mod nginx;
pub mod node;
pub mod oidc;
pub mod otlp;
pub mod pgbouncer;
pub mod podman;
pub mod postgres;
pub mod proxy;
pub mod redis;
pub mod redis_cluster;
pub mod registry;
pub mod response;
pub mod s3;
pub mod scrape;
pub mod sdk;
pub mod server;
pub mod smtp;
pub mod sse;
pub mod stripe;
pub mod tls;
pub mod upstream;
pub mod vertex;
pub mod visitor;

pub use bodies::*;
pub use cluster::{Cluster, ManifestDir, SeededKey};
pub use gateway::{ApiKey, Gateway, GatewayBuilder, KeySpec, ADMIN_TOKEN, DEV_KEY, ENTERPRISE_KEY};
pub use nginx::{Nginx, Routes};
pub use otlp::OtlpReceiver;
pub use pgbouncer::PgBouncer;
pub use postgres::PostgresServer;
pub use proxy::TcpProxy;
pub use redis::{RedisServer, SharedRedis};
pub use redis_cluster::RedisCluster;
pub use response::{RateLimit, RequestLimit, Resp};
pub use scrape::Scrape;
pub use sse::{ChatStream, MessageStream, ResponseStream, SseEvent, SseStream};
pub use upstream::{
    AgentUpstream, Fault, MockUpstream, MockUsage, Reply, RoutedManifests, Unscripted, UpstreamDef,
};

/// Makes a server process a child of the test: output piped for the test to read, killed when
/// its handle drops, and (through PR_SET_PDEATHSIG) killed by the kernel when the thread that
/// started it dies, so a test killed by a timeout leaks no process.
pub fn tie_to_test(cmd: &mut tokio::process::Command) {
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every `every` until it returns `Some`, for at most `within`; panics with
/// `what` when time runs out. Tests use this instead of fixed sleeps.
pub async fn poll_until<T, F, Fut>(what: &str, within: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

/// A test whose dependency (a program, a built binary) is missing: under CI (`CI` set, as
/// `.ci/run` runs) it fails with the reason, since a skipped test checks nothing; on a
/// developer's machine it says SKIPPED on stderr and the caller returns.
pub fn missing_dependency(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "a dependency of this test is missing (CI is set, so this is a failure, not a skip): {reason}"
    );
    eprintln!("SKIPPED: {reason}");
}

/// True when `message` contains a number of seconds ("retry after 12 seconds", "in 1 second",
/// "12s").
pub fn mentions_seconds(message: &str) -> bool {
    let is_number = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit());
    let words: Vec<&str> = message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let number_then_seconds = words
        .windows(2)
        .any(|w| is_number(w[0]) && w[1].starts_with("sec"));
    let compact = words
        .iter()
        .any(|w| w.len() > 1 && w.ends_with('s') && is_number(&w[..w.len() - 1]));
    number_then_seconds || compact
}

#[cfg(test)]
mod tests {
    use super::mentions_seconds;

    #[test]
    fn seconds_are_recognised_in_rate_limit_messages() {
        assert!(mentions_seconds(
            "requests per minute exceeded (limit 5); retry after 12 seconds"
        ));
        assert!(mentions_seconds("retry after 1 second"));
        assert!(mentions_seconds("retry in 3s."));
        assert!(!mentions_seconds("requests per minute exceeded (limit 5)"));
        assert!(!mentions_seconds("limit 5 streams"));
    }
}
