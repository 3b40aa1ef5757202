"""The dispatch loop and the worker's heartbeat against the lifecycle's fences, with a dispatcher
double: `active` is taken after `sync`, a worker exit ends only its own attempt, an exit that could not
be recorded is not lost, and a worker that cannot heartbeat for a lease stops itself."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy.exc import OperationalError

from service.config import Settings
from service.dispatch.base import WorkerExit
from service.dispatch.loop import DispatchLoop
from service.job import AttemptSupersededError, Heartbeat
from service.lifecycle import Reason, State
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.worker_channel import DirectChannel
from tests.service.test_lifecycle import age_heartbeat, row, running, submitted


class FakeDispatcher:
    """Knows its workers only after `sync` (like a restarted Kubernetes dispatcher)."""

    name = "fake"
    identity = "fake:1"

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.synced: set[str] = set()
        self.exits: list[WorkerExit] = []
        self.launched: list[tuple[str, int]] = []
        self.cancelled: list[str] = []

    def capacity(self) -> int:
        return 10

    def launch(self, verification_id: str, attempt: int, attempt_secret: str | None = None,
               shards: int = 1) -> None:
        self.launched.append((verification_id, attempt))
        self.known.add(verification_id)

    def reap(self) -> list[WorkerExit]:
        exits, self.exits = self.exits, []
        return exits

    def active(self) -> set[str]:
        return set(self.synced)

    def cancel(self, verification_id: str) -> None:
        self.cancelled.append(verification_id)

    def owns_dead(self, worker: str | None) -> bool:
        return False

    def sync(self, session) -> None:
        self.synced = set(self.known)

    def shutdown(self) -> None:
        """Nothing to stop."""


@pytest.fixture(params=["postgres", "sqlite"])
def setup(request, tmp_path):
    url = request.getfixturevalue("pg" if request.param == "postgres" else "sqlite_url")
    engine = make_engine(url)
    settings = Settings(database_url=url, cache_dir=tmp_path / "c", lease_seconds=30)
    yield settings, session_factory(engine)
    engine.dispose()


def test_restarted_dispatcher_computes_active_after_sync(setup):
    settings, factory = setup
    verification_id = submitted(factory)
    first = DispatchLoop(FakeDispatcher(), factory, settings)
    first.tick()
    assert first.dispatcher.launched == [(verification_id, 1)]
    age_heartbeat(factory, verification_id, timedelta(minutes=5))  # waited in the cluster's queue
    restarted = FakeDispatcher()
    restarted.known = {verification_id}  # the cluster still has its Job; only sync() tells
    DispatchLoop(restarted, factory, settings).tick()
    final = row(factory, verification_id)
    assert (final.state, final.attempt, final.failed_attempts) == (State.DISPATCHED, 1, 0)
    assert restarted.launched == []


def test_a_stale_worker_exit_does_not_end_the_current_attempt(setup):
    settings, factory = setup
    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    dispatcher = FakeDispatcher()
    dispatcher.known = {verification_id}
    loop = DispatchLoop(dispatcher, factory, settings)
    dispatcher.exits = [WorkerExit(verification_id, attempt - 1, "exit code 1", clean=False)]
    loop.tick()
    assert row(factory, verification_id).state == State.RUNNING
    dispatcher.exits = [WorkerExit(verification_id, attempt, "killed by signal 9", clean=False)]
    loop.tick()
    final = row(factory, verification_id)
    assert (final.state, final.failed_attempts, final.reason_code) == (State.DISPATCHED, 1, Reason.WORKER_EXITED)
    assert "killed by signal 9" in final.reason and final.attempt == attempt + 1  # retried at once


def test_an_exit_that_could_not_be_recorded_is_kept_for_the_next_tick(setup, monkeypatch):
    settings, factory = setup
    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    dispatcher = FakeDispatcher()
    loop = DispatchLoop(dispatcher, factory, settings)
    dispatcher.exits = [WorkerExit(verification_id, attempt, "exit code 1", clean=False)]
    real = repository.end_attempt_without_verdict

    def locked(*args, **kwargs):
        raise OperationalError("UPDATE", {}, Exception("database is locked"))

    monkeypatch.setattr(repository, "end_attempt_without_verdict", locked)
    with pytest.raises(OperationalError):
        loop.tick()
    monkeypatch.setattr(repository, "end_attempt_without_verdict", real)
    loop.tick()
    final = row(factory, verification_id)
    assert (final.failed_attempts, final.reason_code) == (1, Reason.WORKER_EXITED)


def test_the_loop_cancels_the_worker_of_a_cancelled_verification(setup):
    settings, factory = setup
    verification_id = submitted(factory)
    dispatcher = FakeDispatcher()
    loop = DispatchLoop(dispatcher, factory, settings)
    loop.tick()
    with transaction(factory) as session:
        repository.cancel(session, verification_id, "olga")
    loop.tick()
    assert dispatcher.cancelled == [verification_id]


# --- the worker's heartbeat ------------------------------------------------------------------------

class FlakyFactory:
    """Sessions whose first `failures` heartbeats fail with SQLite's lock error."""

    def __init__(self, factory, failures: int) -> None:
        self.factory, self.failures, self.calls = factory, failures, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise OperationalError("UPDATE verifications", {}, Exception("database is locked"))
        return self.factory()


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_heartbeat_retries_lock_errors_and_keeps_the_attempt(setup):
    _, factory = setup
    verification_id = submitted(factory)
    attempt = running(factory, verification_id, "w")
    flaky = FlakyFactory(factory, failures=3)
    with Heartbeat(DirectChannel(flaky, verification_id, attempt, "w"), verification_id, attempt, "w",
                   interval=0.05, lease=30.0) as heart:
        heart.update("storage", 1, 2)
        wait_for(lambda: flaky.calls >= 5)
        heart.update("storage", 2, 2)  # still ours: no exception
        calls = flaky.calls
        wait_for(lambda: flaky.calls >= calls + 2)  # one whole beat after the update
        assert not heart.lost.is_set() and not heart.superseded.is_set()
    assert row(factory, verification_id).progress == {"stage": "storage", "done": 2, "total": 2}


def test_a_worker_that_cannot_heartbeat_for_a_lease_stops_itself(setup):
    _, factory = setup
    verification_id = submitted(factory)
    attempt = running(factory, verification_id, "w")
    flaky = FlakyFactory(factory, failures=10**6)
    with Heartbeat(DirectChannel(flaky, verification_id, attempt, "w"), verification_id, attempt, "w",
                   interval=0.05, lease=0.3) as heart:
        heart.update("storage", 1, 2)
        wait_for(heart.lost.is_set)
        with pytest.raises(AttemptSupersededError, match="lease"):
            heart.update("storage", 2, 2)


def test_a_superseded_worker_stops(setup):
    _, factory = setup
    verification_id = submitted(factory)
    attempt = running(factory, verification_id, "w")
    with transaction(factory) as session:
        repository.cancel(session, verification_id, "olga")
    with Heartbeat(DirectChannel(factory, verification_id, attempt, "w"), verification_id, attempt, "w",
                   interval=0.05, lease=30.0) as heart:
        heart.update("storage", 1, 2)
        wait_for(heart.superseded.is_set)
        with pytest.raises(AttemptSupersededError, match="superseded"):
            heart.update("storage", 2, 2)
