//! Cluster mode: several `gateway serve` pods sharing one [`RedisServer`] (or a
//! [`RedisCluster`]), started from a manifest folder assembled from `deploy/standalone` (tiers and models, as shipped) and
//! `tests/cluster-manifests` (the ApiKey seeds the tests use).
//!
//! Until accounts live in Postgres, accounts, keys and credits are in-process per pod: every
//! pod seeds the same keys (same key ids, same secrets) from the manifests, so a key works on
//! every pod, its limits are shared through Redis, and its credits are per pod.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::gateway::{unique_name, workspace_root, Gateway, GatewayBuilder};
use crate::redis::{RedisServer, SharedRedis};
use crate::redis_cluster::RedisCluster;
use crate::upstream::{RoutedManifests, UpstreamDef};

/// Key id of the dev key in both modes (`--dev-key` is seeded on every pod under this id).
pub const DEV_KEY_ID: &str = "key_dev";

/// A key seeded by `tests/cluster-manifests/cluster-apikeys.yaml`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeededKey {
    pub id: &'static str,
    pub secret: &'static str,
    pub tier: &'static str,
    pub rpm: u64,
    pub tpm: u64,
    pub streams: u64,
}

/// Free (its account never topped up): 5 RPM, 20,000 TPM, 1 stream.
pub const FREE: SeededKey = SeededKey {
    id: "key_cluster_free",
    secret: "sk-svc-cluster-free-00000000000000000000000",
    tier: "free",
    rpm: 5,
    tpm: 20_000,
    streams: 1,
};

/// pay_as_you_go by its account's seeded $10 top-up: 60 RPM, 100,000 TPM, 5 streams.
pub const PAYG: SeededKey = SeededKey {
    id: "key_cluster_payg",
    secret: "sk-svc-cluster-payg-00000000000000000000000",
    tier: "pay_as_you_go",
    rpm: 60,
    tpm: 100_000,
    streams: 5,
};

/// Enterprise grant with custom limits: 7 RPM, 50,000 TPM, 2 streams.
pub const ENTERPRISE: SeededKey = SeededKey {
    id: "key_cluster_enterprise",
    secret: "sk-svc-cluster-enterprise-00000000000000000",
    tier: "enterprise",
    rpm: 7,
    tpm: 50_000,
    streams: 2,
};

/// high_volume by its account's seeded $500 top-up (300 RPM); only [`Cluster::wait_admitting`] uses it.
pub const PROBE: SeededKey = SeededKey {
    id: "key_cluster_probe",
    secret: "sk-svc-cluster-probe-0000000000000000000000",
    tier: "high_volume",
    rpm: 300,
    tpm: 500_000,
    streams: 20,
};

/// The seeded keys the tests count against, in the order they usually walk them.
pub const SEEDED: [SeededKey; 3] = [FREE, PAYG, ENTERPRISE];

/// A temporary folder of manifests, removed on drop.
#[derive(Debug)]
pub struct ManifestDir {
    pub path: PathBuf,
}

impl ManifestDir {
    /// Copies every `*.yaml` / `*.yml` file of `sources` (in order) into one fresh folder; a
    /// later file with the name of an earlier one is an error, not an override.
    pub fn assemble(sources: &[&Path]) -> ManifestDir {
        let path = std::env::temp_dir().join(unique_name("e2e-manifests"));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        let dir = ManifestDir { path };
        for source in sources {
            let entries = std::fs::read_dir(source)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", source.display()));
            for entry in entries {
                let file = entry.expect("directory entry").path();
                let is_yaml = matches!(
                    file.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml")
                );
                if !is_yaml {
                    continue;
                }
                let target = dir.path.join(file.file_name().expect("file name"));
                assert!(
                    !target.exists(),
                    "two manifest folders both have {}",
                    target.display()
                );
                std::fs::copy(&file, &target).unwrap_or_else(|e| {
                    panic!(
                        "cannot copy {} to {}: {e}",
                        file.display(),
                        target.display()
                    )
                });
            }
        }
        dir
    }

