//! A test cluster in which the chart's Deployments and Jobs become running containers of the
//! image: `kube-controller-manager` and `kube-scheduler` (built by `scripts/kube-node` from the
//! same Debian 1.20 source as the API server) turn Deployments into ReplicaSets into Pods and
//! Jobs into Pods, keep the Service's Endpoints and bind every Pod to one Node; this harness
//! registers that Node and plays its kubelet (a kubelet cannot run here, see
//! docs/kubernetes.md). It watches the Pods bound to its Node and runs each container with
//! `podman` from the local image (the rendered command, args, env with `valueFrom` resolved,
//! Secret and ConfigMap volumes with their `items`, emptyDir volumes, the security context),
//! runs the startup, readiness and liveness probes (`httpGet`, `tcpSocket`), writes the Pod's
//! status (phase, IP, container states, `Ready`) through the status subresource, restarts
//! containers as the restart policy says, and on deletion stops them with `podman stop -t
//! GRACE` before confirming the deletion.
//!
//! What a pod has to itself is adapted to containers sharing the host's network:
//! - **Addresses**: each pod gets its own address (10.244.X.Y, added to the loopback interface:
//!   the Endpoints API refuses 127.0.0.0/8) as its pod IP, and every `0.0.0.0:` in its args and env values is bound to that address instead, so replicas listen
//!   on the same ports side by side, the Endpoints name distinct addresses and the operator
//!   scrapes each pod where a cluster would.
//! - **The API server**: a pod that mounts its service account's token (the token Secret that
//!   the controller manager's token controller signs) also gets a kubeconfig naming the test
//!   API server and that token file (`KUBECONFIG`); there is no in-cluster Service address.
//! - **Images**: pulled as the container's `imagePullPolicy` says (`IfNotPresent`, the chart's:
//!   only when this machine's image storage lacks it), from registries over TLS, or plain HTTP
//!   for those named with [`TestNode::pull_over_plain_http`] (a node's insecure registries);
//!   the status reports each container's `imageID` as `REPOSITORY@DIGEST`.
//! - Not modelled: resource limits, `exec` probes, `$(VAR)` expansion, projected and
//!   persistent volumes, file modes of Secret and ConfigMap volumes (every file 0644).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, HTTPGetAction, KeyToPath, Node, Pod, Probe, Secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::gateway::{unique_name, LogTail};
use crate::kube::{spawn, Identity, KubeApi};
use crate::podman::podman_command;

/// Where a pod mounts its service account's token.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Where this node mounts the kubeconfig it writes for that token.
const KUBECONFIG_PATH: &str = "/var/run/secrets/e2e-node/kubeconfig";

/// The controllers and the node; everything it started is stopped on drop.
pub struct TestNode {
    pub name: String,
    dir: PathBuf,
    addresses: Arc<Mutex<Vec<String>>>,
    plain_http: Arc<Mutex<Vec<String>>>,
    pulled: Arc<Mutex<Vec<String>>>,
    log: LogTail,
    _controllers: Vec<Child>,
    kubelet: tokio::task::JoinHandle<()>,
}

/// `$KUBE_BIN_DIR`, else where `scripts/kube-node` caches the binaries.
fn kube_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("KUBE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::kube::apiserver_bin().with_file_name(""));
    dir.join(name)
}

impl TestNode {
    /// Starts the controller manager and the scheduler against `api`, registers a Node and
    /// starts its kubelet. Panics when a binary or the image's tools are missing: a journey
    /// that cannot run its pods proves nothing.
    pub async fn start(api: &KubeApi) -> TestNode {
        for bin in ["kube-controller-manager", "kube-scheduler"] {
            assert!(
                kube_bin(bin).is_file(),
                "{} is not built: run scripts/kube-node",
                kube_bin(bin).display()
            );
        }
        assert!(
            crate::podman::image_available(),
            "the node runs its pods with podman from the image: build it with scripts/image"
        );
        let name = unique_name("e2e-node");
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(dir.join("pods")).expect("create the node's folder");
        let log = LogTail::default();
        let admin = api.kubeconfig(Identity::Admin);
        let mut manager = Command::new(kube_bin("kube-controller-manager"));
        manager
            .arg(format!("--kubeconfig={}", admin.display()))
            .args(["--leader-elect=false", "--port=0", "--secure-port=0"])
            // What a kubelet-less cluster needs: no node lifecycle (it would evict the pods of
            // a node without a kubelet's heartbeats), no pod GC of unknown nodes.
            .arg(
                "--controllers=deployment,replicaset,job,endpoint,serviceaccount,\
                 serviceaccount-token,garbagecollector,disruption",
            )
            .arg(format!(
                "--service-account-private-key-file={}",
                api.service_account_key().display()
            ))
            .args(["--concurrent-deployment-syncs=2", "--v=1"]);
        let mut scheduler = Command::new(kube_bin("kube-scheduler"));
        scheduler
            .arg(format!("--kubeconfig={}", admin.display()))
            .args([
                "--leader-elect=false",
                "--port=0",
                "--secure-port=0",
                "--v=1",
            ]);
        let controllers = vec![spawn(manager, &log), spawn(scheduler, &log)];
        TestNode::register(api, name, dir, log, controllers).await
    }

