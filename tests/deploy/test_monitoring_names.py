"""Every metric the chart's alert rules and Grafana dashboard name is one the service exports (issue 36):
a real verification (the MiniLM Q8_0 conversion, gate 1, through the API, the local pool and the real
Job entrypoint) runs to its verdict, /metrics is scraped, and each name a rule's expression or a panel's
query uses must be among the scraped samples. A renamed metric, or a rule or panel with a typo, fails
here instead of staying silent in production."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import every_loop
from service.auth import Role
from tests.conftest import REPO, built, fixtures_root
from tests.deploy.test_alert_rules import alerts, rule_groups
from tests.service.conftest import LiveServer, add_token, settings_for, start_server

pytestmark = pytest.mark.slow
METRIC = re.compile(r"\bconvgate_[a-z0-9_]+\b")
DASHBOARD = REPO / "deploy" / "helm" / "convgate" / "dashboards" / "convgate.json"


@pytest.fixture
def server(sqlite_url, tmp_path) -> Iterator[LiveServer]:
    settings = settings_for(sqlite_url, tmp_path, file_roots=(fixtures_root(),), concurrency=1)
    yield from start_server(settings, loops=every_loop)


def verify_once(server: LiveServer, token: str) -> None:
    from engine.digests import sha256_file

    artifact = built("minilm", "minilm-Q6_K.gguf") / "minilm-Q8_0.gguf"
    body = {"source_uri": (artifact.parent / "source").as_uri(), "artifact_uri": artifact.as_uri(),
            "artifact_sha256": sha256_file(artifact), "gates": [1]}
    headers = server.headers(token)
    created = httpx.post(f"{server.url}/v1/verifications", json=body, headers=headers, timeout=30)
    assert created.status_code == 202, created.text
    url = f"{server.url}/v1/verifications/{created.json()['id']}"
    deadline = time.monotonic() + 300
    while (state := httpx.get(url, headers=headers, timeout=30).json()["state"]) not in ("completed", "failed"):
        assert time.monotonic() < deadline, f"still {state}"
        time.sleep(0.2)
    assert state == "completed"


def scraped(server: LiveServer) -> dict[str, float]:
    """Sample name -> the sum of its values over every label set."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def test_every_metric_the_rules_and_the_dashboard_use_is_exported_after_a_real_verification(server, sqlite_url):
    token = add_token(sqlite_url, Role.SUBMITTER)
    verify_once(server, token)
    samples = scraped(server)
    exported = set(samples)

    used_by_rules = {name: set(METRIC.findall(rule["expr"])) for name, rule in alerts(rule_groups()).items()}
    for alert, names in used_by_rules.items():
        assert names, alert
        assert names <= exported, f"{alert} uses metrics the service does not export: {sorted(names - exported)}"

    dashboard = json.loads(DASHBOARD.read_text())
    queries = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]
    queries.append(("namespace variable", dashboard["templating"]["list"][1]["query"]["query"]))
    for title, expr in queries:
        names = set(METRIC.findall(expr))
        assert names, f"panel {title!r} names no convgate metric: {expr}"
        missing = sorted(names - exported)
        assert not missing, f"panel {title!r} uses metrics the service does not export: {missing}"

    # what the verification itself moved
    assert samples["convgate_database_up"] == 1
    assert samples["convgate_attempts_started_total"] >= 1
    assert samples["convgate_verdicts_total"] >= 1
    assert samples["convgate_queue_oldest_waiting_seconds"] == 0  # nothing waits now
    assert math.isnan(samples["convgate_queue_oldest_expected_wait_seconds"])
    assert any(name == "convgate_http_request_duration_seconds_count" for name in exported)
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    routes = {(sample.labels["route"], sample.labels["method"], sample.labels["status"])
              for family in text_string_to_metric_families(text) for sample in family.samples
              if sample.name == "convgate_http_request_duration_seconds_count"}
    assert ("/v1/verifications/{verification_id}", "GET", "200") in routes, routes  # the template, never an id


def test_a_database_that_does_not_answer_is_counted_and_the_scrape_still_succeeds(tmp_path):
    """What ConvgateDatabaseUnavailable pages on: a Postgres that refuses connections (nothing listens on
    the port) makes requests 503 `database.unavailable`, counted in-process, and the scrape itself still
    answers, with `convgate_database_up 0` instead of the database's metrics."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app, no_loops
    from service.config import Settings

    refusing = "postgresql+psycopg://convgate:x@127.0.0.1:1/convgate?connect_timeout=2"
    app = create_app(Settings(database_url=refusing, cache_dir=tmp_path / "cache"), loops=no_loops)
    with TestClient(app) as client:
        answer = client.get("/v1/verifications", headers={"Authorization": "Bearer not-checked-before-the-database"})
        assert (answer.status_code, answer.json()["code"]) == (503, "database.unavailable")
        scrape = client.get("/metrics")
    assert scrape.status_code == 200
    samples = {sample.name: sample.value for family in text_string_to_metric_families(scrape.text)
               for sample in family.samples}
    assert samples["convgate_database_up"] == 0
    assert samples["convgate_database_unavailable_responses_total"] == 1
    assert "convgate_verifications" not in samples  # nothing made up for a database that did not answer