    /// `deploy/standalone` plus `tests/cluster-manifests`.
    pub fn cluster() -> ManifestDir {
        let root = workspace_root();
        ManifestDir::assemble(&[
            &root.join("deploy").join("standalone"),
            &root.join("tests").join("cluster-manifests"),
        ])
    }

    /// [`ManifestDir::cluster`] with every virtual model routed to `upstreams` (see
    /// [`RoutedManifests`]).
    pub fn cluster_routed(upstreams: &[UpstreamDef]) -> ManifestDir {
        let routed = RoutedManifests::new(upstreams);
        ManifestDir::assemble(&[
            &routed.path,
            &workspace_root().join("tests").join("cluster-manifests"),
        ])
    }
}

impl Drop for ManifestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One Redis (a redis-server, or a [`RedisCluster`]) and `pods.len()` `gateway serve`
/// processes on it. Dropping it kills them.
pub struct Cluster<R = RedisServer> {
    /// The pods, started with the same flags unless built one by one with [`Cluster::pod_builder`].
    pub pods: Vec<Gateway>,
    pub redis: R,
    pub manifests: ManifestDir,
}

impl Cluster<RedisCluster> {
    /// A [`RedisCluster`] and `pods` gateways started with `configure(builder)` on top of
    /// `serve --redis-url redis-cluster://... --manifests <cluster manifests>`; returns once
    /// every pod admits through the cluster.
    pub async fn start_on_redis_cluster(
        pods: usize,
        configure: impl Fn(GatewayBuilder) -> GatewayBuilder,
    ) -> Self {
        Self::start_on_redis_cluster_with(ManifestDir::cluster(), pods, configure).await
    }

    /// [`Cluster::start_on_redis_cluster`] on a cluster over TLS only
    /// ([`RedisCluster::start_tls`]).
    pub async fn start_on_redis_cluster_tls(
        pods: usize,
        configure: impl Fn(GatewayBuilder) -> GatewayBuilder,
    ) -> Self {
        let configure: &dyn Fn(GatewayBuilder) -> GatewayBuilder = &configure;
        Self::start_with_redis(
            RedisCluster::start_tls().await,
            ManifestDir::cluster(),
            &vec![configure; pods],
        )
        .await
    }

    /// [`Cluster::start_on_redis_cluster`] on `manifests` instead of the cluster's own.
    pub async fn start_on_redis_cluster_with(
        manifests: ManifestDir,
        pods: usize,
        configure: impl Fn(GatewayBuilder) -> GatewayBuilder,
    ) -> Self {
        let configure: &dyn Fn(GatewayBuilder) -> GatewayBuilder = &configure;
        Self::start_with_redis(
            RedisCluster::start().await,
            manifests,
            &vec![configure; pods],
        )
        .await
    }
}

impl Cluster<RedisServer> {
    /// A redis-server and `pods` gateways started with `configure(builder)` on top of
    /// `serve --redis-url ... --manifests <cluster manifests>`; returns once every pod admits
    /// through Redis.
    pub async fn start(
        pods: usize,
        configure: impl Fn(GatewayBuilder) -> GatewayBuilder,
    ) -> Cluster {
        let configure: &dyn Fn(GatewayBuilder) -> GatewayBuilder = &configure;
        Self::start_each(&vec![configure; pods]).await
    }

    /// [`Cluster::start`] on a redis-server over TLS only ([`RedisServer::start_tls`]).
    pub async fn start_tls(
        pods: usize,
        configure: impl Fn(GatewayBuilder) -> GatewayBuilder,
    ) -> Cluster {
        let configure: &dyn Fn(GatewayBuilder) -> GatewayBuilder = &configure;
        Self::start_with_redis(
            RedisServer::start_tls().await,
            ManifestDir::cluster(),
            &vec![configure; pods],
        )
        .await
    }