    /// One more node of the cluster whose controllers [`TestNode::start`] runs (a drain needs
    /// somewhere for the pods to go): a Node registered and its kubelet, nothing else.
    pub async fn join(api: &KubeApi) -> TestNode {
        let name = unique_name("e2e-node");
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(dir.join("pods")).expect("create the node's folder");
        TestNode::register(api, name, dir, LogTail::default(), Vec::new()).await
    }

    async fn register(
        api: &KubeApi,
        name: String,
        dir: PathBuf,
        log: LogTail,
        controllers: Vec<Child>,
    ) -> TestNode {
        let admin = api.kubeconfig(Identity::Admin);
        let addresses = Arc::new(Mutex::new(Vec::new()));
        let plain_http = Arc::new(Mutex::new(Vec::new()));
        let pulled = Arc::new(Mutex::new(Vec::new()));
        let client = client_for(&admin).await;
        register_node(&client, &name).await;
        let kubelet = Arc::new(Kubelet {
            client,
            node: name.clone(),
            dir: dir.clone(),
            api_server: api.server_url(),
            next_ip: AtomicU32::new(0),
            addresses: addresses.clone(),
            plain_http: plain_http.clone(),
            pulled: pulled.clone(),
            log: log.clone(),
        });
        let kubelet = tokio::spawn(kubelet.run());
        TestNode {
            name,
            dir,
            addresses,
            plain_http,
            pulled,
            log,
            _controllers: controllers,
            kubelet,
        }
    }

    /// Pulls from the registry at `host` (`HOST:PORT`) over plain HTTP, as a node configured
    /// with it as an insecure registry does (a test's local registry).
    pub fn pull_over_plain_http(&self, host: &str) {
        self.plain_http
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(host.to_owned());
    }

    /// The controllers' output and what the node did, for failure messages.
    pub fn logs(&self) -> String {
        self.log.text()
    }

    /// The output of every container of the pods whose name starts with `prefix`.
    pub fn pod_logs(&self, prefix: &str) -> String {
        let mut out = String::new();
        let Ok(pods) = std::fs::read_dir(self.dir.join("pods")) else {
            return out;
        };
        for pod in pods.flatten() {
            if !pod.file_name().to_string_lossy().starts_with(prefix) {
                continue;
            }
            for file in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if file.path().extension().is_some_and(|e| e == "log") {
                    let text = std::fs::read_to_string(file.path()).unwrap_or_default();
                    out.push_str(&format!(
                        "--- {}/{}\n{text}\n",
                        pod.file_name().to_string_lossy(),
                        file.file_name().to_string_lossy()
                    ));
                }
            }
        }
        out
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.kubelet.abort();
        let label = format!("label=e2e-node={}", self.name);
        let out = podman(&["ps", "-a", "-q", "--filter", &label]);
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "--force", "--time", "0"];
            args.extend(ids.iter().map(String::as_str));
            let _ = podman(&args);
        }
        // Images this node pulled from a journey's registry are that journey's alone (the
        // registry's port is in their name); with the vfs driver each is a full copy on disk,
        // so a suite of journeys would otherwise fill the disk. One still used by another
        // node's containers is refused here and removed by that node's drop.
        let pulled = std::mem::take(&mut *self.pulled.lock().unwrap_or_else(|e| e.into_inner()));
        if !pulled.is_empty() {
            let mut args = vec!["rmi"];
            args.extend(pulled.iter().map(String::as_str));
            let _ = podman(&args);
        }
        for ip in self
            .addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = std::process::Command::new("ip")
                .args(["addr", "del", &format!("{ip}/32"), "dev", "lo"])
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn podman(args: &[&str]) -> std::process::Output {
    crate::podman::podman(args)
}

async fn client_for(kubeconfig: &Path) -> Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("read a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("a kube config");
    Client::try_from(config).expect("a kube client")
}

