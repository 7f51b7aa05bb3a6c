//! The chart's pods, running: `helm install` into the test cluster of `e2e::node` (a real
//! kube-apiserver, kube-controller-manager and kube-scheduler, and a node running each pod's
//! containers from the image with podman) of the chart as `scripts/release` publishes it: each
//! journey releases the test's binaries to a local registry (`e2e::registry::Release`) and
//! installs the chart from `oci://` at its version with the image pinned by its digest, which
//! the node pulls from that registry. Redis and Postgres run outside the cluster, named
//! through the Secrets the README has the platform team create. The stores are run as a
//! managed-store platform runs them (docs/kubernetes.md, "Production checklist"): Postgres
//! over TLS only (`ssl=on`, `hostssl` lines alone; with certificate authentication in some
//! journeys), Redis on its TLS port only with an ACL user and client certificates; their CAs
//! and client certificates in Secrets the chart mounts (`postgres.tls.*`, `redis.tls.*`), so
//! the migration Job, the gateway pods and the operator's sweep all connect over verified TLS.
//! nginx plays the Ingress controller in front of the Service's endpoints, configured from the
//! chart's own Ingress as the API server has it (its paths and ingress-nginx annotations,
//! `e2e::Routes`): a path the chart does not route is nginx's 404, as it would be in a
//! cluster. The sign-up journey goes through the chart's HTTPRoute, translated likewise; the
//! single sign-on journey through the Ingress under its host, which the public URL (and so the
//! provider's redirect URI) names.
//!
//! Fails (never skips) when a tool it needs is missing: helm, the Kubernetes binaries
//! (`scripts/kube-apiserver`, `scripts/kube-node`), podman or the image (`scripts/image`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e::books::{assert_books_balance, tally};
use e2e::helm::{assert_ok, helm_waiting, Trial};
use e2e::kube::KubeApi;
use e2e::node::TestNode;
use e2e::oidc::{MockIssuer, Tamper, CLIENT_ID, CLIENT_SECRET};
use e2e::registry::Release;
use e2e::sdk::sdk_call;
use e2e::sse::assemble_message_stream;
use e2e::stripe::{deliver, MockStripe, API_KEY, WEBHOOK_SECRET};
use e2e::upstream::UPSTREAM_API_KEY;
use e2e::visitor::{hidden_csrf, link_to, mails_to, new_email, Site, Visitor};
use e2e::{
    Fault, MessageStream, MockUpstream, Nginx, PostgresServer, RedisServer, Reply, Resp,
    RoutedManifests, Routes, Scrape, SseStream, Unscripted, UpstreamDef,
};
use futures::StreamExt;
use serde_json::{json, Value};

/// How soon an applied resource is served by every pod: the operator's publication and the
/// gateways' watch of the config Secret (docs/operator.md).
const PUBLISHED_WITHIN: Duration = Duration::from_secs(10);

/// The release whose service accounts the chart names `gateway` and `gateway-operator`.
const RELEASE: &str = "gateway";

/// The values every journey installs with: the 1.20 API server has no policy/v1
/// PodDisruptionBudget (see docs/kubernetes.md); the chart's Ingress, which the harness's nginx
/// is configured from (`Installed::ingress_routes`); the operator reads the Secrets the
/// journeys' manifests ([`RoutedManifests`]: the mock's API key, the standalone seed) refer to.
/// Each Redis call is bounded at 2 s (`gateway.redisTimeoutMs`), as the harness bounds its
/// debug gateway processes (`e2e::GatewayBuilder::start`): the chart's 250 ms is for a release
/// build on cores of its own, and the debug image's TLS to Redis on two cores shared with a
/// build missed it now and then with no outage (the limiter's 503 in the upgrade and the
/// ApiKey journeys), which tests the machine's scheduler, not the chart.
const VALUES: &[&str] = &[
    "gateway.pdb.enabled=false",
    "gateway.redisTimeoutMs=2000",
    "gateway.ingress.enabled=true",
    "operator.secrets={mock-upstream-key,example-enterprise-key}",
];

