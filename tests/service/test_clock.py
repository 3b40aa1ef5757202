"""The service reads the time from its session factory's clock (service/persistence/clock.py): what it
stores and every lease it compares follow that clock, so a test moves it instead of sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.lifecycle import State
from service.persistence import repository
from service.persistence.clock import ManualClock, as_utc
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.test_lifecycle import running, submitted

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