/// A Node with room for every pod of a test, Ready; no heartbeats are needed since no node
/// lifecycle controller runs.
async fn register_node(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
    }))
    .expect("a Node");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("register the Node");
    let room = json!({"cpu": "64", "memory": "256Gi", "pods": "110"});
    let status = json!({"status": {
        "capacity": room, "allocatable": room,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("mark the Node ready");
    // The API server taints a new Node not-ready (admission TaintNodesByCondition); the node
    // lifecycle controller, which does not run here, would lift it once the Node is Ready.
    let untaint = json!({"spec": {"taints": null}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&untaint))
        .await
        .expect("lift the Node's not-ready taint");
}

fn now() -> Time {
    Time(Timestamp::now())
}

struct Kubelet {
    client: Client,
    node: String,
    dir: PathBuf,
    api_server: String,
    next_ip: AtomicU32,
    /// The pod addresses this node added to the loopback interface, removed on drop.
    addresses: Arc<Mutex<Vec<String>>>,
    /// Registries (`HOST:PORT`) pulled from over plain HTTP.
    plain_http: Arc<Mutex<Vec<String>>>,
    /// The images this node pulled, removed on drop.
    pulled: Arc<Mutex<Vec<String>>>,
    log: LogTail,
}

/// Tells a pod's worker to stop its containers with this grace, then confirm the deletion.
type StopSignal = watch::Sender<Option<i64>>;

impl Kubelet {
    async fn run(self: Arc<Self>) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let mut workers: HashMap<String, StopSignal> = HashMap::new();
        let mut events = std::pin::pin!(watcher(pods, config));
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                Ok(watcher::Event::Delete(pod)) => {
                    if let Some(stop) = workers.remove(&uid(&pod)) {
                        let _ = stop.send(Some(0));
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(e) => {
                    self.say(&format!("watch: {e}"));
                    continue;
                }
            };
            let deleting = pod.metadata.deletion_timestamp.is_some();
            match workers.get(&uid(&pod)) {
                None => {
                    self.say(&format!(
                        "starting pod {}",
                        pod.metadata.name.clone().unwrap_or_default()
                    ));
                    // A pod deleted before it ran only needs its deletion confirmed.
                    let grace =
                        deleting.then(|| pod.metadata.deletion_grace_period_seconds.unwrap_or(0));
                    let (stop, stopped) = watch::channel(grace);
                    workers.insert(uid(&pod), stop);
                    tokio::spawn(self.clone().run_pod(pod, stopped));
                }
                Some(stop) if deleting => {
                    let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
                    // The first deletion's grace counts, as a kubelet's does.
                    stop.send_if_modified(|g| {
                        let first = g.is_none();
                        if first {
                            *g = Some(grace);
                        }
                        first
                    });
                }
                Some(_) => {}
            }
        }
    }

    fn say(&self, line: &str) {
        self.log.push_line(&format!("node {}: {line}", self.node));
    }

    /// The image `container` names, in this machine's image storage as its pull policy says
    /// (a kubelet's image manager: `Never` only looks, `IfNotPresent` pulls when it is absent,
    /// `Always` pulls); its ID as a kubelet reports it, `REPOSITORY@DIGEST`. A failed pull is
    /// retried with a backoff (ImagePullBackOff), then fails the pod.
    async fn pull(&self, container: &Container) -> Result<String, String> {
        let image = container.image.clone().unwrap_or_default();
        let policy = container
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| "IfNotPresent".into());
        let present = || async {
            podman_async(&["image", "exists", &image])
                .await
                .status
                .success()
        };
        let pull = match policy.as_str() {
            "Always" => true,
            "Never" if !present().await => {
                return Err(format!("{}: ErrImageNeverPull {image}", container.name))
            }
            "Never" => false,
            _ => !present().await,
        };
        if pull {
            let host = image.split('/').next().unwrap_or_default().to_owned();
            let plain = self
                .plain_http
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&host);
            let tls = format!("--tls-verify={}", !plain);
            let mut attempt = 0;
            loop {
                let out = podman_async(&["pull", "--quiet", &tls, &image]).await;
                if out.status.success() {
                    self.say(&format!("pulled {image}"));
                    self.pulled
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(image.clone());
                    break;
                }
                let error = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                attempt += 1;
                if attempt == 3 {
                    return Err(format!("{}: ErrImagePull {image}: {error}", container.name));
                }
                self.say(&format!("pulling {image}: {error}"));
                tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
            }
        }
        let inspected =
            podman_async(&["image", "inspect", "--format", "{{.Digest}}", &image]).await;
        let digest = String::from_utf8_lossy(&inspected.stdout).trim().to_owned();
        Ok(format!("{}@{digest}", repository(&image)))
    }

    /// A free address of 10.244.0.0/16 added to the loopback interface (the Endpoints API
    /// refuses loopback addresses); `ip addr add` fails for an address another node of this
    /// machine holds, so two tests never share one.
    fn pod_ip(&self) -> Result<String, String> {
        loop {
            let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
            if n >= 250 * 250 {
                return Err("no free pod address left in 10.244.0.0/16".into());
            }
            let ip = format!("10.244.{}.{}", 1 + n / 250, 1 + n % 250);
            let added = std::process::Command::new("ip")
                .args(["addr", "add", &format!("{ip}/32"), "dev", "lo"])
                .stderr(Stdio::null())
                .status()
                .map_err(|e| format!("ip addr add: {e}"))?;
            if added.success() {
                self.addresses
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(ip.clone());
                return Ok(ip);
            }
        }
    }

    /// One pod from start to deletion.
    async fn run_pod(self: Arc<Self>, pod: Pod, mut stop: watch::Receiver<Option<i64>>) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let mut run = match PodRun::new(&self, &pod) {
            Ok(run) => run,
            Err(e) => {
                self.say(&format!("pod {name}: {e}"));
                return;
            }
        };
        if stop.borrow().is_none() {
            run.report(&pods).await;
            let outcome = tokio::select! {
                outcome = run.run(&self, &pods) => Some(outcome),
                _ = stop.wait_for(Option::is_some) => None,
            };
            if let Some(outcome) = outcome {
                if let Err(e) = outcome {
                    self.say(&format!("pod {name}: {e}"));
                    run.phase = "Failed";
                    run.message = Some(e);
                    run.report(&pods).await;
                }
                let _ = stop.wait_for(Option::is_some).await;
            }
        }
        let grace = (*stop.borrow()).unwrap_or(0);
        run.stop_all(grace).await;
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = pods.delete(&name, &params).await {
            self.say(&format!("pod {name}: confirming its deletion: {e}"));
        }
    }
}

