//! The chart's pods, running: `helm install` into the test cluster of `e2e::node` (a real
//! kube-apiserver, kube-controller-manager and kube-scheduler, and a node running each pod's
//! containers from the image with podman), with Redis and Postgres outside the cluster, named
//! through the Secrets the README has the platform team create. nginx plays the Ingress
//! controller in front of the Service's endpoints.
//!
//! Fails (never skips) when a tool it needs is missing: helm, the Kubernetes binaries
//! (`scripts/kube-apiserver`, `scripts/kube-node`), podman or the image (`scripts/image`).

use std::time::{Duration, Instant};

use e2e::helm::{assert_ok, helm_waiting, Trial};
use e2e::kube::KubeApi;
use e2e::node::TestNode;
use e2e::sdk::sdk_call;
use e2e::{MockUpstream, Nginx, PostgresServer, RedisServer, RoutedManifests, UpstreamDef};
use serde_json::Value;

/// How soon an applied resource is served by every pod: the operator's publication and the
/// gateways' watch of the config Secret (docs/operator.md).
const PUBLISHED_WITHIN: Duration = Duration::from_secs(10);

/// The release whose service accounts the chart names `gateway` and `gateway-operator`.
const RELEASE: &str = "gateway";

/// `helm install` of the chart copy, asserted to succeed: it returns once the pre-install
/// migration Job has completed on the node.
async fn helm_install(trial: &Trial, node: &TestNode) {
    let started = Instant::now();
    // The 1.20 API server has no policy/v1 PodDisruptionBudget (see docs/kubernetes.md).
    let args = [
        "install",
        RELEASE,
        &trial.chart,
        "--disable-openapi-validation",
        "--set",
        "gateway.pdb.enabled=false",
        "--timeout",
        "2m",
    ];
    let out = helm_waiting(&trial.api, &args).await;
    assert!(
        out.status.success(),
        "helm install failed:\n{}\n{}\nnode:\n{}\nmigrations:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        node.logs(),
        node.pod_logs("gateway-migrate")
    );
    eprintln!(
        "helm install (the migration Job included): {:?}",
        started.elapsed()
    );
}

/// The running chart and what it runs against.
struct Installed {
    trial: Trial,
    node: TestNode,
    pg: PostgresServer,
    mock: MockUpstream,
    redis: RedisServer,
    _manifests: RoutedManifests,
}

impl Installed {
    /// Starts the cluster and the stores, creates the stores' Secrets as the README says and
    /// runs `helm install` (which returns once the pre-install migration Job has completed on
    /// the node), then applies the tiers, keys and routes to a mock upstream.
    async fn install() -> Installed {
        let Some(trial) = Trial::start(RELEASE).await else {
            panic!("helm or the Kubernetes API server is missing: see scripts/test");
        };
        let node = TestNode::start(&trial.api).await;
        let (redis, pg, mock) = (
            RedisServer::start().await,
            PostgresServer::start().await,
            MockUpstream::start().await,
        );
        let api = &trial.api;
        for (secret, url) in [
            ("gateway-redis", redis.url()),
            ("gateway-postgres", pg.url()),
        ] {
            let literal = format!("--from-literal=url={url}");
            let out = api.kubectl(&["create", "secret", "generic", secret, &literal]);
            assert_ok(&format!("kubectl create secret {secret}"), &out);
        }
        helm_install(&trial, &node).await;
        let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
        api.apply_path(manifests.path.to_str().expect("a UTF-8 path"));
        Installed {
            trial,
            node,
            pg,
            mock,
            redis,
            _manifests: manifests,
        }
    }

    fn api(&self) -> &KubeApi {
        &self.trial.api
    }

    /// `kubectl rollout status` of the Deployment, asserted to succeed.
    async fn rolled_out(&self, deployment: &str) {
        let started = Instant::now();
        let out = self
            .api()
            .kubectl_waiting(&[
                "rollout",
                "status",
                &format!("deployment/{deployment}"),
                "--timeout=240s",
            ])
            .await;
        assert!(
            out.status.success(),
            "deployment/{deployment} did not roll out: {}\n{}\nnode:\n{}\npods:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.node.logs(),
            self.node.pod_logs(deployment)
        );
        eprintln!("{deployment} rolled out: {:?}", started.elapsed());
    }

