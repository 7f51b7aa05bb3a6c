//! A real Kubernetes API server for the operator tests: Debian's `etcd` and a `kube-apiserver`
//! built by `scripts/kube-apiserver` (cached in `~/.cache/svc-gateway/kube/`, outside the checkout so a fresh clone on the same machine reuses it), on free loopback ports, with
//! RBAC on and one static token per identity (admin, the operator's and the gateway's service
//! accounts), so the shipped RBAC in `deploy/rbac/` is what the processes run under. Killed
//! on drop, its files in a temporary folder.
//!
//! There are no controllers, no kubelet and no pods: Deployments stay objects, which is all
//! the operator needs. [`crate::node`] adds controllers and a node that runs the pods.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::gateway::{drain, unique_name, workspace_root, LogTail};
use crate::poll_until;
use crate::server::free_port;

/// The namespace the gateway's resources live in, as in `deploy/rbac/`.
pub const NAMESPACE: &str = "gateway";

/// The identities of the static token file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    Admin,
    Operator,
    Gateway,
}

impl Identity {
    fn token(self) -> &'static str {
        match self {
            Identity::Admin => "e2e-admin-token",
            Identity::Operator => "e2e-operator-token",
            Identity::Gateway => "e2e-gateway-token",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Operator => "operator",
            Identity::Gateway => "gateway",
        }
    }
}

pub struct KubeApi {
    dir: PathBuf,
    port: u16,
    _etcd: Child,
    _apiserver: Child,
    log: LogTail,
}

/// `$KUBE_APISERVER_BIN`, else the binary `scripts/kube-apiserver` caches.
pub(crate) fn apiserver_bin() -> PathBuf {
    std::env::var_os("KUBE_APISERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(|| workspace_root().join(".cache"));
            cache.join("svc-gateway/kube/kube-apiserver")
        })
}

impl KubeApi {
    /// Starts etcd and the API server and waits until the API is ready. When the API server
    /// binary or etcd is not installed: a failure under CI, else `None` after saying why (the
    /// test skips on a developer's machine).
    pub async fn start() -> Option<KubeApi> {
        let bin = apiserver_bin();
        let missing = if !bin.exists() {
            Some(format!("{} is not built", bin.display()))
        } else if !on_path("etcd") || !on_path("kubectl") || !on_path("openssl") {
            Some("etcd, kubectl or openssl is not installed".to_owned())
        } else {
            None
        };
        if let Some(reason) = missing {
            crate::missing_dependency(&format!(
                "no Kubernetes API server: {reason}; run scripts/kube-apiserver"
            ));
            return None;
        }
        let dir = std::env::temp_dir().join(unique_name("e2e-kube"));
        std::fs::create_dir_all(&dir).expect("create the API server's folder");
        let status = std::process::Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(dir.join("sa.key"))
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success(), "openssl genrsa failed");
        let tokens: String = [Identity::Admin, Identity::Operator, Identity::Gateway]
            .iter()
            .map(|id| match id {
                Identity::Admin => format!("{},admin,admin,system:masters\n", id.token()),
                _ => format!(
                    "{},system:serviceaccount:{NAMESPACE}:{},{}\n",
                    id.token(),
                    if *id == Identity::Operator {
                        "gateway-operator"
                    } else {
                        "gateway"
                    },
                    id.name()
                ),
            })
            .collect();
        std::fs::write(dir.join("tokens.csv"), tokens).expect("write the token file");

