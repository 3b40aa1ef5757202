"""The chart's monitoring (issue 36): the PrometheusRule's alerts unit-tested by the real promtool
(`promtool check rules` and `promtool test rules` on tests/deploy/alerts/, against the rules as the chart
renders them), each alert with series that fire it and series that must leave it silent and a runbook
in docs/operations.md; the ServiceMonitor and the dashboard off by default and wired to the API Service.
That every metric the rules and the dashboard name is exported is tests/deploy/test_monitoring_names.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.deploy.test_deploy import render

ALERTS = REPO / "tests" / "deploy" / "alerts"
OPERATIONS = REPO / "docs" / "operations.md"
MONITORING = ("--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
              "--set", "metrics.dashboard.enabled=true")


def promtool() -> Path:
    """scripts/build_promtool.py's binary (built with the cluster's binaries by scripts/build_kube.py)."""
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "build_promtool.py"), "--print"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(out.strip().splitlines()[-1])
    if not path.exists():
        pytest.skip(f"promtool is not built: python3 scripts/build_promtool.py ({path})")
    return path


def rule_groups(*values: str) -> dict[str, Any]:
    (rule,) = [doc for doc in render(*MONITORING, *values) if doc["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    return {"groups": rule["spec"]["groups"]}


def alerts(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups["groups"] for rule in group["rules"] if "alert" in rule}


def run_promtool(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)


def test_monitoring_is_off_by_default():
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in render()}
    assert not {kind for kind, _ in kinds} & {"PrometheusRule", "ServiceMonitor"}
    assert ("ConfigMap", "cg-dashboard") not in kinds


def test_promtool_unit_tests_pass_against_the_rendered_rules(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    for test in ALERTS.glob("*.test.yaml"):
        shutil.copy(test, tmp_path / test.name)
    checked = run_promtool(tmp_path, "check", "rules", "rules.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = run_promtool(tmp_path, "test", "rules", *sorted(p.name for p in ALERTS.glob("*.test.yaml")))
    print(tested.stdout)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_promtool_catches_a_broken_threshold(tmp_path):
    """The unit tests would notice: with the stalled-queue threshold at 45 minutes its page never fires."""
    broken = rule_groups("--set", "metrics.prometheusRule.stalledMinutes=45")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(broken))
    shutil.copy(ALERTS / "convgate.test.yaml", tmp_path / "convgate.test.yaml")
    tested = run_promtool(tmp_path, "test", "rules", "convgate.test.yaml")
    assert tested.returncode != 0
    assert "ConvgateQueueStalled" in tested.stdout + tested.stderr


def test_every_alert_has_a_firing_and_a_silent_test_and_a_runbook():
    rules = alerts(rule_groups())
    assert set(rules) == {"ConvgateQueueStalled", "ConvgateWaitOverEstimate", "ConvgateAttemptsFailing",
                          "ConvgateInternalNoGo", "ConvgateCallbacksFailing", "ConvgateDatabaseUnavailable"}
    fired: set[str] = set()
    silent: set[str] = set()
    for path in ALERTS.glob("*.test.yaml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    assert fired == set(rules) and silent == set(rules)
    anchors = {_anchor(line) for line in OPERATIONS.read_text().splitlines() if line.startswith("#")}
    for name, rule in rules.items():
        assert rule["labels"]["severity"] == "page", name
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("docs/operations.md#") and url.split("#", 1)[1] in anchors, (name, url)


def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to dashes."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def test_the_service_monitor_scrapes_the_api_service():
    docs = render(*MONITORING, "--set", "metrics.serviceMonitor.labels.release=prometheus")
    (monitor,) = [doc for doc in docs if doc["kind"] == "ServiceMonitor"]
    (service,) = [doc for doc in docs if doc["kind"] == "Service"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert "authorization" not in endpoint  # metrics.public defaults to true
    private = render(*MONITORING, "--set", "metrics.serviceMonitor.bearerTokenSecret.name=ops-token")
    (monitor,) = [doc for doc in private if doc["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {"name": "ops-token", "key": "token"}


def test_the_dashboard_ships_in_a_configmap_for_grafana():
    (config,) = [doc for doc in render(*MONITORING) if doc["kind"] == "ConfigMap"
                 and doc["metadata"]["name"] == "cg-dashboard"]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["convgate.json"])
    assert dashboard == json.loads((REPO / "deploy" / "helm" / "convgate" / "dashboards" / "convgate.json").read_text())
    titles = [panel["title"] for panel in dashboard["panels"]]
    for wanted in ("Queue depth", "Oldest waiting", "Admissions", "Verdicts by result", "blocker family",
                   "Attempt failures by reason", "Gate durations", "API latency"):
        assert any(wanted in title for title in titles), wanted