    /// The gateway pods as the API server has them.
    fn gateway_pods(&self) -> Vec<Value> {
        let out = self.api().kubectl(&[
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=gateway",
            "-o",
            "json",
        ]);
        assert_ok("kubectl get pods", &out);
        let list: Value = serde_json::from_slice(&out.stdout).expect("a pod list");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// `ADDRESS:PORT` of every ready endpoint of the gateway Service, once there are `count`.
    async fn service_endpoints(&self, count: usize) -> Vec<String> {
        e2e::poll_until(
            &format!("{count} ready endpoints of the Service"),
            Duration::from_secs(120),
            Duration::from_millis(500),
            || async {
                let out = self
                    .api()
                    .kubectl(&["get", "endpoints", RELEASE, "-o", "json"]);
                let endpoints: Value = serde_json::from_slice(&out.stdout).ok()?;
                let subset = &endpoints["subsets"][0];
                let port = subset["ports"][0]["port"].as_u64().unwrap_or_default();
                let addresses: Vec<String> = subset["addresses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a["ip"].as_str())
                    .map(|ip| format!("{ip}:{port}"))
                    .collect();
                (addresses.len() == count).then_some(addresses)
            },
        )
        .await
    }

    /// Installs, waits for both Deployments to roll out and for the operator's scaler to
    /// bring the gateway to two ready pods: their Service endpoints.
    async fn serving() -> (Installed, Vec<String>) {
        let chart = Installed::install().await;
        chart.rolled_out("gateway-operator").await;
        chart.rolled_out(RELEASE).await;
        let endpoints = chart.service_endpoints(2).await;
        (chart, endpoints)
    }

    /// A key with credits, created with the gateway's own CLI against the ledger: its id and
    /// secret.
    async fn key_with_id(&self) -> (String, String) {
        let created = self
            .pg
            .gateway_cli(&[
                "keys",
                "create",
                "--new-account",
                "node",
                "--credits",
                "100000000",
            ])
            .await
            .expect("keys create");
        let id = created["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no key id in {created}"));
        let secret = created["key"].as_str().expect("the key's secret");
        (id.to_owned(), secret.to_owned())
    }

    /// A key with credits, created with the gateway's own CLI against the ledger.
    async fn key(&self) -> String {
        self.key_with_id().await.1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_with_external_stores_migrates_readies_the_pods_by_their_probes_and_the_ingress_serves_the_sdk(
) {
    let (chart, endpoints) = Installed::serving().await;
    let migrations = chart
        .pg
        .query_i64("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .await;
    assert!(migrations > 0, "the migration Job migrated nothing");
    // The operator's scaler raised the Deployment from the API server's one replica to the
    // chart's gateway.replicas (2); both pods passed their readiness probes.
    let pods = chart.gateway_pods();
    let ready: Vec<&Value> = pods
        .iter()
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .collect();
    assert_eq!(ready.len(), 2, "two ready gateway pods: {pods:#?}");
    for pod in &ready {
        let ip = pod["status"]["podIP"].as_str().expect("a pod IP");
        assert!(
            endpoints.contains(&format!("{ip}:8080")),
            "the Service's endpoints {endpoints:?} lack the ready pod at {ip}"
        );
    }

    let nginx = Nginx::start_in_front_of(&endpoints).await;
    let key = chart.key().await;
    // Round robin: each pod serves one of the turns.
    for turn in 1..=endpoints.len() {
        match sdk_call(&nginx.url(""), &key).await {
            Ok(id) => assert!(id.starts_with("msg_"), "{id}"),
            Err(status) => panic!(
                "the SDK got {status} through the ingress:\n{}\n{}",
                nginx.logs(),
                chart.node.pod_logs(RELEASE)
            ),
        }
        assert_eq!(
            chart.mock.request_count(),
            turn,
            "the turn reached the upstream"
        );
    }

    // Readiness is the probes' (fail-closed, the default): with Redis gone every pod turns
    // not ready and leaves the Service; back when Redis is.
    let mut chart = chart;
    chart.redis.stop().await;
    chart.service_endpoints(0).await;
    chart.redis.restart().await;
    let endpoints = chart.service_endpoints(2).await;
    let nginx = Nginx::start_in_front_of(&endpoints).await;
    assert!(sdk_call(&nginx.url(""), &key).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_an_enterprise_api_key_takes_effect_on_every_gateway_pod() {
    let (chart, endpoints) = Installed::serving().await;
    let (id, key) = chart.key_with_id().await;
    let grant = format!(
        "apiVersion: gateway.svc.dev/v1alpha1\nkind: ApiKey\nmetadata:\n  name: node-grant\n\
         spec:\n  keyId: {id}\n  tier: enterprise\n  limits:\n    requestsPerMinute: 77\n    \
         inputTokensPerMinute: 7777\n    concurrentStreams: 7\n"
    );
    let applied = Instant::now();
    assert_ok("kubectl apply of the ApiKey", &chart.api().apply(&grant));
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    // Each pod directly (its Service endpoint), not through a balancer that could hide one.
    for endpoint in &endpoints {
        let limits = e2e::poll_until(
            &format!("the grant to reach the pod at {endpoint}"),
            PUBLISHED_WITHIN,
            Duration::from_millis(200),
            || async {
                let response = client
                    .post(format!("http://{endpoint}/v1/messages"))
                    .bearer_auth(&key)
                    .json(&e2e::message("svc/haiku", "hi", 16))
                    .send()
                    .await
                    .ok()?;
                let rl = e2e::Resp::read(response).await.rate_limit();
                (rl.limit_requests == 77).then_some(rl)
            },
        )
        .await;
        assert_eq!(limits.tier, "enterprise");
        assert_eq!(limits.limit_tokens, 7777);
    }
    eprintln!(
        "the grant served by every pod after {:?}",
        applied.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_keeps_the_crds_and_the_database_and_a_reinstall_serves_the_same_keys() {
    let (chart, endpoints) = Installed::serving().await;
    let key = chart.key().await;
    let nginx = Nginx::start_in_front_of(&endpoints).await;
    assert!(sdk_call(&nginx.url(""), &key).await.is_ok());
    drop(nginx);

    let out = helm_waiting(chart.api(), &["uninstall", RELEASE, "--wait"]).await;
    assert_ok("helm uninstall", &out);
    // Every pod of the release stopped (podman stop with its grace) and gone.
    e2e::poll_until(
        "the release's pods to be gone",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let out = chart.api().kubectl(&[
                "get",
                "pods",
                "-l",
                &format!("app.kubernetes.io/instance={RELEASE}"),
                "-o",
                "name",
            ]);
            (out.status.success() && out.stdout.is_empty()).then_some(())
        },
    )
    .await;
    let crds = chart
        .api()
        .kubectl(&["get", "apikeys,tiers,modelroutes", "-o", "name"]);
    assert_ok("kubectl get of the custom resources", &crds);
    assert!(
        !crds.stdout.is_empty(),
        "helm uninstall took the CRDs and their resources"
    );

    helm_install(&chart.trial, &chart.node).await;
    chart.rolled_out("gateway-operator").await;
    chart.rolled_out(RELEASE).await;
    let endpoints = chart.service_endpoints(2).await;
    let nginx = Nginx::start_in_front_of(&endpoints).await;
    match sdk_call(&nginx.url(""), &key).await {
        Ok(id) => assert!(id.starts_with("msg_"), "{id}"),
        Err(status) => panic!("the key from before the uninstall got {status}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_with_a_changed_value_rolls_the_pods_without_the_service_losing_a_ready_endpoint(
) {
    let (chart, before) = Installed::serving().await;
    let key = chart.key().await;
    let out = helm_waiting(
        chart.api(),
        &[
            "upgrade",
            RELEASE,
            &chart.trial.chart,
            "--disable-openapi-validation",
            "--set",
            "gateway.pdb.enabled=false,gateway.logFormat=text",
        ],
    )
    .await;
    assert_ok("helm upgrade", &out);
    // While the Deployment rolls (maxSurge 1, maxUnavailable 0), the Service always has both
    // pods' worth of ready endpoints.
    let rolled = chart.rolled_out(RELEASE);
    let watch = async {
        let mut fewest = usize::MAX;
        loop {
            let out = chart
                .api()
                .kubectl(&["get", "endpoints", RELEASE, "-o", "json"]);
            if let Ok(endpoints) = serde_json::from_slice::<Value>(&out.stdout) {
                let ready = endpoints["subsets"][0]["addresses"]
                    .as_array()
                    .map_or(0, Vec::len);
                fewest = fewest.min(ready);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if fewest < 2 {
                return fewest;
            }
        }
    };
    tokio::select! {
        () = rolled => {}
        fewest = watch => panic!("the Service fell to {fewest} ready endpoints during the roll"),
    }
    let after = chart.service_endpoints(2).await;
    // The old pods may still be draining (terminating, out of the endpoints).
    let pods = chart.gateway_pods();
    let current = pods
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null());
    for pod in current {
        let args = pod["spec"]["containers"][0]["args"].to_string();
        assert!(
            args.contains("--log-format=text"),
            "a pod of the old template: {args}"
        );
    }
    assert!(
        after.iter().all(|e| !before.contains(e)),
        "the old pods {before:?} are still the endpoints {after:?}"
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    for endpoint in &after {
        let response = client
            .post(format!("http://{endpoint}/v1/messages"))
            .bearer_auth(&key)
            .json(&e2e::message("svc/haiku", "hi", 16))
            .send()
            .await
            .expect("POST /v1/messages");
        e2e::Resp::read(response).await.expect_ok();
    }
}