/// `podman ARGS`, awaited without blocking the runtime.
async fn podman_async(args: &[&str]) -> std::process::Output {
    let command = podman_command();
    Command::new(&command[0])
        .args(&command[1..])
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run podman: {e}"))
}

/// An image reference without its tag or digest: `HOST/PATH`.
fn repository(image: &str) -> &str {
    if let Some((repository, _)) = image.split_once('@') {
        return repository;
    }
    match image.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => image,
    }
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// A probe's schedule and its run of results.
#[derive(Default)]
struct ProbeState {
    next: Option<Instant>,
    successes: i32,
    failures: i32,
    /// Why the last probe failed.
    last_error: Option<String>,
}

/// One container of a pod: its spec, its podman process and what the probes said.
struct ContainerRun {
    spec: Container,
    podman_args: Vec<String>,
    /// `REPOSITORY@DIGEST` of the image it runs.
    image_id: String,
    child: Option<Child>,
    podman_name: Option<String>,
    restarts: i32,
    started_at: Option<Time>,
    exit_code: Option<i32>,
    restart_at: Option<Instant>,
    started: bool,
    ready: bool,
    startup: ProbeState,
    readiness: ProbeState,
    liveness: ProbeState,
}

/// What a pod's containers share: its name, folder, address and probe client.
struct PodContext {
    name: String,
    node: String,
    ip: String,
    dir: PathBuf,
    grace: i64,
    http: reqwest::Client,
}

struct PodRun {
    pod: Pod,
    label: String,
    ctx: PodContext,
    phase: &'static str,
    message: Option<String>,
    start_time: Time,
    initialized: bool,
    ready_since: Option<Time>,
    containers: Vec<ContainerRun>,
    last_report: Option<Value>,
}

