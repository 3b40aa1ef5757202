"""The service reads the time from its session factory's clock (service/persistence/clock.py): what it
stores and every lease it compares follow that clock, so a test moves it instead of sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.lifecycle import State
from service.persistence import repository
from service.persistence.clock import ManualClock, as_utc
from service.persistence.db import make_engine, session_factory, transaction
from service.queue import snapshot
from tests.service.conftest import settings_for
from tests.service.test_lifecycle import REPORT, running, submitted

LEASE = timedelta(seconds=30)
START = datetime(2031, 5, 4, 12, tzinfo=UTC)


@pytest.fixture(params=["postgres", "sqlite"])
def clocked(request):
    url = request.getfixturevalue("pg" if request.param == "postgres" else "sqlite_url")
    engine = make_engine(url)
    clock = ManualClock(START)
    yield clock, session_factory(engine, clock)
    engine.dispose()


def test_what_is_stored_is_stamped_by_the_factorys_clock(clocked):
    clock, factory = clocked
    verification_id = submitted(factory)
    clock.advance(90)
    running(factory, verification_id)
    with transaction(factory) as session:
        stored = repository.get_verification(session, verification_id)
        assert stored is not None
        assert as_utc(stored.created_at) == START
        assert as_utc(stored.heartbeat_at or stored.updated_at) == START + timedelta(seconds=90)
        assert as_utc(repository.events(session, verification_id)[0].at) == START


def test_a_lease_runs_out_when_the_clock_says_so_not_the_wall(clocked):
    clock, factory = clocked
    verification_id = submitted(factory)
    running(factory, verification_id)
    clock.advance(LEASE.total_seconds() - 1)
    with transaction(factory) as session:
        assert repository.stale_attempts(session, LEASE) == []
    clock.advance(2)  # no sleep: the lease ran out by the clock the service reads
    with transaction(factory) as session:
        stale = repository.stale_attempts(session, LEASE)
        assert [(v.id, v.state) for v in stale] == [(verification_id, State.RUNNING)]


def test_a_waiting_verification_is_given_a_start_time_from_the_runs_before_it(clocked, tmp_path):
    """issue 25 item 4, on both databases: two runs of 60 s and 120 s (median 90 s) have finished, one has
    run 30 s, two wait; on Kubernetes one runs at once, so they start in 60 s and 150 s."""
    clock, factory = clocked
    for seconds in (60, 120):
        verification_id = submitted(factory)
        attempt = running(factory, verification_id)
        clock.advance(seconds)
        with transaction(factory) as session:
            assert repository.record_verdict(session, verification_id, attempt, REPORT, worker="w")
    busy = submitted(factory)
    running(factory, busy)
    clock.advance(30)
    first, second = submitted(factory), submitted(factory)
    settings = settings_for("sqlite://", tmp_path, dispatcher="kubernetes")
    with transaction(factory) as session:
        shown = snapshot(session, settings)
    starts = {item.id: item.estimated_start_seconds for item in shown.active}
    assert starts == {busy: None, first: 60.0, second: 150.0}
    assert shown.estimate is not None and (shown.estimate.runs, shown.estimate.median_run_seconds,
                                           shown.estimate.parallel) == (2, 90.0, 1)
    assert next(i for i in shown.active if i.id == first).estimated_start_at == clock.now() + timedelta(seconds=60)
    with transaction(factory) as session:  # the local pool's workers, however many run now
        pooled = snapshot(session, settings_for("sqlite://", tmp_path, dispatcher="local", concurrency=3))
    assert {item.id: item.estimated_start_seconds for item in pooled.active} == {busy: None, first: 0.0, second: 0.0}
