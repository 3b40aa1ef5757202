"""The chart runs `convgate serve` as issue 34 left it: the API processes per pod, the request deadlines,
the shutdown grace (and a pod grace the kubelet waits beyond it) and the callback workers reach the
server's settings and its command line; the schema refuses what the server would."""

from __future__ import annotations

import subprocess

from tests.deploy.test_deploy import CHART, chart_settings, helm, render


def test_server_values_reach_the_settings_and_the_command(monkeypatch):

    rendered = render("--set", "api.processes=2", "--set", "api.headerTimeoutSeconds=5",
                      "--set", "api.bodyTimeoutSeconds=20", "--set", "api.shutdownGraceSeconds=15",
                      "--set", "callbacks.workers=8")
    settings = chart_settings(rendered, monkeypatch)
    assert (settings.header_timeout_seconds, settings.body_timeout_seconds, settings.shutdown_grace_seconds,
            settings.callback_workers) == (5.0, 20.0, 15.0, 8)
    pod = next(doc for doc in rendered if doc["kind"] == "Deployment")["spec"]["template"]["spec"]
    (api,) = pod["containers"]
    assert api["args"][api["args"].index("--workers") + 1] == "2"
    assert pod["terminationGracePeriodSeconds"] == 15 + 20  # the server's grace, then its loops stop


def test_the_defaults_run_one_process_with_the_servers_own_defaults(monkeypatch):
    from service.config import Settings

    rendered = render()
    for key, value in next(doc for doc in rendered if doc["kind"] == "ConfigMap")["data"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CONVGATE_DATABASE_URL", "postgresql+psycopg://u@db/convgate")
    chart, server = Settings(), Settings.model_fields
    for name in ("header_timeout_seconds", "body_timeout_seconds", "shutdown_grace_seconds", "callback_workers"):
        assert getattr(chart, name) == server[name].default, name
    (api,) = next(doc for doc in rendered if doc["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    assert api["args"][-2:] == ["--workers", "1"]


def test_the_schema_refuses_what_the_server_would():
    for bad in (["--set", "api.processes=0"], ["--set", "api.headerTimeoutSeconds=0"],
                ["--set", "api.shutdownGraceSeconds=0"], ["--set", "callbacks.workers=0"]):
        result = subprocess.run([str(helm()), "template", "cg", str(CHART), *bad], capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode != 0 and "schema" in result.stderr.lower(), (bad, result.stderr)