impl PodRun {
    fn new(kubelet: &Kubelet, pod: &Pod) -> Result<PodRun, String> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let dir = kubelet.dir.join("pods").join(&name);
        let ip = kubelet.pod_ip()?;
        let grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Ok(PodRun {
            pod: pod.clone(),
            ctx: PodContext {
                name,
                node: kubelet.node.clone(),
                ip,
                dir,
                grace,
                http: reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .expect("a probe client"),
            },
            label: format!("e2e-node={}", kubelet.node),
            phase: "Pending",
            message: None,
            start_time: now(),
            initialized: false,
            ready_since: None,
            containers: Vec::new(),
            last_report: None,
        })
    }

    fn spec(&self) -> k8s_openapi::api::core::v1::PodSpec {
        self.pod.spec.clone().unwrap_or_default()
    }

    /// Runs the init containers to completion, then the containers until the pod ends (a
    /// pod that restarts its containers never ends: its worker is stopped by the deletion).
    async fn run(&mut self, kubelet: &Kubelet, pods: &Api<Pod>) -> Result<(), String> {
        std::fs::create_dir_all(&self.ctx.dir).map_err(|e| e.to_string())?;
        let mounts = self.prepare_volumes(kubelet).await?;
        let spec = self.spec();
        for init in spec.init_containers.clone().unwrap_or_default() {
            let args = self.podman_args(kubelet, &init, &mounts).await?;
            let image_id = kubelet.pull(&init).await?;
            // Among the containers while it runs, so that a deletion stops it.
            self.containers = vec![ContainerRun::new(init, args, image_id)];
            let run = &mut self.containers[0];
            loop {
                run.start(&self.ctx)?;
                let code = run.wait().await;
                if code == 0 {
                    break;
                }
                if spec.restart_policy.as_deref() == Some("Never") {
                    return Err(format!("init container {} exited {code}", run.spec.name));
                }
                run.restarts += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        self.containers.clear();
        self.initialized = true;
        for container in spec.containers.clone() {
            let args = self.podman_args(kubelet, &container, &mounts).await?;
            let image_id = kubelet.pull(&container).await?;
            let mut run = ContainerRun::new(container, args, image_id);
            run.start(&self.ctx)?;
            self.containers.push(run);
        }
        self.phase = "Running";
        let policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        loop {
            for run in &mut self.containers {
                run.tick(&self.ctx, &policy).await?;
            }
            if self
                .containers
                .iter()
                .all(|c| c.child.is_none() && c.restart_at.is_none())
            {
                let failed = self.containers.iter().any(|c| c.exit_code != Some(0));
                self.phase = if failed { "Failed" } else { "Succeeded" };
                self.report(pods).await;
                return Ok(());
            }
            self.report(pods).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Host folders for the pod's volumes, by volume name (Secret and ConfigMap volumes are
    /// read-only, as a kubelet mounts them).
    async fn prepare_volumes(
        &self,
        kubelet: &Kubelet,
    ) -> Result<HashMap<String, (PathBuf, bool)>, String> {
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
        let mut volumes = HashMap::new();
        for volume in self.spec().volumes.unwrap_or_default() {
            let host = self.ctx.dir.join("volumes").join(&volume.name);
            std::fs::create_dir_all(&host).map_err(|e| e.to_string())?;
            let files: BTreeMap<String, Vec<u8>> = if let Some(secret) = &volume.secret {
                let secrets: Api<Secret> = Api::namespaced(kubelet.client.clone(), &namespace);
                let name = secret.secret_name.clone().unwrap_or_default();
                let secret = secrets
                    .get(&name)
                    .await
                    .map_err(|e| format!("Secret {name} of volume {}: {e}", volume.name))?;
                let data = secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                let items = volume.secret.as_ref().and_then(|s| s.items.clone());
                projected(data, items, &volume.name)?
            } else if let Some(map) = &volume.config_map {
                let maps: Api<ConfigMap> = Api::namespaced(kubelet.client.clone(), &namespace);
                let found = maps.get(&map.name).await.map_err(|e| {
                    format!("ConfigMap {} of volume {}: {e}", map.name, volume.name)
                })?;
                let data = found
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect();
                projected(data, map.items.clone(), &volume.name)?
            } else if volume.empty_dir.is_some() {
                set_mode(&host, 0o777)?;
                volumes.insert(volume.name.clone(), (host, false));
                continue;
            } else {
                return Err(format!(
                    "volume {} is of a kind this node does not mount",
                    volume.name
                ));
            };
            for (key, bytes) in files {
                let path = host.join(&key);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
                }
                std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
                set_mode(&path, 0o644)?;
            }
            set_mode(&host, 0o755)?;
            volumes.insert(volume.name.clone(), (host, true));
        }
        Ok(volumes)
    }

    /// `podman run` arguments up to and including the container's own arguments.
    async fn podman_args(
        &self,
        kubelet: &Kubelet,
        container: &Container,
        volumes: &HashMap<String, (PathBuf, bool)>,
    ) -> Result<Vec<String>, String> {
        let spec = self.spec();
        let pod_security = spec.security_context.clone().unwrap_or_default();
        let security = container.security_context.clone().unwrap_or_default();
        // The image is in storage already (Kubelet::pull).
        let mut args: Vec<String> = ["run", "--network", "host", "--pull", "never", "--label"]
            .map(str::to_owned)
            .to_vec();
        args.push(self.label.clone());
        let user = security.run_as_user.or(pod_security.run_as_user);
        let group = security.run_as_group.or(pod_security.run_as_group);
        let non_root = security.run_as_non_root.or(pod_security.run_as_non_root);
        if non_root == Some(true) && user.unwrap_or(0) == 0 {
            return Err(format!(
                "{}: runAsNonRoot with user {user:?}",
                container.name
            ));
        }
        if let Some(user) = user {
            args.push("--user".into());
            args.push(match group {
                Some(group) => format!("{user}:{group}"),
                None => user.to_string(),
            });
        }
        if let Some(fs_group) = pod_security.fs_group {
            args.extend(["--group-add".into(), fs_group.to_string()]);
        }
        if security.read_only_root_filesystem == Some(true) {
            // Only the pod's volumes are writable, not podman's default tmpfs mounts.
            args.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
        }
        if security.allow_privilege_escalation == Some(false) {
            args.extend(["--security-opt".into(), "no-new-privileges".into()]);
        }
        if let Some(caps) = &security.capabilities {
            for cap in caps.drop.clone().unwrap_or_default() {
                args.extend(["--cap-drop".into(), cap]);
            }
            for cap in caps.add.clone().unwrap_or_default() {
                args.extend(["--cap-add".into(), cap]);
            }
        }
        let mut api_access = false;
        for mount in container.volume_mounts.clone().unwrap_or_default() {
            let (host, read_only) = volumes
                .get(&mount.name)
                .ok_or_else(|| format!("{}: no volume {}", container.name, mount.name))?;
            let host = match &mount.sub_path {
                Some(sub) if !sub.is_empty() => host.join(sub),
                _ => host.clone(),
            };
            let ro = *read_only || mount.read_only == Some(true);
            args.push("--volume".into());
            args.push(format!(
                "{}:{}:{}",
                host.display(),
                mount.mount_path,
                if ro { "ro" } else { "rw" }
            ));
            api_access |= mount.mount_path == TOKEN_DIR;
        }
        for var in container.env.clone().unwrap_or_default() {
            let value = self.env_value(kubelet, &var).await?;
            args.extend([
                "--env".into(),
                format!("{}={}", var.name, self.on_pod_ip(&value)),
            ]);
        }
        if api_access {
            let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
            let path = self.ctx.dir.join("kubeconfig");
            let config = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    \
                 server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: pod\n  user:\n    \
                 tokenFile: {TOKEN_DIR}/token\ncontexts:\n- name: e2e\n  context:\n    \
                 cluster: e2e\n    user: pod\n    namespace: {namespace}\ncurrent-context: e2e\n",
                kubelet.api_server
            );
            std::fs::write(&path, config).map_err(|e| e.to_string())?;
            set_mode(&path, 0o644)?;
            args.push("--volume".into());
            args.push(format!("{}:{KUBECONFIG_PATH}:ro", path.display()));
            args.extend(["--env".into(), format!("KUBECONFIG={KUBECONFIG_PATH}")]);
        }
        if let Some(command) = &container.command {
            args.push("--entrypoint".into());
            args.push(serde_json::to_string(command).map_err(|e| e.to_string())?);
        }
        args.push(container.image.clone().unwrap_or_default());
        for arg in container.args.clone().unwrap_or_default() {
            args.push(self.on_pod_ip(&arg));
        }
        Ok(args)
    }

    /// `0.0.0.0:PORT` (every address of the pod's own network) becomes `POD_IP:PORT`.
    fn on_pod_ip(&self, value: &str) -> String {
        value.replace("0.0.0.0:", &format!("{}:", self.ctx.ip))
    }

    async fn env_value(&self, kubelet: &Kubelet, var: &EnvVar) -> Result<String, String> {
        if let Some(value) = &var.value {
            return Ok(value.clone());
        }
        let from = var.value_from.clone().unwrap_or_default();
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
        if let Some(key) = from.secret_key_ref {
            let secrets: Api<Secret> = Api::namespaced(kubelet.client.clone(), &namespace);
            let secret = secrets
                .get(&key.name)
                .await
                .map_err(|e| format!("{}: Secret {}: {e}", var.name, key.name))?;
            let bytes = secret
                .data
                .and_then(|mut d| d.remove(&key.key))
                .ok_or_else(|| {
                    format!("{}: no key {} in Secret {}", var.name, key.key, key.name)
                })?;
            return String::from_utf8(bytes.0).map_err(|e| e.to_string());
        }
        if let Some(key) = from.config_map_key_ref {
            let maps: Api<ConfigMap> = Api::namespaced(kubelet.client.clone(), &namespace);
            let map = maps
                .get(&key.name)
                .await
                .map_err(|e| format!("{}: ConfigMap {}: {e}", var.name, key.name))?;
            return map
                .data
                .and_then(|mut d| d.remove(&key.key))
                .ok_or_else(|| {
                    format!("{}: no key {} in ConfigMap {}", var.name, key.key, key.name)
                });
        }
        if let Some(field) = from.field_ref {
            let meta = &self.pod.metadata;
            return match field.field_path.as_str() {
                "metadata.name" => Ok(self.ctx.name.clone()),
                "metadata.namespace" => Ok(namespace),
                "metadata.uid" => Ok(uid(&self.pod)),
                "spec.nodeName" => Ok(kubelet.node.clone()),
                "spec.serviceAccountName" => {
                    Ok(self.spec().service_account_name.unwrap_or_default())
                }
                "status.podIP" => Ok(self.ctx.ip.clone()),
                "status.hostIP" => Ok("127.0.0.1".into()),
                other => meta
                    .labels
                    .as_ref()
                    .and_then(|l| {
                        let key = other
                            .strip_prefix("metadata.labels['")?
                            .strip_suffix("']")?;
                        l.get(key).cloned()
                    })
                    .ok_or_else(|| format!("{}: fieldRef {other} is not supported", var.name)),
            };
        }
        Err(format!(
            "{}: an env source this node does not resolve",
            var.name
        ))
    }

    /// The pod's status, written when it changed.
    async fn report(&mut self, pods: &Api<Pod>) {
        let ready = self.phase == "Running" && self.containers.iter().all(|c| c.ready);
        match (ready, &self.ready_since) {
            (true, None) => self.ready_since = Some(now()),
            (false, Some(_)) => self.ready_since = None,
            _ => {}
        }
        let flag = |b: bool| if b { "True" } else { "False" };
        let containers: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                let state = match (&c.child, c.exit_code) {
                    (Some(_), _) => json!({"running": {"startedAt": c.started_at}}),
                    (None, Some(code)) => json!({"terminated": {
                        "exitCode": code,
                        "reason": if code == 0 { "Completed" } else { "Error" },
                    }}),
                    (None, None) => json!({"waiting": {"reason": "ContainerCreating"}}),
                };
                json!({
                    "name": c.spec.name, "image": c.spec.image, "imageID": c.image_id,
                    "ready": c.ready, "started": c.started, "restartCount": c.restarts,
                    "state": state,
                })
            })
            .collect();
        let mut status = json!({
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "podIP": self.ctx.ip,
            "podIPs": [{"ip": self.ctx.ip}],
            "startTime": self.start_time,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": flag(self.initialized)},
                {"type": "ContainersReady", "status": flag(ready), "lastTransitionTime": self.ready_since},
                {"type": "Ready", "status": flag(ready), "lastTransitionTime": self.ready_since},
            ],
            "containerStatuses": containers,
        });
        if let Some(message) = &self.message {
            status["message"] = json!(message);
        }
        if self.last_report.as_ref() == Some(&status) {
            return;
        }
        let patch = json!({"status": status});
        if pods
            .patch_status(
                &self.ctx.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .is_ok()
        {
            self.last_report = Some(status);
        }
    }

    async fn stop_all(&mut self, grace: i64) {
        let stops = self.containers.iter_mut().map(|c| c.stop(grace));
        futures::future::join_all(stops).await;
    }
}