        let log = LogTail::default();
        let etcd_port = free_port();
        let mut etcd = Command::new("etcd");
        etcd.arg("--data-dir")
            .arg(dir.join("etcd"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{}",
                free_port()
            ));
        let etcd = spawn(etcd, &log);
        let port = free_port();
        let mut apiserver = Command::new(&bin);
        apiserver
            .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!(
                "--token-auth-file={}",
                dir.join("tokens.csv").display()
            ))
            .arg("--authorization-mode=RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                dir.join("sa.key").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                dir.join("sa.key").display()
            ))
            .arg("--service-cluster-ip-range=10.0.0.0/24");
        let apiserver = spawn(apiserver, &log);
        let api = KubeApi {
            dir,
            port,
            _etcd: etcd,
            _apiserver: apiserver,
            log,
        };
        for id in [Identity::Admin, Identity::Operator, Identity::Gateway] {
            api.write_kubeconfig(id);
        }
        // Generous: on two cores shared with builds, the 1.20 API server took over a minute
        // to answer /readyz (a CI run failed at 60 s).
        poll_until(
            "the API server to be ready",
            Duration::from_secs(180),
            Duration::from_millis(250),
            || async {
                let out = api.kubectl(&["get", "--raw", "/readyz"]);
                out.status.success().then_some(())
            },
        )
        .await;
        api.create_namespace(NAMESPACE);
        Some(api)
    }

    /// [`KubeApi::start`], then the CRDs (once served), the RBAC of `deploy/rbac/` (and the
    /// config Secret it ships), a Role letting the operator read [`TEST_SECRETS`] and the
    /// standalone resources of `deploy/standalone/`: what an operator needs to publish a config.
    pub async fn start_with_gateway_resources() -> Option<KubeApi> {
        let api = KubeApi::start().await?;
        api.apply_crds();
        api.wait_for_crds().await;
        api.apply_path("deploy/rbac/");
        let out = api.apply(&test_secrets_role());
        assert!(
            out.status.success(),
            "kubectl apply of the test Secrets' Role failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        api.apply_path("deploy/standalone/");
        Some(api)
    }

    /// Waits until the API serves the applied CRDs' resources.
    pub async fn wait_for_crds(&self) {
        poll_until(
            "the CRDs to be served",
            Duration::from_secs(20),
            Duration::from_millis(200),
            || async {
                let out = self.kubectl(&["get", "tiers,modelroutes,apikeys"]);
                out.status.success().then_some(())
            },
        )
        .await;
    }

    fn write_kubeconfig(&self, id: Identity) {
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    \
             server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\nusers:\n\
             - name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context:\n    \
             cluster: e2e\n    user: {name}\n    namespace: {NAMESPACE}\ncurrent-context: e2e\n",
            self.port,
            name = id.name(),
            token = id.token(),
        );
        std::fs::write(self.kubeconfig(id), config).expect("write a kubeconfig");
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The key the API server verifies service account tokens with (the controller manager
    /// signs them with it).
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }

    /// A kubeconfig that authenticates as `id`.
    pub fn kubeconfig(&self, id: Identity) -> PathBuf {
        self.dir.join(format!("{}.kubeconfig", id.name()))
    }

    /// `kubectl ARGS` as admin, in [`NAMESPACE`].
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with_input(args, None)
    }

    /// [`KubeApi::kubectl`] awaited without blocking the runtime (`rollout status`, `wait`).
    pub async fn kubectl_waiting(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .env("KUBECONFIG", self.kubeconfig(Identity::Admin))
            .args(["--namespace", NAMESPACE])
            .args(args)
            .output()
            .await
            .expect("run kubectl")
    }

    /// `kubectl auth can-i VERB WHAT EXTRA…` as service account `who` of [`NAMESPACE`]: its
    /// answer, yes or no. Any other outcome (kubectl failing, the server unreachable) fails the
    /// test, so that a negative check cannot pass on an error.
    pub fn can(&self, who: &str, verb: &str, what: &str, extra: &[&str]) -> bool {
        let user = format!("--as=system:serviceaccount:{NAMESPACE}:{who}");
        let mut args = vec!["auth", "can-i", verb, what, user.as_str()];
        args.extend_from_slice(extra);
        let out = self.kubectl(&args);
        let answer = String::from_utf8_lossy(&out.stdout);
        // kubectl exits 0 with "yes", 1 with "no" (possibly followed by a reason).
        match (out.status.code(), answer.trim()) {
            (Some(0), "yes") => true,
            (Some(1), no) if no == "no" || no.starts_with("no ") => false,
            _ => panic!(
                "kubectl auth can-i {verb} {what} as {who} {extra:?} neither said yes nor no: {out:?}"
            ),
        }
    }

    /// `kubectl apply -f -` of `yaml` as admin; the output, successful or not.
    pub fn apply(&self, yaml: &str) -> Output {
        self.kubectl_with_input(&["apply", "-f", "-"], Some(yaml))
    }

    /// `kubectl apply -f PATH` (file or folder, relative to the workspace) as admin; panics
    /// when kubectl fails.
    pub fn apply_path(&self, path: &str) {
        let path = workspace_root().join(path);
        let out = self.kubectl(&["apply", "-f", &path.to_string_lossy()]);
        assert!(
            out.status.success(),
            "kubectl apply -f {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Applies the chart's CRDs. Without kubectl's client-side validation: this API server
    /// (1.20) predates CEL, so its OpenAPI does not know `x-kubernetes-validations` (it drops
    /// the rules and enforces the rest of the schema).
    pub fn apply_crds(&self) {
        let path = workspace_root().join("charts/gateway/files/crds.yaml");
        let out = self.kubectl(&["apply", "--validate=false", "-f", &path.to_string_lossy()]);
        assert!(
            out.status.success(),
            "kubectl apply of the CRDs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl get KIND NAME -o jsonpath=PATH`, empty when it fails.
    pub fn jsonpath(&self, kind: &str, name: &str, path: &str) -> String {
        let out = self.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn create_namespace(&self, name: &str) {
        let out = self.kubectl(&["create", "namespace", name]);
        assert!(out.status.success(), "kubectl create namespace: {:?}", out);
    }

    fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Output {
        let mut cmd = std::process::Command::new("kubectl");
        cmd.env("KUBECONFIG", self.kubeconfig(Identity::Admin))
            .args(["--namespace", NAMESPACE])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(mut stdin) = child.stdin.take() {
            if let Some(input) = input {
                stdin
                    .write_all(input.as_bytes())
                    .expect("write kubectl's input");
            }
        }
        child.wait_with_output().expect("wait for kubectl")
    }

    /// The API server's and etcd's output so far, for failure messages.
    pub fn logs(&self) -> String {
        self.log.text()
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        // The children are killed by kill_on_drop; only the files remain.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn spawn(mut cmd: Command, log: &LogTail) -> Child {
    crate::tie_to_test(&mut cmd);
    let mut child = cmd.spawn().expect("spawn a Kubernetes process");
    if let Some(out) = child.stdout.take() {
        drain(out, log.clone(), None);
    }
    if let Some(err) = child.stderr.take() {
        drain(err, log.clone(), None);
    }
    child
}

fn on_path(command: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(command).is_file()))
}

/// The Secrets the tests' resources refer to beyond `deploy/rbac/`'s: the standalone seed's and
/// the one the operator tests' broken route waits for. [`Operator::start`] points the operator
/// at them (and at `upstream-api-keys`, as deploy/rbac does); under the chart's RBAC, which
/// does not name them, the operator treats them as unreadable.
pub const TEST_SECRETS: &[&str] = &["example-enterprise-key", "no-such-secret"];

/// A Role (and its binding) letting the operator's service account read [`TEST_SECRETS`], as
/// an operator pointed at more Secrets needs.
fn test_secrets_role() -> String {
    let names = TEST_SECRETS
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: e2e-operator-secrets\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [\"secrets\"]\n    resourceNames: [{names}]\n    \
         verbs: [\"get\", \"list\", \"watch\"]\n---\napiVersion: rbac.authorization.k8s.io/v1\n\
         kind: RoleBinding\nmetadata:\n  name: e2e-operator-secrets\nroleRef:\n  \
         apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: e2e-operator-secrets\n\
         subjects:\n  - kind: ServiceAccount\n    name: gateway-operator\n    namespace: {NAMESPACE}\n"
    )
}

/// `$OPERATOR_BIN`, else the operator next to the gateway binary the tests use.
pub fn operator_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("OPERATOR_BIN") {
        return PathBuf::from(bin);
    }
    crate::gateway::gateway_bin().with_file_name("operator")
}

/// A running `operator run` process under the operator's service account, killed on drop.
pub struct Operator {
    pub identity: String,
    child: Option<Child>,
    log: LogTail,
}

impl Operator {
    /// Starts `operator run --identity IDENTITY` in [`NAMESPACE`], pointed at
    /// `upstream-api-keys` and [`TEST_SECRETS`], with `extra` flags.
    pub fn start(api: &KubeApi, identity: &str, extra: &[&str]) -> Operator {
        let mut cmd = Command::new(operator_bin());
        cmd.env("KUBECONFIG", api.kubeconfig(Identity::Operator))
            .env("RUST_LOG", "info,kube_client=error")
            .env("NO_COLOR", "1")
            .args(["run", "--namespace", NAMESPACE, "--identity", identity])
            .args(["--secret", "upstream-api-keys"])
            .args(TEST_SECRETS.iter().flat_map(|name| ["--secret", name]))
            .args(extra);
        let log = LogTail::default();
        let child = spawn(cmd, &log);
        Operator {
            identity: identity.to_owned(),
            child: Some(child),
            log,
        }
    }

    pub fn logs(&self) -> String {
        self.log.text()
    }

    /// SIGKILL: no chance to hand the Lease over.
    pub async fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}
