"""The chart's alerts and dashboard: every rule of the rendered PrometheusRule passes its promtool
unit tests (alerts/promtool-tests.yaml), and the dashboard's queries parse and name the series
the rules do. Which of those series a running gateway and operator export is checked by the
Rust end-to-end tests (tests/tests/metrics.rs reads `metric_names()` through this file's CLI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_helm_chart import CHART, NAMESPACE, named, render

ALERTS_DIR = Path(__file__).resolve().parent / "alerts"
# Series Prometheus makes itself, not the gateway.
PROMETHEUS_OWN = {"up"}


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        message = "promtool not found: apt-get install prometheus (scripts/test does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def rule_groups(*values: str) -> list[dict]:
    objects = render("--set", "prometheusRule.enabled=true", *values)
    return named(objects, "PrometheusRule", "gw-gateway")["spec"]["groups"]


def dashboard() -> dict:
    objects = render("--set", "grafanaDashboard.enabled=true")
    config_map = named(objects, "ConfigMap", "gw-gateway-dashboard")
    return json.loads(config_map["data"]["svc-gateway.json"])


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def rule_queries() -> list[str]:
    return [r["expr"] for g in rule_groups() for r in g["rules"]]


def metric_names() -> list[str]:
    """Every series the rules and the dashboard query, as exported (`_bucket`, `_count` and
    `_sum` name their histogram), Prometheus's own left out."""
    names = set()
    for query in rule_queries() + dashboard_queries():
        names |= set(re.findall(r"\b(gateway_[a-z_]+)", query))
    return sorted(names - PROMETHEUS_OWN)


def test_every_alert_fires_past_its_threshold_and_stays_quiet_under_it(tmp_path: Path) -> None:
    tool = promtool()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    shutil.copy(ALERTS_DIR / "promtool-tests.yaml", tmp_path)
    checked = subprocess.run([tool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", "promtool-tests.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load((ALERTS_DIR / "promtool-tests.yaml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    alerts = {r["alert"] for g in rule_groups() for r in g["rules"]}
    assert alerts == fired, f"alerts without a firing test: {alerts - fired}"


def test_a_broken_threshold_fails_the_alerts_unit_tests(tmp_path: Path) -> None:
    tool = promtool()
    groups = rule_groups("--set-json", "prometheusRule.errorRatio=0.5")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(ALERTS_DIR / "promtool-tests.yaml", tmp_path)
    tested = subprocess.run(
        [tool, "test", "rules", "promtool-tests.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode != 0
    assert "GatewayErrorsHigh" in tested.stdout + tested.stderr


def test_the_rules_select_the_releases_namespace_unless_told_otherwise() -> None:
    for query in rule_queries():
        for selector in re.findall(r"\{([^}]*)\}", query):
            assert f'namespace="{NAMESPACE}"' in selector, query
    custom = rule_groups("--set", 'prometheusRule.seriesSelector=job="x"')
    for rule in (r for g in custom for r in g["rules"]):
        assert 'namespace="' not in rule["expr"] and 'job="x"' in rule["expr"], rule["expr"]


def test_the_dashboards_queries_parse(tmp_path: Path) -> None:
    tool = promtool()
    # Grafana's variables, as a query would run them.
    queries = [
        q.replace("$__rate_interval", "1m").replace("$namespace", NAMESPACE) for q in dashboard_queries()
    ]
    assert len(queries) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"q:{i}", "expr": q} for i, q in enumerate(queries)]}]}
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run([tool, "check", "rules", "dashboard-rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_chart_packages_the_dashboard_file_unchanged() -> None:
    assert dashboard() == json.loads((CHART / "files" / "dashboard.json").read_text())


if __name__ == "__main__":
    # `python test_chart_alerts.py metric-names`: one name a line (tests/tests/metrics.rs).
    if sys.argv[1:] == ["metric-names"]:
        print("\n".join(metric_names()))
    else:
        sys.exit("usage: test_chart_alerts.py metric-names")