impl PodContext {
    fn probe_url(&self, container: &Container, get: &HTTPGetAction) -> Result<String, String> {
        let port = port_number(container, &get.port)?;
        let path = get.path.clone().unwrap_or_else(|| "/".into());
        Ok(format!("http://{}:{port}{path}", self.ip))
    }

    /// Runs the probe once: 2xx/3xx (httpGet) or a connection (tcpSocket) is a success; else
    /// why not.
    async fn probe_once(&self, container: &Container, probe: &Probe) -> Result<(), String> {
        let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
        if let Some(get) = &probe.http_get {
            let url = self.probe_url(container, get)?;
            match self.http.get(&url).timeout(timeout).send().await {
                Ok(response) if (200..400).contains(&response.status().as_u16()) => Ok(()),
                Ok(response) => Err(format!("GET {url}: {}", response.status())),
                Err(e) => Err(format!("GET {url}: {e}")),
            }
        } else if let Some(tcp) = &probe.tcp_socket {
            let port = port_number(container, &tcp.port)?;
            let connect = tokio::net::TcpStream::connect((self.ip.as_str(), port));
            match tokio::time::timeout(timeout, connect).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("connect to port {port}: {e}")),
                Err(_) => Err(format!("connect to port {port}: timed out")),
            }
        } else {
            Ok(())
        }
    }

    /// Notes a line in the container's log, as a kubelet's events are seen beside it.
    fn note(&self, container: &str, line: &str) {
        use std::io::Write;
        let path = self.dir.join(format!("{container}.log"));
        if let Ok(mut log) = std::fs::OpenOptions::new().append(true).open(path) {
            let _ = writeln!(log, "node: {line}");
        }
    }
}