    /// A redis-server and one gateway per builder (each already configured by the caller on
    /// top of [`Cluster::pod_builder`]'s defaults).
    pub async fn start_each(configure: &[&dyn Fn(GatewayBuilder) -> GatewayBuilder]) -> Cluster {
        Self::start_on(ManifestDir::cluster(), configure).await
    }

    /// A redis-server and one gateway per builder, on `manifests` instead of the cluster's own.
    pub async fn start_on(
        manifests: ManifestDir,
        configure: &[&dyn Fn(GatewayBuilder) -> GatewayBuilder],
    ) -> Cluster {
        Self::start_with_redis(RedisServer::start().await, manifests, configure).await
    }
}

impl<R: SharedRedis> Cluster<R> {
    /// One gateway per builder on `redis`, once every pod admits through it.
    pub async fn start_with_redis(
        redis: R,
        manifests: ManifestDir,
        configure: &[&dyn Fn(GatewayBuilder) -> GatewayBuilder],
    ) -> Self {
        let builders: Vec<GatewayBuilder> = configure
            .iter()
            .map(|c| c(pod_builder(&redis, &manifests)))
            .collect();
        let pods = futures::future::join_all(builders.into_iter().map(GatewayBuilder::start)).await;
        let cluster = Cluster {
            pods,
            redis,
            manifests,
        };
        cluster.wait_admitting().await;
        cluster
    }

    /// The builder every pod starts from: `serve` on this cluster's Redis and manifests.
    pub fn pod_builder(&self) -> GatewayBuilder {
        pod_builder(&self.redis, &self.manifests)
    }

    /// Pod `i` modulo the pod count, for round-robin loops.
    pub fn pod(&self, i: usize) -> &Gateway {
        &self.pods[i % self.pods.len()]
    }

    /// Waits until every pod admits through Redis: polls each pod with `count_tokens` of the
    /// [`PROBE`] key until one is admitted *and* counted in Redis (a fail-open pod that has
    /// not reached Redis yet admits locally, which does not count). A pod prints its ready
    /// line without waiting for Redis, and until its connection is up its admissions follow
    /// the outage policy. [`Cluster::start`] calls this.
    pub async fn wait_admitting(&self) {
        let window = format!("rl:{{{}}}:w", PROBE.id);
        for (i, pod) in self.pods.iter().enumerate() {
            crate::poll_until(
                &format!("pod {i} to admit a request through Redis"),
                Duration::from_secs(15),
                Duration::from_millis(100),
                || async {
                    let count = || async {
                        match self.redis.command(&["HGET", &window, "req"]).await {
                            Ok(reply) => reply.as_i64().unwrap_or(0),
                            Err(_) => -1,
                        }
                    };
                    let before = count().await;
                    let resp = pod
                        .count_tokens(PROBE.secret, &crate::count_body("svc/haiku", "hi"))
                        .await;
                    let after = count().await;
                    // A new window starts counting at 1.
                    let counted =
                        before >= 0 && (after == before + 1 || (after == 1 && before != 0));
                    (resp.status == 200 && counted).then_some(())
                },
            )
            .await;
        }
    }

    /// Every pod's logs, labelled, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, pod) in self.pods.iter().enumerate() {
            out.push_str(&format!(
                "===== pod {i} ({}) =====\n{}\n",
                pod.api,
                pod.logs()
            ));
        }
        out.push_str(&format!(
            "===== redis ({}) =====\n{}",
            self.redis.url(),
            self.redis.logs()
        ));
        out
    }
}

fn pod_builder(redis: &impl SharedRedis, manifests: &ManifestDir) -> GatewayBuilder {
    redis
        .tls_flags()
        .iter()
        .fold(Gateway::builder().serve(&redis.url()), |b, flag| {
            b.arg(flag)
        })
        .manifests(&manifests.path)
}
