"""Genuine races, two connections at once, on Postgres and SQLite: cancel against a verdict, two
starts of one attempt, two takeovers of one attempt, an ending against a verdict. Both writers are
held at a barrier just before their conditional UPDATE, so each round really interleaves; exactly
one must win every time (or, for takeovers, each must replace the owner of its moment).
Plus SQLite's own fence: a transaction holds the write lock from its first statement."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from service.lifecycle import Reason, State
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.test_lifecycle import REPORT, claimed, running, submitted

ROUNDS = 8


@pytest.fixture(params=["postgres", "sqlite"])
def engine(request):
    url = request.getfixturevalue("pg" if request.param == "postgres" else "sqlite_url")
    engine = make_engine(url)
    yield engine
    engine.dispose()


def race(engine, first: Callable[[Any], Any], second: Callable[[Any], Any]) -> list[Any]:
    """Run both in their own transactions; on Postgres, both wait at a barrier before their UPDATE."""
    factory = session_factory(engine)
    barrier = threading.Barrier(2, timeout=5)
    local = threading.local()

    def before_update(_conn, _cursor, statement: str, *_args) -> None:
        if statement.lstrip().upper().startswith("UPDATE VERIFICATIONS") and not getattr(local, "passed", False):
            local.passed = True
            if engine.dialect.name == "postgresql":  # SQLite serialises whole transactions: no barrier inside
                barrier.wait()

    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def run(index: int, work: Callable[[Any], Any]) -> None:
        try:
            if engine.dialect.name == "sqlite":
                barrier.wait()
            with transaction(factory) as session:
                results[index] = work(session)
        except BaseException as exc:
            errors.append(exc)

    event.listen(engine, "before_cursor_execute", before_update)
    try:
        threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate((first, second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        event.remove(engine, "before_cursor_execute", before_update)
    assert not errors, errors
    return results


def test_cancel_against_verdict_has_one_winner(engine):
    factory = session_factory(engine)
    outcomes = set()
    for _ in range(ROUNDS):
        verification_id = submitted(factory)
        attempt = running(factory, verification_id)
        cancelled, written = race(
            engine, lambda s, v=verification_id: repository.cancel(s, v, "olga").state,
            lambda s, v=verification_id, a=attempt: repository.record_verdict(s, v, a, REPORT, worker="w"))
        with factory() as session:
            final = repository.get_verification(session, verification_id)
            verdict = repository.verdict_for(session, verification_id)
        if written:
            assert (final.state, cancelled, verdict.verdict) == (State.COMPLETED, State.COMPLETED, "GO")
        else:
            assert (final.state, cancelled, verdict) == (State.CANCELLED, State.CANCELLED, None)
        outcomes.add(final.state)
    assert outcomes <= {State.COMPLETED, State.CANCELLED}


def test_two_starts_of_one_attempt_leave_one_owner(engine):
    """Two pods of one attempt at once (a Job never runs them together, but the fence must not rely on
    that): one starts the attempt, the other then takes it over; only the last one can still write."""
    factory = session_factory(engine)
    for _ in range(ROUNDS):
        verification_id = submitted(factory)
        attempt = claimed(factory, verification_id)
        results = race(engine,
                       lambda s, v=verification_id, a=attempt: repository.start_attempt(s, v, "pod-a", attempt=a),
                       lambda s, v=verification_id, a=attempt: repository.start_attempt(s, v, "pod-b", attempt=a))
        assert all(r is not None for r in results), results
        with factory() as session:
            final = repository.get_verification(session, verification_id)
            to_running = [e.reason_code for e in repository.events(session, verification_id)
                          if e.to_state == State.RUNNING]
        assert (final.state, final.failed_attempts, to_running) == (
            State.RUNNING, 0, [Reason.STARTED, Reason.TAKEN_OVER])
        (replaced,) = {"pod-a", "pod-b"} - {final.worker}
        with transaction(factory) as session:
            assert not repository.heartbeat(session, verification_id, attempt, None, worker=replaced)
            assert repository.heartbeat(session, verification_id, attempt, None, worker=final.worker)


def test_two_takeovers_of_one_running_attempt_never_lose_an_owner(engine):
    """Each takeover names the worker it replaces in its UPDATE, so concurrent replacements of one pod
    chain: each one replaced the owner of its moment (two that read the same owner: only one wins)."""
    factory = session_factory(engine)
    for _ in range(ROUNDS):
        verification_id = submitted(factory)
        attempt = running(factory, verification_id, "pod-a")
        results = race(engine,
                       lambda s, v=verification_id, a=attempt: repository.start_attempt(s, v, "pod-b", attempt=a),
                       lambda s, v=verification_id, a=attempt: repository.start_attempt(s, v, "pod-c", attempt=a))
        winners = {r.worker for r in results if r is not None}
        with factory() as session:
            final = repository.get_verification(session, verification_id)
            takeovers = [e.message for e in repository.events(session, verification_id)
                         if e.reason_code == Reason.TAKEN_OVER]
        owners = ["pod-a"]
        for message in takeovers:
            new, old = message.removeprefix(f"attempt {attempt} taken over by ").split(" from ")
            assert old == owners[-1], takeovers
            owners.append(new)
        assert winners == set(owners[1:]) and len(owners) == len(set(owners)) >= 2, (winners, takeovers)
        assert (final.state, final.worker, final.failed_attempts) == (State.RUNNING, owners[-1], 0)


def test_ending_against_verdict_has_one_winner(engine):
    factory = session_factory(engine)
    for _ in range(ROUNDS):
        verification_id = submitted(factory)
        attempt = running(factory, verification_id)
        ended, written = race(
            engine,
            lambda s, v=verification_id, a=attempt: repository.end_attempt_without_verdict(
                s, v, a, Reason.WORKER_EXITED, "exit 1"),
            lambda s, v=verification_id, a=attempt: repository.record_verdict(s, v, a, REPORT, worker="w"))
        with factory() as session:
            final = repository.get_verification(session, verification_id)
            verdicts = session.scalar(text("SELECT count(*) FROM verdicts WHERE verification_id = :v"),
                                      {"v": verification_id})
        assert (final.state, verdicts, final.failed_attempts) == (
            (State.COMPLETED, 1, 0) if written else (State.QUEUED, 0, 1)), ended


def test_sqlite_transactions_take_the_write_lock_before_they_read(sqlite_url):
    """pysqlite alone starts no transaction before a SELECT: check-then-act would be unfenced."""
    engine = make_engine(sqlite_url)
    impatient = make_engine(sqlite_url, busy_timeout_seconds=0.2)
    factory = session_factory(engine)
    verification_id = submitted(factory)
    try:
        with factory() as holder:
            assert repository.get_verification(holder, verification_id).state == State.QUEUED  # reads only
            with pytest.raises(OperationalError, match="database is locked"), \
                    transaction(session_factory(impatient)) as other:
                repository.claim(other, verification_id, "dispatcher")
            holder.rollback()
        with transaction(session_factory(impatient)) as other:  # released: the write goes through
            assert repository.claim(other, verification_id, "dispatcher") is not None
    finally:
        impatient.dispose()
        engine.dispose()