impl ContainerRun {
    fn new(spec: Container, podman_args: Vec<String>, image_id: String) -> ContainerRun {
        ContainerRun {
            spec,
            podman_args,
            image_id,
            child: None,
            podman_name: None,
            restarts: 0,
            started_at: None,
            exit_code: None,
            restart_at: None,
            started: false,
            ready: false,
            startup: ProbeState::default(),
            readiness: ProbeState::default(),
            liveness: ProbeState::default(),
        }
    }

    /// `podman run --rm` in the foreground: the process ends when the container does; its
    /// output appended to `POD_DIR/CONTAINER.log`.
    fn start(&mut self, pod: &PodContext) -> Result<(), String> {
        let name = format!(
            "{}-{}-{}-{}",
            pod.node, pod.name, self.spec.name, self.restarts
        );
        let log_path = pod.dir.join(format!("{}.log", self.spec.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| e.to_string())?;
        let command = podman_command();
        let mut cmd = Command::new(&command[0]);
        cmd.args(&command[1..])
            .arg(&self.podman_args[0])
            .args(["--rm", "--name", &name])
            .args(&self.podman_args[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| format!("podman: {e}"))?;
        self.child = Some(child);
        self.podman_name = Some(name);
        self.started_at = Some(now());
        self.exit_code = None;
        self.restart_at = None;
        self.started = self.spec.startup_probe.is_none();
        self.ready = false;
        let start = Instant::now();
        for (state, probe) in [
            (&mut self.startup, &self.spec.startup_probe),
            (&mut self.readiness, &self.spec.readiness_probe),
            (&mut self.liveness, &self.spec.liveness_probe),
        ] {
            let delay = probe
                .as_ref()
                .and_then(|p| p.initial_delay_seconds)
                .unwrap_or(0);
            *state = ProbeState {
                next: Some(start + Duration::from_secs(delay.max(0) as u64)),
                ..ProbeState::default()
            };
        }
        Ok(())
    }

    async fn wait(&mut self) -> i32 {
        let code = match self.child.as_mut() {
            Some(child) => child.wait().await.ok().and_then(|s| s.code()).unwrap_or(-1),
            None => -1,
        };
        self.child = None;
        self.exit_code = Some(code);
        code
    }

    /// One look at the container: has it exited (restart it as the policy says), are its
    /// probes due (run them; a failed liveness probe stops it).
    async fn tick(&mut self, pod: &PodContext, policy: &str) -> Result<(), String> {
        if let Some(at) = self.restart_at {
            if Instant::now() >= at {
                self.restarts += 1;
                self.start(pod)?;
            }
            return Ok(());
        }
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if let Ok(Some(status)) = child.try_wait() {
            let code = status.code().unwrap_or(-1);
            self.child = None;
            self.exit_code = Some(code);
            self.ready = false;
            if policy == "Always" || (policy == "OnFailure" && code != 0) {
                let backoff = 1u64 << self.restarts.clamp(0, 4);
                self.restart_at = Some(Instant::now() + Duration::from_secs(backoff));
            }
            return Ok(());
        }
        let now = Instant::now();
        if !self.started {
            if let Some(probe) = self.spec.startup_probe.clone() {
                if let Some(result) =
                    Self::due(&mut self.startup, &probe, now, pod, &self.spec).await
                {
                    if result {
                        self.started = true;
                    } else if self.startup.failures >= probe.failure_threshold.unwrap_or(3) {
                        self.stop(pod.grace).await;
                    }
                }
            }
            return Ok(());
        }
        match self.spec.readiness_probe.clone() {
            Some(probe) => {
                if let Some(result) =
                    Self::due(&mut self.readiness, &probe, now, pod, &self.spec).await
                {
                    if result && self.readiness.successes >= probe.success_threshold.unwrap_or(1) {
                        self.ready = true;
                    } else if !result
                        && self.readiness.failures >= probe.failure_threshold.unwrap_or(3)
                    {
                        if self.ready {
                            let why = self.readiness.last_error.as_deref().unwrap_or_default();
                            pod.note(&self.spec.name, &format!("not ready: {why}"));
                        }
                        self.ready = false;
                    }
                }
            }
            None => self.ready = true,
        }
        if let Some(probe) = self.spec.liveness_probe.clone() {
            if let Some(false) = Self::due(&mut self.liveness, &probe, now, pod, &self.spec).await {
                if self.liveness.failures >= probe.failure_threshold.unwrap_or(3) {
                    self.stop(pod.grace).await;
                }
            }
        }
        Ok(())
    }

    /// Runs the probe when it is due; its result, and the run of results updated.
    async fn due(
        state: &mut ProbeState,
        probe: &Probe,
        now: Instant,
        pod: &PodContext,
        spec: &Container,
    ) -> Option<bool> {
        if state.next.is_some_and(|next| now < next) {
            return None;
        }
        let period = probe.period_seconds.unwrap_or(10).max(1) as u64;
        state.next = Some(now + Duration::from_secs(period));
        let result = pod.probe_once(spec, probe).await;
        let ok = result.is_ok();
        if ok {
            state.successes += 1;
            state.failures = 0;
        } else {
            state.failures += 1;
            state.successes = 0;
        }
        state.last_error = result.err();
        Some(ok)
    }

    /// `podman stop -t GRACE`: SIGTERM, SIGKILL after the grace; waits for the container's end.
    async fn stop(&mut self, grace: i64) {
        self.restart_at = None;
        let (Some(name), Some(child)) = (self.podman_name.clone(), self.child.as_mut()) else {
            return;
        };
        let command = podman_command();
        let _ = Command::new(&command[0])
            .args(&command[1..])
            .args(["stop", "-t", &grace.max(0).to_string(), &name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        let code = child.wait().await.ok().and_then(|s| s.code()).unwrap_or(-1);
        self.child = None;
        self.exit_code = Some(code);
        self.ready = false;
    }
}

/// The files a Secret or ConfigMap volume shows, by path: every key at its own name, or with
/// `items` only the keys listed, each at its `path` (as a kubelet projects them; a listed key
/// the object lacks fails the pod's start, as it does there).
fn projected(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<Vec<KeyToPath>>,
    volume: &str,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let Some(items) = items else {
        return Ok(data);
    };
    items
        .into_iter()
        .map(|item| {
            let bytes = data
                .get(&item.key)
                .cloned()
                .ok_or_else(|| format!("volume {volume}: no key {}", item.key))?;
            Ok((item.path, bytes))
        })
        .collect()
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port_number(container: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|e| e.to_string()),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("{}: no port {name}", container.name)),
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}