/// A helm value: its flag (`--set`, `--set-string`) and `KEY=VALUE`.
type HelmValue = (&'static str, String);

/// Where a journey's chart comes from: `helm install|upgrade` arguments naming it.
#[derive(Clone)]
struct ChartSource(Vec<String>);

impl ChartSource {
    /// The chart as `scripts/release` published it, from its OCI registry at its version, and
    /// the image pinned by the pushed digest (which the node pulls from that registry).
    fn released(release: &Release) -> (ChartSource, Vec<HelmValue>) {
        let chart = ChartSource(vec![
            release.chart.clone(),
            "--version".into(),
            release.version.clone(),
            "--plain-http".into(),
        ]);
        let values = release
            .image_values()
            .into_iter()
            .map(|v| ("--set", v))
            .collect();
        (chart, values)
    }
}

/// `helm VERB RELEASE CHART` with `values` (a flag, `--set` or `--set-string`, and its
/// `KEY=VALUE` each, set one by one so that a value may hold commas) and `extra` arguments.
async fn helm_release(
    trial: &Trial,
    verb: &str,
    chart: &ChartSource,
    values: &[HelmValue],
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![verb, RELEASE];
    args.extend(chart.0.iter().map(String::as_str));
    args.push("--disable-openapi-validation");
    for (flag, value) in values {
        args.extend([*flag, value]);
    }
    args.extend_from_slice(extra);
    helm_waiting(&trial.api, &args).await
}

/// `helm install` of the chart copy with `values`, asserted to succeed: it returns once the
/// pre-install migration Job has completed on the node.
async fn helm_install(trial: &Trial, node: &TestNode, chart: &ChartSource, values: &[HelmValue]) {
    let started = Instant::now();
    let out = helm_release(trial, "install", chart, values, &["--timeout", "2m"]).await;
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

/// What a journey installs beyond [`VALUES`].
#[derive(Default)]
struct Setup {
    values: Vec<HelmValue>,
    /// Secrets created before the install: name and `KEY=VALUE` literals.
    secrets: Vec<(&'static str, Vec<String>)>,
    /// What the mock upstream answers; a short text by default.
    reply: Option<Reply>,
    /// Postgres authenticates TCP clients by their certificate alone (`hostssl … cert`), and
    /// the chart is given one (`postgres.tls.clientCertSecret`); else any client over TLS.
    postgres_cert_auth: bool,
}

impl Setup {
    fn value(mut self, key: &str, value: &str) -> Setup {
        self.values.push(("--set", format!("{key}={value}")));
        self
    }

    /// The environment variables `env` of the container at `path` (`gateway`, `operator`).
    fn env(mut self, path: &str, env: &[(&str, &str)]) -> Setup {
        for (i, (name, value)) in env.iter().enumerate() {
            self = self.value(&format!("{path}.env[{i}].name"), name);
            // A value that looks like a number is still a string.
            self.values
                .push(("--set-string", format!("{path}.env[{i}].value={value}")));
        }
        self
    }
}

/// The Secret with the Postgres CA's bundle, under a key of its own name (as a provider's
/// bundle is downloaded: `postgres.tls.caSecretKey`).
const POSTGRES_CA: (&str, &str) = ("postgres-ca", "ca-bundle.pem");
/// The Secret with the Redis CA (its default key, `ca.crt`).
const REDIS_CA: &str = "redis-ca";
/// The `kubernetes.io/tls` Secrets of the client certificates.
const REDIS_CLIENT: &str = "redis-client";
const POSTGRES_CLIENT: &str = "postgres-client";

/// Creates the Secrets of TLS to the stores (the CAs that signed their certificates, the
/// client certificates Redis demands and, under certificate authentication, Postgres too) and
/// returns the values that hand them to the chart.
fn store_tls_secrets(api: &KubeApi, pg: &PostgresServer, redis: &RedisServer) -> Vec<HelmValue> {
    let pg_tls = pg.tls().expect("a TLS Postgres");
    let redis_tls = redis.tls().expect("a TLS Redis");
    let path = |p: &std::path::Path| p.to_str().expect("a UTF-8 path").to_owned();
    let mut secrets = vec![
        vec![
            "generic".to_owned(),
            POSTGRES_CA.0.to_owned(),
            format!("--from-file={}={}", POSTGRES_CA.1, path(&pg_tls.ca)),
        ],
        vec![
            "generic".to_owned(),
            REDIS_CA.to_owned(),
            format!("--from-file=ca.crt={}", path(&redis_tls.ca)),
        ],
        vec![
            "tls".to_owned(),
            REDIS_CLIENT.to_owned(),
            format!("--cert={}", path(&redis_tls.client_cert)),
            format!("--key={}", path(&redis_tls.client_key)),
        ],
    ];
    let set = |key: &str, value: &str| ("--set", format!("{key}={value}"));
    let mut values = vec![
        set("postgres.tls.caSecret", POSTGRES_CA.0),
        set("postgres.tls.caSecretKey", POSTGRES_CA.1),
        set("redis.tls.caSecret", REDIS_CA),
        set("redis.tls.clientCertSecret", REDIS_CLIENT),
    ];
    if pg.requires_client_certificates() {
        secrets.push(vec![
            "tls".to_owned(),
            POSTGRES_CLIENT.to_owned(),
            format!("--cert={}", path(&pg_tls.client_cert)),
            format!("--key={}", path(&pg_tls.client_key)),
        ]);
        values.push(set("postgres.tls.clientCertSecret", POSTGRES_CLIENT));
    }
    for secret in secrets {
        let mut args = vec!["create", "secret"];
        args.extend(secret.iter().map(String::as_str));
        assert_ok(
            &format!("kubectl create secret {}", secret[1]),
            &api.kubectl(&args),
        );
    }
    values
}

/// Asserts that the ledger's clients (the gateway pods, the operator) reach Postgres over TLS
/// only, and that some do; with `client_certificate`, each showing the certificate
/// `CN=gateway`.
async fn assert_postgres_clients_on_tls(pg: &PostgresServer, client_certificate: bool) {
    let clients = "FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                   WHERE a.application_name = 'gateway'";
    let over_tls = pg
        .query_i64(&format!("SELECT count(*) {clients} AND s.ssl"))
        .await;
    assert!(over_tls > 0, "no connection of the pods over TLS");
    let plaintext = pg
        .query_i64(&format!("SELECT count(*) {clients} AND NOT s.ssl"))
        .await;
    assert_eq!(plaintext, 0, "connections of the pods in plaintext");
    if client_certificate {
        let others = pg
            .query(&format!(
                "SELECT coalesce(s.client_dn, 'none') {clients} \
                 AND s.client_dn IS DISTINCT FROM '/CN=gateway'"
            ))
            .await;
        assert_eq!(others, "", "connections without the client certificate");
    }
}

/// The running chart and what it runs against.
struct Installed {
    trial: Trial,
    node: TestNode,
    pg: PostgresServer,
    mock: MockUpstream,
    redis: RedisServer,
    /// The values it was installed with (an upgrade starts from them).
    values: Vec<HelmValue>,
    /// The chart it was installed from (an upgrade keeps it).
    chart: ChartSource,
    _manifests: RoutedManifests,
    /// What `scripts/release` published; dropped after the node, which runs its image.
    release: Release,
}

impl Installed {
    /// Starts the cluster and the stores, creates the stores' Secrets as the README says (and
    /// the setup's) and runs `helm install` (which returns once the pre-install migration Job
    /// has completed on the node), then applies the tiers, keys and routes to a mock upstream.
    async fn install(setup: Setup) -> Installed {
        let Some(trial) = Trial::start(RELEASE).await else {
            panic!("helm or the Kubernetes API server is missing: see scripts/test");
        };
        let node = TestNode::start(&trial.api).await;
        // Released as a platform's CI would (the chart copy the API server accepts), the image
        // pulled by the node from the release's registry.
        let started = Instant::now();
        let release = Release::publish(std::path::Path::new(&trial.chart)).await;
        eprintln!(
            "scripts/release to a local registry: {:?}",
            started.elapsed()
        );
        node.pull_over_plain_http(&release.registry.host());
        let (chart, image) = ChartSource::released(&release);
        let mock = match setup.reply {
            Some(reply) => {
                MockUpstream::serve("127.0.0.1:0", Unscripted::Always(reply), true).await
            }
            None => MockUpstream::start().await,
        };
        let redis = RedisServer::start_tls().await;
        let pg = if setup.postgres_cert_auth {
            PostgresServer::start_tls_cert_auth().await
        } else {
            PostgresServer::start_tls().await
        };
        let api = &trial.api;
        let tls_values = store_tls_secrets(api, &pg, &redis);
        let stores = [
            ("gateway-redis", vec![format!("url={}", redis.url())]),
            // As a managed Postgres's URL reads: the CA comes from its Secret, not the URL.
            (
                "gateway-postgres",
                vec![format!(
                    "url=postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full",
                    pg.port
                )],
            ),
        ];
        for (secret, literals) in stores.into_iter().chain(setup.secrets) {
            let mut args = vec!["create", "secret", "generic", secret];
            let literals: Vec<String> = literals
                .iter()
                .map(|l| format!("--from-literal={l}"))
                .collect();
            args.extend(literals.iter().map(String::as_str));
            assert_ok(
                &format!("kubectl create secret {secret}"),
                &api.kubectl(&args),
            );
        }
        let values: Vec<HelmValue> = VALUES
            .iter()
            .map(|v| ("--set", (*v).to_owned()))
            .chain(image)
            .chain(tls_values)
            .chain(setup.values)
            .collect();
        helm_install(&trial, &node, &chart, &values).await;
        let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
        api.apply_path(manifests.path.to_str().expect("a UTF-8 path"));
        Installed {
            trial,
            node,
            pg,
            mock,
            redis,
            values,
            chart,
            _manifests: manifests,
            release,
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
                let addresses = self.ready_endpoints().await;
                (addresses.len() == count).then_some(addresses)
            },
        )
        .await
    }

    /// Installs, waits for both Deployments to roll out and for the operator's scaler to
    /// bring the gateway to two ready pods: their Service endpoints.
    async fn serving(setup: Setup) -> (Installed, Vec<String>) {
        let chart = Installed::install(setup).await;
        chart.rolled_out("gateway-operator").await;
        chart.rolled_out(RELEASE).await;
        let endpoints = chart.service_endpoints(2).await;
        (chart, endpoints)
    }

    /// A key with [`KEY_CREDITS`], created with the gateway's own CLI against the ledger.
    async fn key_with_id(&self) -> CliKey {
        let credits = KEY_CREDITS.to_string();
        let created = self
            .pg
            .gateway_cli(&[
                "keys",
                "create",
                "--new-account",
                "node",
                "--credits",
                &credits,
            ])
            .await
            .expect("keys create");
        let field = |name: &str| {
            created[name]
                .as_str()
                .unwrap_or_else(|| panic!("no {name} in {created}"))
                .to_owned()
        };
        CliKey {
            id: field("id"),
            account_id: field("account_id"),
            secret: field("key"),
        }
    }

    /// A key with credits, created with the gateway's own CLI against the ledger.
    async fn key(&self) -> String {
        self.key_with_id().await.secret
    }

    /// `helm upgrade` with the install's values and `changed`, asserted to succeed.
    async fn upgrade(&self, changed: &[&str]) {
        let mut values = self.values.clone();
        values.extend(changed.iter().map(|v| ("--set", (*v).to_owned())));
        let out = helm_release(&self.trial, "upgrade", &self.chart, &values, &[]).await;
        assert_ok("helm upgrade", &out);
    }

    /// The Service's ready endpoints (`ADDRESS:PORT`) now, as an ingress controller reads them.
    async fn ready_endpoints(&self) -> Vec<String> {
        let out = self
            .api()
            .kubectl_waiting(&["get", "endpoints", RELEASE, "-o", "json"])
            .await;
        let Ok(endpoints) = serde_json::from_slice::<Value>(&out.stdout) else {
            return Vec::new();
        };
        let subset = &endpoints["subsets"][0];
        let port = subset["ports"][0]["port"].as_u64().unwrap_or_default();
        subset["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["ip"].as_str())
            .map(|ip| format!("{ip}:{port}"))
            .collect()
    }

    /// `kubectl apply` of an enterprise ApiKey giving `key` the limits (requests and input
    /// tokens per minute, concurrent streams); waits until every pod at `endpoints` serves it
    /// (each directly, not through a balancer that could hide one): how long that took.
    async fn grant(&self, endpoints: &[String], key: &CliKey, limits: (u64, u64, u64)) -> Duration {
        let (rpm, tpm, streams) = limits;
        let grant = format!(
            "apiVersion: gateway.svc.dev/v1alpha1\nkind: ApiKey\nmetadata:\n  name: node-grant\n\
             spec:\n  keyId: {}\n  tier: enterprise\n  limits:\n    requestsPerMinute: {rpm}\n    \
             inputTokensPerMinute: {tpm}\n    concurrentStreams: {streams}\n",
            key.id
        );
        let applied = Instant::now();
        assert_ok("kubectl apply of the ApiKey", &self.api().apply(&grant));
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a client");
        for endpoint in endpoints {
            // count_tokens: limited and answered with the key's limits, never billed.
            let limits = e2e::poll_until(
                &format!("the grant to reach the pod at {endpoint}"),
                PUBLISHED_WITHIN,
                Duration::from_millis(200),
                || async {
                    let response = client
                        .post(format!("http://{endpoint}/v1/messages/count_tokens"))
                        .bearer_auth(&key.secret)
                        .json(&e2e::count_body("svc/haiku", "hi"))
                        .send()
                        .await
                        .ok()?;
                    let rl = Resp::read(response).await.rate_limit();
                    (rl.limit_requests == rpm).then_some(rl)
                },
            )
            .await;
            assert_eq!(limits.tier, "enterprise");
            assert_eq!(limits.limit_tokens, tpm);
        }
        applied.elapsed()
    }

    /// The chart's Ingress as the API server has it, as ingress-nginx serves it: the paths it
    /// routes and the settings its annotations make.
    fn ingress_routes(&self) -> Routes {
        let out = self
            .api()
            .kubectl(&["get", "ingress", RELEASE, "-o", "json"]);
        assert_ok("kubectl get ingress", &out);
        Routes::from_ingress(&serde_json::from_slice(&out.stdout).expect("an Ingress"))
    }

    /// The harness's nginx as the ingress controller in front of `endpoints`, configured from
    /// the chart's Ingress.
    async fn ingress(&self, endpoints: &[String]) -> Nginx {
        Nginx::start_routing(&self.ingress_routes(), endpoints).await
    }

    /// The ingress controller's work, once: reads the Service's ready endpoints and moves
    /// `nginx` to them when they are not the `followed` ones (none ready: it keeps the last).
    /// The ready endpoints.
    async fn follow_endpoints(&self, nginx: &Nginx, followed: &mut Vec<String>) -> Vec<String> {
        let ready = self.ready_endpoints().await;
        if !ready.is_empty() && ready != *followed {
            nginx.follow(&ready).await;
            followed.clone_from(&ready);
        }
        ready
    }
}

/// A client opening a new connection to the ingress for each turn: the harness's nginx follows
/// the endpoints by reloading, and a reload closes its old worker's idle client connections,
/// so a turn sent on one at that instant would fail on the client's hop before any gateway
/// sees it (the race every HTTP client meets at an nginx reload, which the SDKs retry).
fn fresh_connections() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(90))
        .build()
        .expect("a client")
}

/// Each pod's name, address, whether it is being deleted, and its Ready condition since when:
/// what a failure about the Service's endpoints needs to show.
fn readiness(pods: &[Value]) -> String {
    pods.iter()
        .map(|pod| {
            let ready = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready");
            format!(
                "{} {} deleting={} ready={} since {}",
                pod["metadata"]["name"],
                pod["status"]["podIP"],
                !pod["metadata"]["deletionTimestamp"].is_null(),
                ready.map_or(Value::Null, |c| c["status"].clone()),
                ready.map_or(Value::Null, |c| c["lastTransitionTime"].clone()),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Credits of a key [`Installed::key_with_id`] creates.
const KEY_CREDITS: u64 = 100_000_000;

/// A key created with the gateway's CLI.
struct CliKey {
    id: String,
    account_id: String,
    secret: String,
}

/// The chart as a platform installs a release: `scripts/release` publishes it to a registry
/// (here a local one), and `helm install` takes the chart from `oci://` at its version with the
/// image pinned by the pushed digest, which the node pulls (the machine has no copy of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_of_the_released_chart_with_external_stores_pulls_the_image_by_digest_migrates_readies_the_pods_by_their_probes_and_the_ingress_serves_the_sdk(
) {
    // Postgres with certificate authentication: the migration Job, the pods and the operator
    // each show the chart's client certificate, or are refused.
    let setup = Setup {
        postgres_cert_auth: true,
        ..Setup::default()
    };
    let (chart, endpoints) = Installed::serving(setup).await;
    let by_digest = chart.release.image_by_digest();
    // Every container of both Deployments runs the image by that digest, as the node pulled it.
    let out = chart.api().kubectl(&["get", "pods", "-o", "json"]);
    assert_ok("kubectl get pods", &out);
    let pods: Value = serde_json::from_slice(&out.stdout).expect("a pod list");
    let mut running = 0;
    for pod in pods["items"].as_array().into_iter().flatten() {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        for status in pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(status["image"], by_digest.as_str(), "{name}: {status}");
            assert_eq!(status["imageID"], by_digest.as_str(), "{name}: {status}");
            running += 1;
        }
    }
    assert!(running >= 3, "{running} containers: {pods:#}");
    assert!(
        chart.node.logs().contains(&format!("pulled {by_digest}")),
        "the node never pulled {by_digest}:\n{}",
        chart.node.logs()
    );
    let migrations = chart
        .pg
        .query_i64("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .await;
    assert!(migrations > 0, "the migration Job migrated nothing");
    assert_postgres_clients_on_tls(&chart.pg, true).await;
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

    let nginx = chart.ingress(&endpoints).await;
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

    // Readiness ignores the shared stores (docs/kubernetes.md, "Probes"): with Redis gone the
    // pods stay in the Service and answer with the API's 503 and Retry-After (fail-closed, the
    // default), not a load balancer's bare 502; served again once Redis is back.
    let mut chart = chart;
    chart.redis.stop().await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    let refused = e2e::poll_until(
        "a turn refused with 503 while Redis is gone",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let response = http
                .post(nginx.url("/v1/messages"))
                .bearer_auth(&key)
                .json(&e2e::message("svc/haiku", "hi", 16))
                .send()
                .await
                .ok()?;
            let resp = Resp::read(response).await;
            (resp.status == 503).then_some(resp)
        },
    )
    .await;
    assert!(refused.header("retry-after").is_some(), "{refused}");
    assert_eq!(refused.json()["type"], "error", "{refused}");
    // Two readiness periods and more: no pod left the Service.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        chart.ready_endpoints().await.len(),
        2,
        "a pod left the Service during the store outage"
    );
    chart.redis.restart().await;
    e2e::poll_until(
        "a turn served once Redis is back",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async { sdk_call(&nginx.url(""), &key).await.ok() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_an_enterprise_api_key_takes_effect_on_every_gateway_pod() {
    let (chart, endpoints) = Installed::serving(Setup::default()).await;
    let key = chart.key_with_id().await;
    let took = chart.grant(&endpoints, &key, (77, 7777, 7)).await;
    eprintln!("the grant served by every pod after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_keeps_the_crds_and_the_database_and_a_reinstall_serves_the_same_keys() {
    let (chart, endpoints) = Installed::serving(Setup::default()).await;
    let key = chart.key().await;
    let nginx = chart.ingress(&endpoints).await;
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

    helm_install(&chart.trial, &chart.node, &chart.chart, &chart.values).await;
    chart.rolled_out("gateway-operator").await;
    chart.rolled_out(RELEASE).await;
    let endpoints = chart.service_endpoints(2).await;
    let nginx = chart.ingress(&endpoints).await;
    match sdk_call(&nginx.url(""), &key).await {
        Ok(id) => assert!(id.starts_with("msg_"), "{id}"),
        Err(status) => panic!("the key from before the uninstall got {status}"),
    }
}

/// Turns that last (held back 400 ms, then streamed in chunks 100 ms apart): a pod told to
/// stop has turns in flight to finish.
fn lasting_reply() -> Reply {
    Reply::text("one two three four five six seven eight nine ten")
        .fault(Fault::FirstByteDelay(Duration::from_millis(400)))
        .chunk_delay(Duration::from_millis(100))
}

/// The chart's HTTPRoute, rendered with the journeys' values, as a Gateway API implementation
/// serves it.
fn http_route_routes() -> Routes {
    let mut args = vec![
        "gw",
        "charts/gateway",
        "--show-only",
        "templates/gateway-httproute.yaml",
        "--set",
        "gateway.httpRoute.enabled=true",
        "--set",
        "gateway.httpRoute.parentRefs[0].name=public",
    ];
    for value in VALUES {
        args.extend(["--set", value]);
    }
    let rendered = e2e::helm::template(&args);
    let route: Value = serde_yaml::from_str(&rendered).expect("the rendered HTTPRoute");
    Routes::from_http_route(&route)
}

/// Where the identity provider sends the browser back (the gateway's callback).
const SSO_CALLBACK: &str = "/developers/sso/callback";

/// Time between two promotion sweeps of the operator (5 minutes by default).
const SWEEP_INTERVAL: &str = "2s";

/// The dashboard through the ingress; the mails it sends in the gateway pods' logs (no mail
/// server is configured).
struct Ingress<'a> {
    url: String,
    node: &'a TestNode,
}

impl Site for Ingress<'_> {
    fn api(&self) -> &str {
        &self.url
    }

    fn log(&self) -> String {
        self.node.pod_logs(RELEASE)
    }
}

/// The tier the ingress serves `key` on (a count_tokens call, never billed), from the
/// answer's X-RateLimit-Tier, refused (429: the free tier's 5 requests a minute) or not.
async fn tier_through(ingress: &str, key: &str) -> String {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client")
        .post(format!("{ingress}/v1/messages/count_tokens"))
        .bearer_auth(key)
        .json(&e2e::count_body("svc/haiku", "hi"))
        .send()
        .await
        .expect("count_tokens through the ingress");
    let resp = Resp::read(response).await;
    assert!(
        [200, 429].contains(&resp.status),
        "count_tokens through the ingress: {resp}"
    );
    resp.rate_limit().tier
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_developer_signs_up_through_the_ingress_tops_up_through_stripe_and_the_operators_sweep_promotes_the_key(
) {
    let stripe = MockStripe::start().await;
    let setup = Setup {
        secrets: vec![(
            "gateway-stripe",
            vec![
                format!("api-key={API_KEY}"),
                format!("webhook-secret={WEBHOOK_SECRET}"),
            ],
        )],
        // The operator's sweep, which promotes the key, shows the client certificate too.
        postgres_cert_auth: true,
        ..Setup::default()
    }
    .value("gateway.stripeSecret", "gateway-stripe")
    .env("gateway", &[("GATEWAY_STRIPE_API_BASE", &stripe.url)])
    .env("operator", &[("OPERATOR_SWEEP_INTERVAL", SWEEP_INTERVAL)]);
    let (chart, endpoints) = Installed::serving(setup).await;
    // This journey reaches the pods through the chart's HTTPRoute instead (rendered with the
    // install's values: the test API server has no Gateway API), as a Gateway would serve it.
    let nginx = Nginx::start_routing(&http_route_routes(), &endpoints).await;
    let site = Ingress {
        url: nginx.url(""),
        node: &chart.node,
    };

    let mut visitor = Visitor::new(&site);
    visitor.sign_up(&new_email(), &[]).await;
    let (status, page) = visitor.create_key("node").await;
    assert_eq!(status, 200, "the keys page mints a key: {page}");
    let key = page
        .split("id=\"new-secret\"")
        .nth(1)
        .and_then(|rest| rest.split("value=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("the new key's secret on {page}"))
        .to_owned();
    assert_eq!(tier_through(&site.url, &key).await, "free");

    // $10, then $490 more: a lifetime $500.
    for (dollars, tier) in [("10", "pay_as_you_go"), ("490", "high_volume")] {
        let (status, body, location) = visitor.checkout(dollars).await;
        assert_eq!(status, 303, "the checkout redirects to Stripe: {body}");
        let session = stripe.session_at(location.as_deref().expect("a Location"));
        let paid = stripe.paid(&session);
        let (status, body) = deliver(&site.url, &paid, &paid.signature()).await;
        assert_eq!(status, 200, "Stripe's webhook through the ingress: {body}");
        let confirmed = Instant::now();
        // Within a sweep (and the gateways' reading of the key), with room for a loaded
        // machine.
        e2e::poll_until(
            &format!("the sweep to move the key to {tier}"),
            Duration::from_secs(30),
            Duration::from_millis(500),
            || async { (tier_through(&site.url, &key).await == tier).then_some(()) },
        )
        .await;
        eprintln!(
            "${dollars} confirmed: the key served as {tier} after {:?}",
            confirmed.elapsed()
        );
    }
}

/// The host of the chart's Ingress in the single sign-on journey, which its public URL names:
/// the host a browser is sent back to by the identity provider.
const INGRESS_HOST: &str = "gateway.example.com";

/// The value `name` is set to by the response's Set-Cookie lines, if any.
fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|line| line.split(';').next()?.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Where a redirect sends the browser.
fn location(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .unwrap_or_else(|| panic!("a Location in {response:?}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_signs_in_with_sso_through_the_ingress_host_and_the_session_opens_the_dashboard_there(
) {
    let issuer = MockIssuer::start().await;
    // The ingress's port, chosen before the install: the public URL, and so the redirect URI
    // the pods give the provider, names the ingress host at it.
    let port = e2e::server::free_port();
    let public = format!("http://{INGRESS_HOST}:{port}");
    let setup = Setup {
        secrets: vec![(
            "gateway-oidc",
            vec![format!("client-secret={CLIENT_SECRET}")],
        )],
        ..Setup::default()
    }
    .value("gateway.ingress.host", INGRESS_HOST)
    .value("gateway.publicUrl", &public)
    .value("gateway.oidc.issuer", &issuer.issuer())
    .value("gateway.oidc.clientId", CLIENT_ID)
    .value("gateway.oidc.clientSecret", "gateway-oidc");
    let (chart, endpoints) = Installed::serving(setup).await;
    let out = chart.api().kubectl(&[
        "get",
        "ingress",
        RELEASE,
        "-o",
        "jsonpath={.spec.rules[*].host}",
    ]);
    assert_ok("kubectl get ingress", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), INGRESS_HOST);
    let _ingress = Nginx::start_routing_on(port, &chart.ingress_routes(), &endpoints).await;
    // Every request below names the ingress host, resolved to the ingress as DNS would.
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .resolve(
            INGRESS_HOST,
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        )
        .build()
        .expect("a client");
    let site = Ingress {
        url: public.clone(),
        node: &chart.node,
    };

    // An owner claims the domain of their own email (a new user's is placed by it).
    let domain = format!("{}.example", e2e::gateway::unique_name("corp"));
    let mut owner = Visitor::with_client(&site, http.clone());
    owner.sign_up(&format!("owner@{domain}"), &[]).await;
    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = owner
        .post(
            "/developers/members/domains",
            &[("csrf", csrf.as_str()), ("domain", domain.as_str())],
            &[],
        )
        .await;
    assert_eq!(status, 200, "the owner claims {domain}: {page}");
    // The claim is pending until proven: a link mailed to the owner's address there, followed.
    let owner_email = format!("owner@{domain}");
    let (_, page) = owner.get("/developers/members").await;
    let csrf = hidden_csrf(&page);
    let (status, page, _) = owner
        .post(
            "/developers/members/domains/mail",
            &[
                ("csrf", csrf.as_str()),
                ("domain", domain.as_str()),
                ("email", owner_email.as_str()),
            ],
            &[],
        )
        .await;
    assert_eq!(status, 200, "a proof link mailed for {domain}: {page}");
    let proof_path = "/developers/domains/prove";
    let link = e2e::poll_until(
        "the proof mail in the pods' logs",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            mails_to(&site, &owner_email)
                .iter()
                .rev()
                .find_map(|line| link_to(line, proof_path))
        },
    )
    .await;
    let token = link.rsplit("token=").next().expect("a token").to_owned();
    let (status, page, _) = owner
        .post(proof_path, &[("token", token.as_str())], &[])
        .await;
    assert_eq!(status, 200, "the link proves {domain}: {page}");

    // A new member signs in with single sign-on, the browser sent to the provider and back.
    let email = format!("{}@{domain}", e2e::gateway::unique_name("sso"));
    issuer.next_token(&email, Tamper::None);
    let start = http
        .get(format!("{public}/developers/sso"))
        .send()
        .await
        .expect("the sign-in's start through the ingress");
    assert_eq!(
        start.status(),
        303,
        "{start:?}\n{}",
        chart.node.pod_logs(RELEASE)
    );
    let sso_cookie = set_cookie(&start, "svc_sso").expect("the sign-in's cookie");
    let authorize = location(&start);
    assert!(
        authorize.starts_with(&issuer.issuer()),
        "sent to {authorize}, not the provider"
    );
    let redirect_uri = reqwest::Url::parse(&authorize)
        .expect("the authorization URL")
        .query_pairs()
        .find(|(k, _)| k == "redirect_uri")
        .map(|(_, v)| v.into_owned());
    let callback_url = format!("{public}{SSO_CALLBACK}");
    assert_eq!(
        redirect_uri.as_deref(),
        Some(callback_url.as_str()),
        "the redirect URI the pods gave the provider"
    );
    let back = http
        .get(&authorize)
        .send()
        .await
        .expect("the provider's authorization");
    assert_eq!(back.status(), 303, "{back:?}");
    let callback = location(&back);
    assert!(callback.starts_with(&callback_url), "{callback}");
    // The callback through the ingress: the pod that takes it is not always the one that
    // started the sign-in (the state is in the database).
    let signed_in = http
        .get(&callback)
        .header("cookie", format!("svc_sso={sso_cookie}"))
        .send()
        .await
        .expect("the callback through the ingress");
    let status = signed_in.status().as_u16();
    let session = set_cookie(&signed_in, "svc_session").filter(|v| !v.is_empty());
    let to = signed_in
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .map(str::to_owned);
    let page = signed_in.text().await.unwrap_or_default();
    assert_eq!(
        (status, to.as_deref()),
        (303, Some("/developers")),
        "the callback signs in: {page}\n{}",
        chart.node.pod_logs(RELEASE)
    );
    let session = session.expect("a session cookie");

    // The session opens the dashboard through the ingress, as the new member.
    let overview = http
        .get(format!("{public}/developers"))
        .header("cookie", format!("svc_session={session}"))
        .send()
        .await
        .expect("the overview through the ingress");
    assert_eq!(overview.status(), 200, "{overview:?}");
    let overview = overview.text().await.expect("the overview");
    assert!(overview.contains(&email), "{overview}");
    let (_, members) = owner.get("/developers/members").await;
    let row = members
        .split(&format!("data-member=\"{email}\""))
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("{email} among the members: {members}"));
    assert!(row.contains(">developer<"), "{row}");
    let method = chart
        .pg
        .query(&format!(
            "SELECT after->>'method' FROM audit_log WHERE action = 'sign_in' AND target = '{email}'"
        ))
        .await;
    assert_eq!(method, "sso");
}

/// One turn is sent through the ingress this often while the pods roll.
const SEND_EVERY: Duration = Duration::from_millis(100);
/// Turns sent at most (two minutes' worth), however long the roll takes.
const MOST_TURNS: usize = 1_200;

/// What a client was told: the answer to a JSON turn or a refused stream, or a stream read to
/// its end (any transport error fails the journey as it is read).
enum Answer {
    Whole(Resp),
    Streamed(MessageStream),
}

/// One turn through the ingress, streamed or not; a connection error fails the journey.
async fn turn_through(http: &reqwest::Client, ingress: &str, key: &str, streamed: bool) -> Answer {
    let mut body = e2e::message("svc/haiku", "count to ten", 64);
    if streamed {
        body["stream"] = json!(true);
    }
    let response = http
        .post(format!("{ingress}/v1/messages"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("a client met a connection error: {e:?}"));
    if !streamed {
        return Answer::Whole(Resp::read(response).await);
    }
    let stream = SseStream::new(response);
    if stream.status != 200 {
        return Answer::Whole(stream.into_resp().await);
    }
    Answer::Streamed(assemble_message_stream(&stream.collect().await))
}

/// The chart's `gateway.metricsPort`.
const METRICS_PORT: u16 = 9090;

/// A scrape of the gateway pod at `ip` (its metrics port), `None` when it does not answer.
async fn pod_metrics(http: &reqwest::Client, ip: &str) -> Option<Scrape> {
    let response = http
        .get(format!("http://{ip}:{METRICS_PORT}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    Some(Scrape::parse(&response.text().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_with_a_changed_value_rolls_the_pods_while_turns_and_streams_run_and_refuses_none_cuts_none_and_bills_each_as_told(
) {
    let setup = Setup {
        reply: Some(lasting_reply()),
        ..Setup::default()
    };
    let (chart, before) = Installed::serving(setup).await;
    let key = chart.key_with_id().await;
    // Room for every turn of the roll (a key of the free tier would be refused most).
    chart.grant(&before, &key, (6_000, 10_000_000, 200)).await;
    let nginx = chart.ingress(&before).await;
    let ingress = nginx.url("");
    // ingress-nginx follows endpoints without a reload; what this test checks is the gateway
    // pods' roll.
    let http = fresh_connections();

    let rolling = AtomicBool::new(true);
    let served = AtomicUsize::new(0);
    // Clients: a turn every SEND_EVERY, JSON and streamed in turn, until the roll is done;
    // each runs on its own while the next are sent.
    let load = async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sender = async {
            let mut sent = 0;
            while rolling.load(Ordering::SeqCst) && sent < MOST_TURNS {
                let (http, ingress, key) = (http.clone(), ingress.clone(), key.secret.clone());
                let served = &served;
                tx.send(async move {
                    let answer = turn_through(&http, &ingress, &key, sent % 2 == 1).await;
                    if matches!(&answer, Answer::Streamed(_))
                        || matches!(&answer, Answer::Whole(r) if r.status == 200)
                    {
                        served.fetch_add(1, Ordering::SeqCst);
                    }
                    answer
                })
                .expect("the turns are collected");
                sent += 1;
                tokio::time::sleep(SEND_EVERY).await;
            }
            drop(tx);
        };
        let collector = async {
            let mut running = futures::stream::FuturesUnordered::new();
            let mut answers = Vec::new();
            loop {
                tokio::select! {
                    next = rx.recv() => match next {
                        Some(turn) => running.push(turn),
                        None => break,
                    },
                    Some(answer) = running.next() => answers.push(answer),
                }
            }
            while let Some(answer) = running.next().await {
                answers.push(answer);
            }
            answers
        };
        tokio::join!(sender, collector).1
    };
    // The pods replaced (deleted) during the roll: their turns in flight at that moment.
    let replaced: Mutex<BTreeMap<String, Option<u64>>> = Mutex::default();
    let roll = async {
        e2e::poll_until(
            "turns served through the ingress before the upgrade",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async { (served.load(Ordering::SeqCst) >= 10).then_some(()) },
        )
        .await;
        chart.upgrade(&["gateway.logFormat=text"]).await;
        chart.rolled_out(RELEASE).await;
        // The clients go on until the old pods are gone (drained), not only out of the
        // Service.
        e2e::poll_until(
            "the old pods to be gone",
            Duration::from_secs(120),
            Duration::from_millis(500),
            || async {
                let pods = chart.gateway_pods();
                let gone = pods.len() == 2
                    && pods
                        .iter()
                        .all(|p| p["metadata"]["deletionTimestamp"].is_null());
                gone.then_some(())
            },
        )
        .await;
        rolling.store(false, Ordering::SeqCst);
    };
    // The ingress controller: follows the Service's ready endpoints (asserted never to fall
    // below the two pods' worth while the Deployment rolls with maxSurge 1, maxUnavailable 0),
    // and notes the turns each pod being replaced has in flight.
    let follow = async {
        let mut followed = before.clone();
        loop {
            let ready = chart.follow_endpoints(&nginx, &mut followed).await;
            if ready.len() < 2 {
                return ready;
            }
            for pod in chart.gateway_pods() {
                let name = pod["metadata"]["name"].as_str().unwrap_or_default();
                let seen = replaced.lock().expect("replaced").contains_key(name);
                if pod["metadata"]["deletionTimestamp"].is_null() || seen {
                    continue;
                }
                let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
                let in_flight = pod_metrics(&http, ip)
                    .await
                    .and_then(|m| m.get("gateway_turns_in_flight", &[]))
                    .map(|n| n as u64);
                replaced
                    .lock()
                    .expect("replaced")
                    .insert(name.to_owned(), in_flight);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let started = Instant::now();
    let answers = tokio::select! {
        (answers, ()) = async { tokio::join!(load, roll) } => answers,
        ready = follow => panic!(
            "the Service fell to the ready endpoints {ready:?} during the roll\npods:\n{}\n\
             node:\n{}\npods' logs:\n{}",
            readiness(&chart.gateway_pods()),
            chart.node.logs(),
            chart.node.pod_logs(RELEASE)
        ),
    };
    let replaced = replaced.into_inner().expect("replaced");
    let (mut by_status, mut whole, mut streams) =
        (BTreeMap::<u16, usize>::new(), Vec::new(), Vec::new());
    for answer in &answers {
        match answer {
            Answer::Whole(resp) => {
                *by_status.entry(resp.status).or_default() += 1;
                whole.push(resp);
            }
            Answer::Streamed(stream) => {
                *by_status.entry(200).or_default() += 1;
                streams.push(stream);
            }
        }
    }
    eprintln!(
        "{} turns ({} streamed and read whole) in {:?}: by status {by_status:?}; turns in \
         flight on each replaced pod at its deletion: {replaced:?}",
        answers.len(),
        streams.len(),
        started.elapsed()
    );

    // The roll met turns in flight: both pods of the old template were replaced while
    // serving some.
    assert!(
        replaced.len() >= 2 && replaced.values().all(|n| n.is_some_and(|n| n > 0)),
        "the pods were replaced with no turns in flight (or unseen): {replaced:?}"
    );
    // No client saw anything but a 200: a roll refuses no turn (a refusal's envelope is
    // printed, to tell which pod and step refused it).
    let refused: Vec<String> = whole
        .iter()
        .filter(|r| r.status != 200)
        .map(|r| format!("{} {}", r.status, r.text))
        .collect();
    // The pods' lines about their stores, to tell a store slow to answer from one not reached.
    let store_lines = || {
        chart
            .node
            .pod_logs(RELEASE)
            .lines()
            .filter(|l| l.starts_with("---") || l.contains("redis") || l.contains("database"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        refused.is_empty(),
        "{} of {} turns were refused during the roll:\n{}\npods' store lines:\n{}",
        refused.len(),
        answers.len(),
        refused.join("\n"),
        store_lines()
    );
    // No stream was cut: each ended with its stop reason (the streams last about 1.5 s, far
    // shorter than the grace).
    for stream in &streams {
        assert!(
            stream.delta["stop_reason"].is_string(),
            "a stream ended without its stop reason: {:?}",
            stream.events
        );
    }
    let (accepted, consumed) = tally(whole.iter().copied(), &[]);
    let streamed = streams.len() as u64;
    let streamed_credits: u64 = streams.iter().map(|s| s.credits()).sum();
    // Every turn was served and is billed what its client was told.
    assert_books_balance(
        &chart.pg,
        &key.account_id,
        KEY_CREDITS,
        answers.len() as u64,
        (accepted + streamed, consumed + streamed_credits),
    )
    .await;

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
}

/// The next release's migration, as the rules for migrations allow one (docs/kubernetes.md,
/// "The schema": additions only): a table and a nullable column the current release knows
/// nothing of.
const NEXT_RELEASE_MIGRATION: &str =
    "-- The next release: a table and a column this one does not know.\n\
     CREATE TABLE next_release_regions (account_id text PRIMARY KEY, region text NOT NULL);\n\
     ALTER TABLE accounts ADD COLUMN next_release_region text;\n";

/// Applies the next release's migration as that release's `gateway migrate` would: sqlx's
/// migrator over the shipped migrations (`store/migrations`, byte for byte) and one more, the
/// version after the last shipped, recorded in `_sqlx_migrations` with its checksum. Its
/// version.
async fn migrate_to_the_next_release(pg: &PostgresServer) -> i64 {
    let shipped = e2e::gateway::workspace_root().join("store/migrations");
    let dir = std::env::temp_dir().join(e2e::gateway::unique_name("next-release-migrations"));
    std::fs::create_dir_all(&dir).expect("a folder for the migrations");
    let mut last = 0;
    for entry in std::fs::read_dir(&shipped)
        .expect("read store/migrations")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(version) = name.split('_').next().and_then(|v| v.parse::<i64>().ok()) {
            last = last.max(version);
        }
        std::fs::copy(entry.path(), dir.join(&name)).expect("copy a migration");
    }
    let next = last + 1;
    std::fs::write(
        dir.join(format!("{next:04}_next_release.sql")),
        NEXT_RELEASE_MIGRATION,
    )
    .expect("write the next release's migration");
    let migrator = sqlx::migrate::Migrator::new(dir.as_path())
        .await
        .expect("the migrations");
    let pool = sqlx::PgPool::connect(&pg.url()).await.expect("a pool");
    migrator
        .run(&pool)
        .await
        .expect("the next release's migration");
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    next
}

/// `count` JSON turns through the ingress, every one answered 200: their answers.
async fn served_through(
    http: &reqwest::Client,
    ingress: &str,
    key: &str,
    count: usize,
) -> Vec<Resp> {
    let mut answers = Vec::new();
    for _ in 0..count {
        let Answer::Whole(answer) = turn_through(http, ingress, key, false).await else {
            unreachable!("a JSON turn is answered whole");
        };
        assert_eq!(answer.status, 200, "a turn through the ingress: {answer}");
        answers.push(answer);
    }
    answers
}

/// `helm rollback` after an upgrade to a release that migrated the database further: the
/// previous release's pods, their migration init container included (`migrations.mode:
/// initContainer`, where an older `gateway migrate` meets the newer schema; in `hook` mode a
/// rollback runs no migration at all), start, become ready and serve turns, billed, on the
/// newer schema, which stays.
///
/// The next release is played by a revision of the same released image whose migration the
/// test applies just before `helm upgrade`, as that release's `migrate` step would: sqlx's
/// migrator over the shipped migrations and one more (`migrate_to_the_next_release`), leaving a
/// real `_sqlx_migrations` row. A second image with a binary built with that migration would
/// cost minutes of build per run and show nothing more of the rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_rollback_after_an_upgrade_that_migrated_further_starts_the_previous_releases_pods_on_the_newer_schema_and_they_serve_turns_billed(
) {
    let setup = Setup::default().value("migrations.mode", "initContainer");
    let (chart, endpoints) = Installed::serving(setup).await;
    let key = chart.key_with_id().await;
    // Room for the journey's turns (the free tier allows 5 a minute).
    chart.grant(&endpoints, &key, (600, 1_000_000, 50)).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("a client");
    let mut answers = Vec::new();
    let nginx = chart.ingress(&endpoints).await;
    answers.extend(served_through(&http, &nginx.url(""), &key.secret, 2).await);
    drop(nginx);
    let first_template = chart.gateway_pods()[0]["metadata"]["labels"]["pod-template-hash"].clone();

    // The upgrade: the next release's migration, then its rollout.
    let next = migrate_to_the_next_release(&chart.pg).await;
    let newer = format!("SELECT count(*) FROM _sqlx_migrations WHERE version = {next} AND success");
    assert_eq!(
        chart.pg.query_i64(&newer).await,
        1,
        "the next release's migration is recorded"
    );
    chart.upgrade(&["gateway.logFormat=text"]).await;
    chart.rolled_out(RELEASE).await;

    // The rollback to the first revision: its templates (and image) again.
    let started = Instant::now();
    let out = helm_waiting(chart.api(), &["rollback", RELEASE, "1"]).await;
    assert_ok("helm rollback", &out);
    chart.rolled_out(RELEASE).await;
    eprintln!("helm rollback rolled out after {:?}", started.elapsed());
    let after = chart.service_endpoints(2).await;
    let pods: Vec<Value> = chart
        .gateway_pods()
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    assert_eq!(
        pods.len(),
        2,
        "two gateway pods after the rollback: {pods:#?}"
    );
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(
            pod["metadata"]["labels"]["pod-template-hash"], first_template,
            "{name} is not of the first revision's template"
        );
        let args = pod["spec"]["containers"][0]["args"].to_string();
        assert!(
            !args.contains("--log-format=text"),
            "{name} runs the upgrade's template: {args}"
        );
        // Its migration init container (the previous release's `gateway migrate`) ran on the
        // newer schema and succeeded: the pod is past Init and ready.
        let init = &pod["spec"]["initContainers"][0];
        assert_eq!(init["name"], "migrate", "{name}: {init}");
        assert_eq!(init["image"], chart.release.image_by_digest().as_str());
        let logs = chart.node.pod_logs(name);
        let migrate_log = logs
            .split("--- ")
            .find(|section| section.starts_with(&format!("{name}/migrate.log")))
            .unwrap_or_default();
        assert!(
            migrate_log.contains(r#"{"migrated":true}"#),
            "{name}'s migrate init container did not report a migration:\n{logs}"
        );
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
        assert!(
            after.contains(&format!("{ip}:8080")),
            "{name} at {ip} is not among the ready endpoints {after:?}"
        );
    }

    // The rolled-back pods serve, through the ingress, and bill every turn.
    let nginx = chart.ingress(&after).await;
    let served_before = chart.mock.request_count();
    let rolled_back = served_through(&http, &nginx.url(""), &key.secret, 6).await;
    assert_eq!(
        chart.mock.request_count() - served_before,
        6,
        "the turns reached the upstream"
    );
    answers.extend(rolled_back);
    let (accepted, consumed) = tally(answers.iter(), &[]);
    assert_books_balance(
        &chart.pg,
        &key.account_id,
        KEY_CREDITS,
        answers.len() as u64,
        (accepted, consumed),
    )
    .await;
    // The schema stays the newer release's: its migration and its column.
    assert_eq!(
        chart.pg.query_i64(&newer).await,
        1,
        "the rollback undid the newer migration"
    );
    assert_eq!(
        chart
            .pg
            .query_i64("SELECT count(*) FROM information_schema.columns WHERE table_name = 'accounts' AND column_name = 'next_release_region'")
            .await,
        1
    );
}

/// Streams the operator scales for in the scaling journey: held open through the ingress.
const HELD_STREAMS: usize = 6;
/// Open streams per gateway pod the operator aims at in that journey (200 by default): the
/// held streams need three pods.
const STREAMS_PER_POD: &str = "2";

/// Clients of the scale-down: each sends its turns one after the other, streamed and not in
/// turn (three turns in flight at most: the operator's target is then the chart's two pods).
const SCALE_DOWN_CLIENTS: usize = 3;

/// The operator scales up for open streams, and the new pod serves; once the streams end it
/// scales back down to the chart's two pods (after `OPERATOR_SCALE_DOWN_WINDOW`) while clients
/// run turns and streams through the ingress: none is refused or cut (the removed pod leaves
/// the Service, finishes what it has and exits, as in a roll), and each is billed as told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_scales_the_deployment_up_from_the_gateways_open_streams_and_down_again_refusing_no_turn_cutting_no_stream(
) {
    // Streams of ~25 events 600 ms apart: open for about 15 s.
    let long = "a stream held open while the operator counts it and scales the gateway; ".repeat(2);
    let setup = Setup {
        reply: Some(Reply::text(&long).chunk_delay(Duration::from_millis(600))),
        ..Setup::default()
    }
    .value("gateway.maxReplicas", "4")
    .env(
        "operator",
        &[
            ("OPERATOR_STREAMS_PER_POD", STREAMS_PER_POD),
            ("OPERATOR_SCALE_EVERY", "1s"),
            ("OPERATOR_SCALE_DOWN_WINDOW", "5s"),
        ],
    );
    let (chart, before) = Installed::serving(setup).await;
    let key = chart.key_with_id().await;
    // Room for the held streams (the free tier allows fewer at once).
    chart.grant(&before, &key, (600, 1_000_000, 50)).await;
    let nginx = chart.ingress(&before).await;
    let mut followed = before.clone();
    let http = fresh_connections();

    let mut body = e2e::message("svc/haiku", "hold on", 256);
    body["stream"] = json!(true);
    let mut held = Vec::new();
    for _ in 0..HELD_STREAMS {
        let response = http
            .post(nginx.url("/v1/messages"))
            .bearer_auth(&key.secret)
            .json(&body)
            .send()
            .await
            .expect("a stream through the ingress");
        let mut stream = SseStream::new(response);
        stream.expect_sse();
        let first = stream.next_event().await.expect("message_start");
        held.push((first, stream));
    }
    let opened = Instant::now();

    // ceil(6 streams / 2 per pod) = 3 pods, one more than the chart's two.
    let after = loop {
        let ready = chart.follow_endpoints(&nginx, &mut followed).await;
        if ready.len() == 3 {
            break ready;
        }
        assert!(
            opened.elapsed() < Duration::from_secs(60),
            "the gateway has the ready pods {ready:?} 60 s after {HELD_STREAMS} streams opened \
             (replicas {})\noperator:\n{}",
            chart.trial.replicas(),
            chart.node.pod_logs("gateway-operator")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!(
        "3 ready gateway pods {:?} after the streams opened",
        opened.elapsed()
    );
    assert_eq!(chart.trial.replicas(), "3", "the Deployment's replicas");
    let new: Vec<&String> = after.iter().filter(|e| !before.contains(e)).collect();
    assert_eq!(new.len(), 1, "one new pod among {after:?}");
    let new_ip = new[0].split(':').next().unwrap_or_default();

    // The new pod serves, and the ingress sends it its share.
    let requests_on_new = || async {
        pod_metrics(&http, new_ip)
            .await
            .expect("the new pod's metrics")
            .samples
            .iter()
            .filter(|s| s.name == "gateway_requests_total")
            .map(|s| s.value)
            .sum::<f64>()
    };
    // Turn after turn until the new pod has served one: round robin over three pods gives it
    // one of the first three, and 30 without one fails.
    let served_before = requests_on_new().await;
    let mut served = 0.0;
    let mut whole = Vec::new();
    for _ in 0..30 {
        // A short answer (the held streams were answered already).
        chart.mock.push([Reply::text("served by whichever pod")]);
        let response = http
            .post(nginx.url("/v1/messages"))
            .bearer_auth(&key.secret)
            .json(&e2e::message("svc/haiku", "hi", 16))
            .send()
            .await
            .expect("a turn through the ingress");
        let answer = Resp::read(response).await;
        answer.expect_ok();
        whole.push(answer);
        served = requests_on_new().await - served_before;
        if served >= 1.0 {
            break;
        }
    }
    assert!(
        served >= 1.0,
        "the new pod at {new_ip} served none of 30 turns through the ingress"
    );

    // The held streams ran to their end through the scaling.
    let mut streams = Vec::new();
    for (first, stream) in held {
        let mut events = vec![first];
        events.extend(stream.collect().await);
        let stream = assemble_message_stream(&events);
        assert!(stream.credits() > 0);
        streams.push(stream);
    }

    // The scale-down, under turns: clients run turns one after the other (each lasting about
    // 15 s, far shorter than the grace) until the operator has brought the Deployment back to
    // two pods and the removed one is gone.
    let stop = AtomicBool::new(false);
    let ingress = nginx.url("");
    let load = clients_until(&http, &ingress, &key.secret, SCALE_DOWN_CLIENTS, &stop);
    let scale_down = async {
        let started = Instant::now();
        let removed =
            follow_pods_until(&chart, &nginx, &mut followed, 2, "the scale-down", |pods| {
                let current = pods
                    .iter()
                    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                    .count();
                chart.trial.replicas() == "2" && current == 2 && pods.len() == 2
            })
            .await;
        eprintln!("scaled down to two pods after {:?}", started.elapsed());
        stop.store(true, Ordering::SeqCst);
        removed
    };
    let (answers, removed) = tokio::join!(load, scale_down);
    eprintln!(
        "{} turns during the scale-down; turns in flight on the removed pod at its deletion: \
         {removed:?}",
        answers.len()
    );
    assert_eq!(removed.len(), 1, "one pod removed: {removed:?}");
    let (during, during_streams) = none_refused_or_cut(&answers, "the scale-down");
    assert!(
        answers.len() >= SCALE_DOWN_CLIENTS,
        "only {} turns ran through the scale-down",
        answers.len()
    );
    // Every turn of the key (the short ones, the held streams and the scale-down's) billed
    // as its client was told.
    let whole: Vec<&Resp> = whole.iter().chain(during).collect();
    let streams: Vec<&MessageStream> = streams.iter().chain(during_streams).collect();
    assert_billed_as_told(&chart, &key, &whole, &streams).await;
}

/// `clients` clients through the ingress until `stop`: each sends its turns one after the
/// other, streamed and not in turn. Their answers (a connection error fails the journey).
async fn clients_until(
    http: &reqwest::Client,
    ingress: &str,
    key: &str,
    clients: usize,
    stop: &AtomicBool,
) -> Vec<Answer> {
    let clients = (0..clients).map(|client| async move {
        let mut answers = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let streamed = (client + answers.len()) % 2 == 0;
            answers.push(turn_through(http, ingress, key, streamed).await);
        }
        answers
    });
    futures::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The ingress controller's work while gateway pods go (`what`): follows the Service's ready
/// endpoints, asserted never to fall below `floor`, and notes each gateway pod deleted with
/// the turns it had in flight then, until `done` says so of the gateway pods (within 240 s).
/// The pods deleted and their turns in flight.
async fn follow_pods_until(
    chart: &Installed,
    nginx: &Nginx,
    followed: &mut Vec<String>,
    floor: usize,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> BTreeMap<String, Option<u64>> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    let started = Instant::now();
    let mut deleted = BTreeMap::new();
    loop {
        let ready = chart.follow_endpoints(nginx, followed).await;
        assert!(
            ready.len() >= floor,
            "the Service fell to the ready endpoints {ready:?} during {what}"
        );
        let pods = chart.gateway_pods();
        for pod in &pods {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            if pod["metadata"]["deletionTimestamp"].is_null() || deleted.contains_key(name) {
                continue;
            }
            let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
            let in_flight = pod_metrics(&http, ip)
                .await
                .and_then(|m| m.get("gateway_turns_in_flight", &[]))
                .map(|n| n as u64);
            deleted.insert(name.to_owned(), in_flight);
        }
        if done(&pods) {
            return deleted;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "{what} did not end within 240 s (replicas {}, pods {pods:#?})\nnode:\n{}\noperator:\n{}",
            chart.trial.replicas(),
            chart.node.logs(),
            chart.node.pod_logs("gateway-operator")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts that no client saw anything but a 200 and that every stream ended with its stop
/// reason during `what`: the JSON answers and the streams.
fn none_refused_or_cut<'a>(
    answers: &'a [Answer],
    what: &str,
) -> (Vec<&'a Resp>, Vec<&'a MessageStream>) {
    let (mut whole, mut streams) = (Vec::new(), Vec::new());
    for answer in answers {
        match answer {
            Answer::Whole(resp) => {
                assert_eq!(resp.status, 200, "a turn refused during {what}: {resp}");
                whole.push(resp);
            }
            Answer::Streamed(stream) => {
                assert!(
                    stream.delta["stop_reason"].is_string(),
                    "a stream cut during {what}: {:?}",
                    stream.events
                );
                streams.push(stream);
            }
        }
    }
    (whole, streams)
}

/// Every turn of `key` served (`whole` JSON answers, all 200, and `streams`) and billed as its
/// client was told (`e2e::books`).
async fn assert_billed_as_told(
    chart: &Installed,
    key: &CliKey,
    whole: &[&Resp],
    streams: &[&MessageStream],
) {
    let (accepted, consumed) = tally(whole.iter().copied(), &[]);
    let streamed_credits: u64 = streams.iter().map(|s| s.credits()).sum();
    assert_books_balance(
        &chart.pg,
        &key.account_id,
        KEY_CREDITS,
        (whole.len() + streams.len()) as u64,
        (accepted + streams.len() as u64, consumed + streamed_credits),
    )
    .await;
}

/// Clients of the drain journey.
const DRAIN_CLIENTS: usize = 3;

/// `kubectl drain` of the node the chart's pods run on, with another node to take them and the
/// chart's PodDisruptionBudget (`gateway.pdb`, maxUnavailable 1: applied as `policy/v1beta1`,
/// the version this 1.20 API server has, with the chart's spec): the gateway pods are evicted
/// one at a time, each replaced on the other node, while clients run turns and streams
/// through the ingress; none is refused or cut, every one billed as told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drain_of_the_node_moves_the_gateway_pods_to_another_refusing_no_turn_cutting_no_stream(
) {
    let setup = Setup {
        reply: Some(lasting_reply()),
        ..Setup::default()
    };
    let (chart, before) = Installed::serving(setup).await;
    let other = TestNode::join(chart.api()).await;
    other.pull_over_plain_http(&chart.release.registry.host());
    let mut pdb_args = vec![
        RELEASE,
        "charts/gateway",
        "--show-only",
        "templates/gateway-pdb.yaml",
    ];
    for value in VALUES {
        pdb_args.extend(["--set", value]);
    }
    pdb_args.extend(["--set", "gateway.pdb.enabled=true"]);
    let pdb = e2e::helm::template(&pdb_args)
        .replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n");
    assert!(pdb.contains("maxUnavailable: 1"), "{pdb}");
    assert_ok(
        "kubectl apply of the chart's PodDisruptionBudget",
        &chart.api().apply(&pdb),
    );

    let key = chart.key_with_id().await;
    // Room for every turn of the drain (a key of the free tier would be refused most).
    chart.grant(&before, &key, (6_000, 10_000_000, 200)).await;
    let nginx = chart.ingress(&before).await;
    let mut followed = before.clone();
    let http = fresh_connections();
    let stop = AtomicBool::new(false);
    let ingress = nginx.url("");
    let load = clients_until(&http, &ingress, &key.secret, DRAIN_CLIENTS, &stop);
    let drained = AtomicBool::new(false);
    let drain = async {
        // Turns served before the drain starts.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        let out = chart
            .api()
            .kubectl_waiting(&[
                "drain",
                &chart.node.name,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=240s",
            ])
            .await;
        assert_ok("kubectl drain", &out);
        eprintln!("kubectl drain done after {:?}", started.elapsed());
        drained.store(true, Ordering::SeqCst);
    };
    let moved = async {
        let evicted = follow_pods_until(&chart, &nginx, &mut followed, 1, "the drain", |pods| {
            drained.load(Ordering::SeqCst)
                && pods.len() == 2
                && pods.iter().all(|p| {
                    p["spec"]["nodeName"] == other.name.as_str()
                        && p["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        })
        .await;
        // The ingress on the new pods' endpoints before the clients stop.
        chart.follow_endpoints(&nginx, &mut followed).await;
        stop.store(true, Ordering::SeqCst);
        evicted
    };
    let (answers, (), evicted) = tokio::join!(load, drain, moved);
    eprintln!(
        "{} turns during the drain; turns in flight on each evicted pod at its deletion: \
         {evicted:?}",
        answers.len()
    );
    assert_eq!(evicted.len(), 2, "both gateway pods evicted: {evicted:?}");
    let (whole, streams) = none_refused_or_cut(&answers, "the drain");
    assert!(
        answers.len() >= DRAIN_CLIENTS,
        "only {} turns ran through the drain",
        answers.len()
    );
    assert_billed_as_told(&chart, &key, &whole, &streams).await;
    assert!(
        followed.iter().all(|e| !before.contains(e)),
        "the ingress still routes to the drained pods {before:?}: {followed:?}"
    );
}

/// The first line of the README's install block (a fenced `sh` block): the journey below runs
/// every command of that block, in order.
const README_INSTALL: &str =
    "# The install, as tests/tests/chart_node.rs runs it: every command of this block, in order.";

/// The commands of the README's install block, each with its continuation lines joined;
/// comment lines left out.
fn readme_install_commands() -> Vec<String> {
    let path = e2e::gateway::workspace_root().join("README.md");
    let readme = std::fs::read_to_string(&path).expect("read the README");
    let opening = format!("```sh\n{README_INSTALL}\n");
    let start = readme
        .find(&opening)
        .unwrap_or_else(|| panic!("the README has no block opening with {README_INSTALL:?}"));
    let block = &readme[start + opening.len()..];
    let block = &block[..block.find("\n```").expect("the end of the install block")];
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        if current.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line.trim_end());
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    assert!(
        current.is_empty(),
        "the block ends inside a command: {current}"
    );
    commands
}

/// The README's install, its commands read from the README itself and run in order by `sh`
/// (as admin of the test API server), with these substitutions, each of which must apply
/// (a README that drifts from them fails here):
/// - the stores' and the collector's host names: the test's Redis and Postgres, a closed port;
/// - `$REGISTRY/svc-gateway`: the image's repository (`GATEWAY_IMAGE`), and its tag given to
///   `helm install` when it is not the chart's appVersion;
/// - `helm install gateway charts/gateway`: the venv's helm, the chart copy whose kubeVersion
///   admits the 1.20 API server, without client-side OpenAPI validation (the CRDs' CEL rules),
///   and `gateway.pdb.enabled=false` (that server has no policy/v1 PodDisruptionBudget);
/// - `deploy/examples/models.yaml`: a copy whose upstream base URLs name the mock upstream;
/// - `rollout status`: a `--timeout`, so that a rollout that never completes fails the test.
///
/// `$ANTHROPIC_API_KEY` and `$MOONSHOT_API_KEY` are in the environment, as the README expects.
/// The stores are plaintext here, as the README's install names them (`redis://`,
/// `postgres://`, no CA Secret): the other journeys run the chart on TLS-only stores.
/// Then a turn through a ready endpoint of the Service reaches the upstream of the catalog's
/// route, and the client sees only the virtual model's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_helm_install_run_as_written_ends_with_a_ready_rollout_and_a_served_turn() {
    let Some(trial) = Trial::start(RELEASE).await else {
        panic!("helm or the Kubernetes API server is missing: see scripts/test");
    };
    let _node = TestNode::start(&trial.api).await;
    let mock = MockUpstream::start().await;
    let (redis, pg) = (RedisServer::start().await, PostgresServer::start().await);
    let examples = e2e::gateway::workspace_root().join("deploy/examples/models.yaml");
    let models = std::fs::read_to_string(&examples)
        .expect("read the example routes")
        .replace("https://api.anthropic.com", &mock.url)
        .replace("https://api.moonshot.ai/v1", &format!("{}/v1", mock.url));
    let routes = std::env::temp_dir().join(e2e::gateway::unique_name("readme-models.yaml"));
    std::fs::write(&routes, models).expect("write the rerouted example routes");

    let image = e2e::podman::image();
    let (repository, tag) = image
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/'))
        .unwrap_or((image.as_str(), ""));
    let mut helm = format!(
        "{} install gateway {} --disable-openapi-validation --set gateway.pdb.enabled=false",
        e2e::helm::helm_bin().display(),
        trial.chart
    );
    if !tag.is_empty() && tag != e2e::podman::app_version() {
        helm.push_str(&format!(
            " --set gateway.image.tag={tag} --set operator.image.tag={tag}"
        ));
    }
    let closed = format!("http://127.0.0.1:{}", e2e::server::free_port());
    let substitutions: Vec<(&str, String)> = vec![
        ("redis://redis.stores:6379", redis.url()),
        (
            "postgres://gateway:PASSWORD@postgres.stores:5432/gateway",
            pg.url(),
        ),
        ("http://otel-collector.observability:4318", closed),
        ("$REGISTRY/svc-gateway", repository.to_owned()),
        ("helm install gateway charts/gateway", helm),
        (
            "deploy/examples/models.yaml",
            routes.to_str().expect("a UTF-8 path").to_owned(),
        ),
        (
            "rollout status deploy/gateway",
            "rollout status deploy/gateway --timeout=300s".to_owned(),
        ),
    ];
    let mut unused: Vec<&str> = substitutions.iter().map(|(from, _)| *from).collect();
    let commands = readme_install_commands();
    assert!(
        commands.iter().any(|c| c.contains("rollout status")),
        "the README's install ends with no rollout: {commands:#?}"
    );
    for command in &commands {
        let mut run = command.clone();
        for (from, to) in &substitutions {
            if run.contains(from) {
                run = run.replace(from, to);
                unused.retain(|u| u != from);
            }
        }
        eprintln!("README: {command}");
        let started = Instant::now();
        let out = tokio::process::Command::new("sh")
            .args(["-c", &run])
            .current_dir(e2e::gateway::workspace_root())
            .env(
                "KUBECONFIG",
                trial.api.kubeconfig(e2e::kube::Identity::Admin),
            )
            .env("ANTHROPIC_API_KEY", UPSTREAM_API_KEY)
            .env("MOONSHOT_API_KEY", UPSTREAM_API_KEY)
            // Substituted away: a command still naming it fails on this registry.
            .env("REGISTRY", "registry.invalid")
            .output()
            .await
            .expect("run sh");
        assert!(
            out.status.success(),
            "the README's `{command}` failed (run as `{run}`):\n{}\n{}\nnode:\n{}\npods:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            _node.logs(),
            _node.pod_logs("gateway")
        );
        eprintln!("  done in {:?}", started.elapsed());
    }
    let _ = std::fs::remove_file(&routes);
    assert!(
        unused.is_empty(),
        "the README's install no longer has {unused:?}: update this test with it"
    );

    // A ready endpoint of the Service, in the README's namespace.
    let endpoint = e2e::poll_until(
        "a ready endpoint of the Service",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let out = trial
                .api
                .kubectl_waiting(&["-n", "llm", "get", "endpoints", RELEASE, "-o", "json"])
                .await;
            let endpoints: Value = serde_json::from_slice(&out.stdout).ok()?;
            let subset = &endpoints["subsets"][0];
            let port = subset["ports"][0]["port"].as_u64()?;
            let ip = subset["addresses"][0]["ip"].as_str()?;
            Some(format!("{ip}:{port}"))
        },
    )
    .await;
    let created = pg
        .gateway_cli(&[
            "keys",
            "create",
            "--new-account",
            "readme",
            "--credits",
            &KEY_CREDITS.to_string(),
        ])
        .await
        .expect("keys create");
    let key = created["key"].as_str().expect("the key's secret");
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    let response = http
        .post(format!("http://{endpoint}/v1/messages"))
        .bearer_auth(key)
        .json(&e2e::message("svc/haiku", "hello", 32))
        .send()
        .await
        .expect("a turn through the Service's endpoint");
    let answer = Resp::read(response).await;
    assert_eq!(
        answer.status,
        200,
        "{}\npods:\n{}",
        answer.text,
        _node.pod_logs("gateway")
    );
    assert_eq!(answer.json()["model"], "svc/haiku", "{}", answer.text);
    assert_eq!(
        mock.request_count(),
        1,
        "the turn reached the upstream once"
    );
    let upstream = &mock.received()[0];
    // The catalog's route: its upstream model and the key of the README's Secret.
    assert_eq!(upstream.body["model"], "claude-3-5-haiku-latest");
    assert_eq!(
        upstream
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok()),
        Some(UPSTREAM_API_KEY)
    );
}
