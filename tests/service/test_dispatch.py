"""The local worker pool runs the real Job entrypoint on real models: verdicts land once, a worker
killed with SIGKILL is retried, queued and orphaned work survives a restart, cancel stops a run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable

import pytest
from sqlalchemy import text

from service.config import Settings
from service.dispatch.loop import DispatchLoop
from service.lifecycle import State
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from service.schemas import SubmitRequest
from service.verifications import admit, cancel, submit
from tests.conftest import built, fixtures_root
from tests.service.conftest import settings_for

pytestmark = pytest.mark.slow
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Platform teams gate every model before it ships."]


@pytest.fixture
def minilm_request() -> SubmitRequest:
    root = built("minilm", "minilm-Q6_K.gguf")
    artifact = root / "minilm-F32.gguf"
    from engine.digests import sha256_file

    return SubmitRequest(source_uri=(root / "source").as_uri(), artifact_uri=artifact.as_uri(),
                         artifact_sha256=sha256_file(artifact), texts=TEXTS)


class Harness:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = make_engine(settings.database_url)
        self.factory = session_factory(self.engine)
        self.loop = DispatchLoop.for_settings(settings, self.factory)

    def submit(self, request: SubmitRequest, key: str | None = None) -> str:
        with transaction(self.factory) as session:
            return submit(session, self.settings, "alice", admit(self.settings, request), key)[0].id

    def state(self, verification_id: str):
        with self.factory() as session:
            return repository.get_verification(session, verification_id)

    def tick_until(self, condition: Callable[[], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the dispatcher")
            self.loop.tick()
            time.sleep(0.1)

    def verdict_rows(self) -> int:
        with self.engine.connect() as connection:
            return connection.execute(text("SELECT count(*) FROM verdicts")).scalar()

    def events(self, verification_id: str) -> list[str]:
        with self.factory() as session:
            return [f"{e.to_state}: {e.message}" for e in repository.events(session, verification_id)]

    def close(self) -> None:
        self.loop.dispatcher.shutdown()
        self.engine.dispose()


@pytest.fixture
def sqlite_harness(sqlite_url, tmp_path):
    harness = Harness(settings_for(sqlite_url, tmp_path, lease_seconds=30, file_roots=(fixtures_root(),)))
    yield harness
    harness.close()


@pytest.fixture
def pg_harness(pg, tmp_path):
    harness = Harness(settings_for(pg, tmp_path, lease_seconds=30, file_roots=(fixtures_root(),)))
    yield harness
    harness.close()


def test_local_pool_runs_a_real_verification_to_one_verdict(sqlite_harness, minilm_request):
    harness = sqlite_harness
    verification_id = harness.submit(minilm_request)
    harness.tick_until(lambda: harness.state(verification_id).state == State.COMPLETED)
    final = harness.state(verification_id)
    assert (final.verdict_result, final.attempt) == ("GO", 1)
    assert [e.split(":")[0] for e in harness.events(verification_id)] == ["queued", "dispatched", "running",
                                                                          "completed"]
    assert harness.verdict_rows() == 1


def test_worker_killed_midway_is_retried_and_one_verdict_is_written(pg_harness, minilm_request):
    harness = pg_harness
    verification_id = harness.submit(minilm_request)
    harness.tick_until(lambda: harness.state(verification_id).state == State.RUNNING)
    process = harness.loop.dispatcher.processes[verification_id]
    os.killpg(process.pid, signal.SIGKILL)
    harness.tick_until(lambda: harness.state(verification_id).state == State.COMPLETED)
    final = harness.state(verification_id)
    assert (final.verdict_result, final.attempt) == ("GO", 2)
    events = harness.events(verification_id)
    assert any("killed by signal 9" in event and event.startswith("queued") for event in events)
    assert harness.verdict_rows() == 1


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_queued_and_orphaned_work_survive_a_restart(pg_harness, minilm_request):
    harness = pg_harness
    queued = harness.submit(minilm_request, key="queued")
    orphan = harness.submit(minilm_request.model_copy(update={"gates": [1]}), key="orphan")
    with transaction(harness.factory) as session:  # a previous server's worker was running it when it died
        pool = f"local:{socket.gethostname()}:{dead_pid()}"
        attempt = repository.claim(session, orphan, pool).attempt
        repository.start_attempt(session, orphan, f"{pool}/x", attempt=attempt)
    harness.loop.tick()
    assert "its dispatcher restarted" in (harness.state(orphan).reason or "")
    harness.tick_until(lambda: all(harness.state(v).state == State.COMPLETED for v in (queued, orphan)))
    assert harness.state(orphan).attempt == 2
    assert harness.verdict_rows() == 2


def test_cancel_stops_a_running_worker_and_no_verdict_is_written(sqlite_harness, minilm_request):
    harness = sqlite_harness
    verification_id = harness.submit(minilm_request)
    harness.tick_until(lambda: harness.state(verification_id).state == State.RUNNING)
    process = harness.loop.dispatcher.processes[verification_id]
    with transaction(harness.factory) as session:
        cancel(session, repository.get_verification(session, verification_id), "olga")
    harness.tick_until(lambda: process.poll() is not None, timeout=60)
    harness.loop.tick()
    assert harness.state(verification_id).state == State.CANCELLED
    assert harness.verdict_rows() == 0


def test_concurrency_limit_is_respected(sqlite_harness, minilm_request):
    harness = sqlite_harness
    first = harness.submit(minilm_request.model_copy(update={"gates": [1]}), key="a")
    second = harness.submit(minilm_request.model_copy(update={"gates": [1]}), key="b")
    harness.loop.tick()
    states = {harness.state(first).state, harness.state(second).state}
    assert states in ({State.DISPATCHED, State.QUEUED}, {State.RUNNING, State.QUEUED})
    harness.tick_until(lambda: {harness.state(v).state for v in (first, second)} == {State.COMPLETED})


def test_the_worker_fetches_the_importance_matrix_and_checks_its_digest(sqlite_harness, minilm_request):
    """`convgate worker run` fetches imatrix_uri like the artifact: a digest other than the submitted one is
    refused unread; with the right digest the file reaches our reader (config.json is no imatrix)."""
    harness = sqlite_harness
    not_an_imatrix = fixtures_root() / "minilm" / "source" / "config.json"
    from engine.digests import sha256_file

    base = minilm_request.model_copy(update={"gates": [1], "imatrix_uri": not_an_imatrix.as_uri()})
    wrong = harness.submit(base.model_copy(update={"imatrix_sha256": "0" * 64}), key="wrong")
    right = harness.submit(base.model_copy(update={"imatrix_sha256": sha256_file(not_an_imatrix)}), key="right")
    harness.tick_until(lambda: {harness.state(v).state for v in (wrong, right)} == {State.COMPLETED})
    with harness.factory() as session:
        found = {v: repository.verdict_for(session, v) for v in (wrong, right)}
    assert found[wrong] is not None and list(found[wrong].blocker_codes) == ["imatrix.sha256_mismatch"]
    assert found[right] is not None and list(found[right].blocker_codes) == ["imatrix.malformed"]
    assert {harness.state(v).verdict_result for v in (wrong, right)} == {"NO-GO"}
