"""The embedded default's local pool runs `concurrency` workers on one machine: each gets its share of
the CPU budget, never the whole (two workers each starting a thread per CPU oversubscribe them)."""

from __future__ import annotations

import pytest

from engine.resources import cpu_budget
from service.dispatch.local import worker_environment
from tests.service.conftest import settings_for


@pytest.mark.parametrize("concurrency", [1, 2, 64])
def test_each_local_worker_gets_its_share_of_the_cpus(tmp_path, monkeypatch, concurrency):
    monkeypatch.delenv("CONVGATE_THREADS", raising=False)
    env = worker_environment(settings_for("sqlite:///unused.db", tmp_path, concurrency=concurrency))
    assert env["CONVGATE_THREADS"] == str(max(1, cpu_budget() // concurrency))


def test_an_operator_setting_is_passed_on_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGATE_THREADS", "3")
    env = worker_environment(settings_for("sqlite:///unused.db", tmp_path, concurrency=2))
    assert env["CONVGATE_THREADS"] == "3"
