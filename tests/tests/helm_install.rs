//! The Helm chart installs and upgrades on a real kube-apiserver (`scripts/kube-apiserver`;
//! how, in `e2e::helm`): every object it renders, CRDs and RBAC included, is accepted by the
//! API server, and what it promises holds there.
//!
//! Skips (with the reason on stderr) where the API server or helm is missing; fails instead
//! under CI.

use std::path::Path;

use e2e::helm::{assert_ok, helm, Trial};
use e2e::kube::NAMESPACE;

#[tokio::test]
async fn the_chart_installs_and_upgrades_on_a_real_api_server() {
    let Some(trial) = Trial::start("gw").await else {
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
    let Some(trial) = Trial::start("gw").await else {
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
    let Some(trial) = Trial::start("gw").await else {
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
    let Some(trial) = Trial::start("gw").await else {
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
    let Some(trial) = Trial::start("gw").await else {
        return;
    };
    trial.helm("install", &[]);
    let can =
        |who: &str, verb: &str, what: &str, extra: &[&str]| trial.api.can(who, verb, what, extra);
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

#[tokio::test]
async fn the_operator_may_read_only_the_secrets_it_is_pointed_at_and_create_none_and_the_release_owns_the_config_secret(
) {
    let Some(trial) = Trial::start("gw").await else {
        return;
    };
    trial.helm(
        "install",
        &["--set", "operator.secrets={upstream-api-keys}"],
    );
    let api = &trial.api;
    let can = |who: &str, verb: &str, what: &str| api.can(who, verb, what, &[]);
    let operator = "gw-gateway-operator";
    for secret in ["secrets/gw-gateway-config", "secrets/upstream-api-keys"] {
        for verb in ["get", "list", "watch"] {
            assert!(
                can(operator, verb, secret),
                "the operator may not {verb} {secret}"
            );
        }
    }
    for (verb, what) in [
        // A service account that may create Secrets can mint a token for any other.
        ("create", "secrets"),
        ("create", "secrets/gw-gateway-config"),
        ("get", "secrets/gw-gateway-admin"),
        ("get", "secrets/other"),
        ("list", "secrets"),
        ("watch", "secrets"),
        ("patch", "secrets/upstream-api-keys"),
    ] {
        assert!(!can(operator, verb, what), "the operator may {verb} {what}");
    }
    // The gateway Deployment is read, by name, for the uid of the events about it.
    assert!(can(operator, "get", "deployments/gw-gateway"));
    assert!(!can(operator, "get", "deployments/other"));
    assert!(!can(operator, "list", "deployments"));
    let env = api.jsonpath(
        "deployment",
        operator,
        "{.spec.template.spec.containers[0].env[?(@.name==\"OPERATOR_SECRETS\")].value}",
    );
    assert_eq!(env, "upstream-api-keys");

    // The chart made the config Secret, empty, for the operator to fill; uninstall removes it.
    let data = api.jsonpath("secret", "gw-gateway-config", "{.data}");
    assert!(
        api.kubectl(&["get", "secret", "gw-gateway-config"])
            .status
            .success(),
        "the chart created no config Secret"
    );
    assert_eq!(data, "", "the chart's config Secret holds data: {data}");
    assert_ok("helm uninstall", &helm(api, &["uninstall", "gw"]));
    assert!(
        !api.kubectl(&["get", "secret", "gw-gateway-config"])
            .status
            .success(),
        "helm uninstall left the config Secret"
    );
}
