//! Every container the chart renders starts and does its job. `helm template` renders the chart
//! with the README's `helm install` values, and with the in-cluster trial values; each
//! container of each Job and Deployment that runs our image starts as the binary the image runs
//! for it (the entrypoint, the gateway, or its `command`), with exactly the rendered arguments
//! and environment: Secret references resolved from the rendered Secrets or the ones the README
//! tells a platform team to create (here pointing at the test's Redis and Postgres), the
//! downward API filled in. Hook Jobs and init containers run first and must exit 0; each other
//! container must pass its own rendered readiness probe. Then: the database is migrated, the
//! operator's metrics show a promotion sweep, and the gateway serves a turn on its public port.
//!
//! A flag a binary does not know (it exits), a Secret key nothing provides, or an environment
//! variable the binary does not read (`BINARY SUBCOMMAND --help` lists the `[env: ...]` of every
//! flag; the gateway also reads the standard `OTEL_*` variables) fails the test.
//!
//! What a pod has to itself is adapted to processes sharing one machine: the ports are set to
//! free ones (`--set`), the service account token is a kubeconfig for the test API server (the
//! release is `gateway` in namespace `gateway`, whose service accounts its tokens name), and
//! the in-cluster stores' Services resolve to the test's Redis and Postgres.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use e2e::gateway::{gateway_bin, unique_name};
use e2e::helm;
use e2e::kube::{operator_bin, Identity, KubeApi, NAMESPACE};
use e2e::podman::{app_version, default_image};
use e2e::server::free_port_for_later;
use e2e::{
    message, MockUpstream, PostgresServer, RedisServer, Resp, RoutedManifests, Scrape, UpstreamDef,
};
use serde::Deserialize as _;
use serde_json::Value;

/// Its full name is `gateway`, so its service accounts are `gateway` and `gateway-operator`.
const RELEASE: &str = "gateway";

/// `$REGISTRY` in the README's commands.
const REGISTRY: &str = "registry.example.com/platform";

const READY_WITHIN: Duration = Duration::from_secs(90);

/// The values of the README's "Kubernetes: install with Helm".
fn readme_values() -> Vec<String> {
    [
        "--set",
        &format!("gateway.image.repository={REGISTRY}/svc-gateway"),
        "--set",
        &format!("operator.image.repository={REGISTRY}/svc-gateway"),
        "--set",
        "operator.secrets={upstream-api-keys}",
        "--set-json",
        r#"gateway.env=[{"name":"OTEL_EXPORTER_OTLP_ENDPOINT","value":"http://otel-collector.observability:4318"}]"#,
    ]
    .map(str::to_owned)
    .to_vec()
}

#[tokio::test]
async fn every_container_of_the_readmes_install_starts_and_does_its_job() {
    let Some(mut chart) = Chart::start(&readme_values()).await else {
        return;
    };
    // The Secrets the README has the platform team create.
    let (redis, pg) = (chart.redis.url(), chart.pg.url());
    chart.secrets.add("gateway-redis", "url", &redis);
    chart.secrets.add("gateway-postgres", "url", &pg);
    chart
        .run_every_container(&format!("{REGISTRY}/svc-gateway:{}", app_version()))
        .await;
}

#[tokio::test]
async fn every_container_of_the_in_cluster_values_starts_and_does_its_job() {
    let values = ["-f", helm::IN_CLUSTER].map(str::to_owned);
    let Some(mut chart) = Chart::start(&values).await else {
        return;
    };
    // Without values naming one, the chart's image is what scripts/image tags.
    chart.run_every_container(&default_image()).await;
}

/// The rendered chart, the stores and API server its containers run against, and the processes.
struct Chart {
    objects: Vec<Value>,
    secrets: Secrets,
    redis: RedisServer,
    pg: PostgresServer,
    api: KubeApi,
    mock: MockUpstream,
    _manifests: RoutedManifests,
    dir: PathBuf,
    running: Vec<Running>,
}

impl Chart {
    /// Renders the chart with `values` (and free ports), starts Redis, Postgres and the API
    /// server with the CRDs, the rendered RBAC and custom resources routing every model to a
    /// mock upstream. `None` (a failure under CI) when helm or the API server is missing.
    async fn start(values: &[String]) -> Option<Chart> {
        if !helm::helm_available() {
            return None;
        }
        let ports = [
            "gateway.port",
            "gateway.adminPort",
            "gateway.metricsPort",
            "operator.metricsPort",
        ]
        .map(|value| format!("{value}={}", free_port_for_later()));
        let mut args = vec![RELEASE, "charts/gateway", "--namespace", NAMESPACE];
        for port in &ports {
            args.extend(["--set", port]);
        }
        args.extend(values.iter().map(String::as_str));
        // The operator reads only the Secrets it is given: those its manifests (below) name.
        args.extend([
            "--set",
            "operator.secrets={mock-upstream-key,example-enterprise-key}",
        ]);
        let yaml = helm::template(&args);
        let objects: Vec<Value> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|doc| Value::deserialize(doc).expect("a rendered object"))
            .filter(|object| !object.is_null())
            .collect();

        let api = KubeApi::start().await?;
        api.apply_crds();
        api.wait_for_crds().await;
        // The rendered RBAC, and the config Secret the operator publishes in (it creates none).
        let rbac: Vec<&Value> = objects
            .iter()
            .filter(|o| {
                matches!(
                    o["kind"].as_str(),
                    Some(
                        "ServiceAccount"
                            | "Role"
                            | "RoleBinding"
                            | "ClusterRole"
                            | "ClusterRoleBinding"
                    )
                ) || (o["kind"] == "Secret" && o["metadata"]["name"] == "gateway-config")
            })
            .collect();
        let out = api.apply(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": rbac}).to_string(),
        );
        helm::assert_ok("kubectl apply of the rendered RBAC", &out);
        let mock = MockUpstream::start().await;
        let manifests = RoutedManifests::new(&[UpstreamDef::anthropic(&mock)]);
        api.apply_path(manifests.path.to_str().expect("a UTF-8 path"));

        let secrets = Secrets::rendered(&objects);
        let dir = std::env::temp_dir().join(unique_name("e2e-chart-containers"));
        std::fs::create_dir_all(&dir).expect("create the logs folder");
        Some(Chart {
            objects,
            secrets,
            redis: RedisServer::start().await,
            pg: PostgresServer::start().await,
            api,
            mock,
            _manifests: manifests,
            dir,
            running: Vec::new(),
        })
    }

    /// Runs the hook Jobs, then starts every Deployment running `image` (each pod's init
    /// containers first), checks each container is ready and does its job.
    async fn run_every_container(&mut self, image: &str) {
        self.map_in_cluster_stores(image);
        let objects = self.objects.clone();
        let jobs = objects.iter().filter(|o| o["kind"] == "Job");
        for job in jobs {
            let pod = &job["spec"]["template"]["spec"];
            for container in array(&pod["containers"]) {
                self.run_to_completion(image, &name(job), container).await;
            }
        }
        let deployments: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "Deployment")
            .filter(|d| runs_image(d, image))
            .collect();
        assert_eq!(deployments.len(), 2, "the gateway and the operator");
        // As on a cluster, every pod starts at once (each after its init containers), and
        // none waits for another to be ready: the gateway needs the operator's config, the
        // operator's sweep the database a gateway pod's init container migrates.
        let mut started = Vec::new();
        for deployment in deployments {
            let pod_name = format!("{}-0", name(deployment));
            let pod = &deployment["spec"]["template"]["spec"];
            for container in array(&pod["initContainers"]) {
                self.run_to_completion(image, &pod_name, container).await;
            }
            for container in array(&pod["containers"]) {
                started.push((self.start_container(image, &pod_name, container), container));
            }
        }
        for (mut running, container) in started {
            running.wait_ready(container).await;
            self.running.push(running);
        }

        assert!(
            self.pg
                .query_i64("SELECT count(*) FROM _sqlx_migrations WHERE success")
                .await
                > 0,
            "no container migrated the database"
        );
        self.check_the_operator_swept().await;
        self.check_the_gateway_serves_a_turn().await;
    }

    /// In-cluster stores are Deployments of other images behind Services of the chart: their
    /// URLs in the rendered Secrets become the test's Redis and Postgres.
    fn map_in_cluster_stores(&mut self, image: &str) {
        for deployment in self.objects.iter().filter(|o| o["kind"] == "Deployment") {
            if runs_image(deployment, image) {
                continue;
            }
            let store = name(deployment);
            let local = match array(&deployment["spec"]["template"]["spec"]["containers"])
                .first()
                .and_then(|c| c["image"].as_str())
            {
                Some(i) if i.starts_with("redis:") => self.redis.url(),
                Some(i) if i.starts_with("postgres:") => self.pg.url(),
                other => panic!("Deployment {store} runs {other:?}, neither ours nor a store"),
            };
            self.secrets.resolve_host(&store, &local);
        }
    }

    /// The program, arguments and environment the container's image runs, as a process.
    fn command(
        &self,
        image: &str,
        pod: &str,
        container: &Value,
    ) -> (String, tokio::process::Command) {
        let name = format!("{pod}/{}", container["name"].as_str().unwrap_or_default());
        assert_eq!(container["image"], image, "{name} runs another image");
        let (binary, kind) = match container["command"].as_array().map(Vec::as_slice) {
            None => (gateway_bin(), Binary::Gateway),
            Some([entry]) if entry == "/usr/local/bin/gateway" => (gateway_bin(), Binary::Gateway),
            Some([entry]) if entry == "/usr/local/bin/operator" => {
                (operator_bin(), Binary::Operator)
            }
            Some(other) => panic!("{name}: the image has no binary {other:?}"),
        };
        let args: Vec<&str> = array(&container["args"])
            .iter()
            .map(|a| a.as_str().expect("a string argument"))
            .collect();
        let subcommand = args.first().copied().unwrap_or("serve");
        let read = env_read_by(&binary, subcommand);
        let mut cmd = tokio::process::Command::new(&binary);
        cmd.args(&args).env_clear().env("PATH", "/usr/bin:/bin");
        for var in array(&container["env"]) {
            let key = var["name"].as_str().expect("an env name");
            assert!(
                read.iter().any(|r| r == key)
                    || (kind == Binary::Gateway && key.starts_with("OTEL_")),
                "{name} sets {key}, which `{} {subcommand}` does not read (it reads {read:?})",
                binary.display()
            );
            let value = self.env_value(&name, pod, var);
            cmd.env(key, value);
        }
        let identity = match (kind, subcommand) {
            (Binary::Operator, _) => Some(Identity::Operator),
            (Binary::Gateway, "serve") => Some(Identity::Gateway),
            _ => None,
        };
        if let Some(identity) = identity {
            // The service account's token, as a pod has it mounted.
            cmd.env("KUBECONFIG", self.api.kubeconfig(identity));
        }
        (name, cmd)
    }

    fn env_value(&self, container: &str, pod: &str, var: &Value) -> String {
        if let Some(value) = var["value"].as_str() {
            return value.to_owned();
        }
        let from = &var["valueFrom"];
        if let Some(secret) = from.get("secretKeyRef") {
            let (name, key) = (str_at(secret, "name"), str_at(secret, "key"));
            return self.secrets.get(name, key).unwrap_or_else(|| {
                panic!("{container}: no key {key} in a Secret {name} (neither rendered nor created as the README says)")
            });
        }
        match from["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.namespace") => NAMESPACE.to_owned(),
            Some("metadata.name") => pod.to_owned(),
            _ => panic!("{container}: an env source the test cannot fill: {var}"),
        }
    }

    async fn run_to_completion(&self, image: &str, pod: &str, container: &Value) {
        let (name, mut cmd) = self.command(image, pod, container);
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        let out = tokio::time::timeout(READY_WITHIN, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("{name} still runs after {READY_WITHIN:?}"))
            .expect("run the container's binary");
        assert!(
            out.status.success(),
            "{name} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start_container(&self, image: &str, pod: &str, container: &Value) -> Running {
        let (name, mut cmd) = self.command(image, pod, container);
        let log = self.dir.join(format!("{}.log", name.replace('/', "_")));
        let file = std::fs::File::create(&log).expect("create a log file");
        e2e::tie_to_test(&mut cmd);
        cmd.stdout(file.try_clone().expect("clone the log file"))
            .stderr(file);
        let child = cmd.spawn().expect("start the container's binary");
        Running {
            name,
            child,
            log,
            ports: ports(container),
        }
    }

    fn running(&mut self, prefix: &str) -> &mut Running {
        self.running
            .iter_mut()
            .find(|r| r.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no container of {prefix}"))
    }

    async fn check_the_operator_swept(&mut self) {
        let operator = self.running(&format!("{RELEASE}-operator-0/operator"));
        let url = format!("http://127.0.0.1:{}/metrics", operator.port("metrics"));
        let client = client();
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            operator.check_running();
            let text = match client.get(&url).send().await {
                Ok(response) => response.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            let scrape = Scrape::parse(&text);
            if scrape.get("gateway_operator_sweeps_total", &[]) >= Some(1.0) {
                assert_eq!(
                    scrape.get("gateway_operator_sweep_failing", &[]),
                    Some(0.0),
                    "{text}"
                );
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the operator's metrics show no promotion sweep after {READY_WITHIN:?}:\n{text}\n{}",
                operator.logs()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn check_the_gateway_serves_a_turn(&mut self) {
        let created = self
            .pg
            .gateway_cli(&[
                "keys",
                "create",
                "--new-account",
                "chart",
                "--credits",
                "100000000",
            ])
            .await
            .expect("keys create");
        let key = created["key"]
            .as_str()
            .expect("the key's secret")
            .to_owned();
        let gateway = self.running(&format!("{RELEASE}-0/gateway"));
        let url = format!("http://127.0.0.1:{}/v1/messages", gateway.port("http"));
        let response = client()
            .post(url)
            .bearer_auth(key)
            .json(&message("svc/haiku", "hi", 16))
            .send()
            .await
            .expect("POST /v1/messages");
        let reply = Resp::read(response).await;
        assert_eq!(
            reply.expect_ok()["content"][0]["text"],
            "Hello from upstream.",
            "{}",
            gateway.logs()
        );
        assert_eq!(
            self.mock.request_count(),
            1,
            "the turn reached the upstream"
        );
    }
}

impl Drop for Chart {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Binary {
    Gateway,
    Operator,
}

/// A started container: its process, its log file and its named ports.
struct Running {
    name: String,
    child: tokio::process::Child,
    log: PathBuf,
    ports: BTreeMap<String, u16>,
}

impl Running {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn port(&self, name: &str) -> u16 {
        *self
            .ports
            .get(name)
            .unwrap_or_else(|| panic!("{} has no port {name}", self.name))
    }

    /// Panics with the logs when the process has exited: a container that stops is a failure.
    fn check_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, self.logs());
        }
    }

    /// Polls the container's rendered readiness probe until it answers 200.
    async fn wait_ready(&mut self, container: &Value) {
        let probe = &container["readinessProbe"]["httpGet"];
        let port = match &probe["port"] {
            Value::String(name) => self.port(name),
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .expect("a port"),
            other => panic!("{}: a readiness probe on {other}", self.name),
        };
        let url = format!("http://127.0.0.1:{port}{}", str_at(probe, "path"));
        let client = client();
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            self.check_running();
            if let Ok(response) = client.get(&url).send().await {
                if response.status() == 200 {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} is not ready on {url} after {READY_WITHIN:?}:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Secret values by Secret name and key: the rendered ones and those the test creates.
struct Secrets(BTreeMap<(String, String), String>);

impl Secrets {
    fn rendered(objects: &[Value]) -> Secrets {
        let mut secrets = Secrets(BTreeMap::new());
        for secret in objects.iter().filter(|o| o["kind"] == "Secret") {
            let name = name(secret);
            for (key, value) in secret["stringData"].as_object().into_iter().flatten() {
                secrets.add(&name, key, value.as_str().expect("a string"));
            }
            for (key, value) in secret["data"].as_object().into_iter().flatten() {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(value.as_str().expect("base64 text"))
                    .expect("base64 data");
                secrets.add(&name, key, &String::from_utf8(bytes).expect("UTF-8 data"));
            }
        }
        secrets
    }

    fn add(&mut self, name: &str, key: &str, value: &str) {
        self.0
            .insert((name.to_owned(), key.to_owned()), value.to_owned());
    }

    fn get(&self, name: &str, key: &str) -> Option<String> {
        self.0.get(&(name.to_owned(), key.to_owned())).cloned()
    }

    /// Every URL naming the Service `host` becomes `local`.
    fn resolve_host(&mut self, host: &str, local: &str) {
        let service = format!("@{host}:");
        let bare = format!("://{host}:");
        for value in self.0.values_mut() {
            if value.contains(&service) || value.contains(&bare) {
                *value = local.to_owned();
            }
        }
    }
}

/// The names `BINARY SUBCOMMAND --help` lists as `[env: NAME...]`: every variable its flags
/// read.
fn env_read_by(binary: &Path, subcommand: &str) -> Vec<String> {
    let out = std::process::Command::new(binary)
        .args([subcommand, "--help"])
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
    assert!(
        out.status.success(),
        "{} {subcommand} --help: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let help = String::from_utf8_lossy(&out.stdout);
    help.split("[env: ")
        .skip(1)
        .map(|rest| rest.split(['=', ']']).next().unwrap_or_default().to_owned())
        .collect()
}

fn runs_image(deployment: &Value, image: &str) -> bool {
    array(&deployment["spec"]["template"]["spec"]["containers"])
        .iter()
        .any(|c| c["image"] == image)
}

fn ports(container: &Value) -> BTreeMap<String, u16> {
    array(&container["ports"])
        .iter()
        .map(|p| {
            let port = p["containerPort"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .expect("a containerPort");
            (str_at(p, "name").to_owned(), port)
        })
        .collect()
}

fn name(object: &Value) -> String {
    str_at(&object["metadata"], "name").to_owned()
}

fn str_at<'a>(object: &'a Value, field: &str) -> &'a str {
    object[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {object}"))
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}
