"""The repository's read side, on Postgres and SQLite: what the queue, the lists, the metrics and the
cluster view read back is exactly what the lifecycle wrote (filters, ordering, pagination, counts)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text, update

from service.lifecycle import Reason, State
from service.persistence import listing, repository, stats
from service.persistence.clock import SYSTEM_CLOCK, as_utc
from service.persistence.db import transaction
from service.persistence.models import Verification
from tests.service.seeding import seed
from tests.service.test_lifecycle import REPORT, claimed, factory, row, running, submitted
from tests.service.test_lifecycle import REQUEST as REQUEST_

__all__ = ["factory"]  # the two-database fixture, shared


def backdate(factory, verification_id: str, minutes: int) -> None:
    with transaction(factory) as session:
        session.execute(update(Verification).where(Verification.id == verification_id)
                        .values(created_at=SYSTEM_CLOCK.now() - timedelta(minutes=minutes)))


def test_claim_queued_takes_the_oldest_first_and_at_most_limit(factory):
    ids = [submitted(factory) for _ in range(3)]
    for minutes, verification_id in zip((5, 10, 1), ids, strict=True):
        backdate(factory, verification_id, minutes)
    with factory() as session:
        assert repository.oldest_queued(session).id == ids[1]
    with transaction(factory) as session:
        first = repository.claim_queued(session, 2, "d")
    assert [v.id for v in first] == [ids[1], ids[0]]
    assert [v.state for v in first] == [State.DISPATCHED] * 2
    with factory() as session:
        assert repository.oldest_queued(session).id == ids[2]
        assert stats.state_counts(session) == {"dispatched": 2, "queued": 1}
        assert [v.id for v in repository.active(session, limit=2)] == [ids[1], ids[0]]
    with transaction(factory) as session:
        assert [v.id for v in repository.claim_queued(session, 5, "d")] == [ids[2]]
    with factory() as session:
        assert repository.oldest_queued(session) is None


def test_list_filters_and_pages_newest_first(factory):
    ids = [submitted(factory) for _ in range(5)]
    for minutes, verification_id in enumerate(ids):
        backdate(factory, verification_id, 10 - minutes)  # ids[4] is the newest
    attempt = running(factory, ids[0])
    with transaction(factory) as session:
        assert repository.record_verdict(session, ids[0], attempt, REPORT | {"verdict": "NO-GO"}, worker="w")
        session.execute(update(Verification).where(Verification.id == ids[1]).values(
            source_uri="file:///other", artifact_sha256="b" * 64, submitted_by="bob"))
    middle = row(factory, ids[2]).created_at
    third = row(factory, ids[3])
    pages, cursor = [], None
    with factory() as session:  # (one session at a time: on SQLite it holds the write lock)
        while True:
            rows, cursor = listing.page(session, listing.ListFilters(), limit=2, cursor=cursor)
            pages.append([r.id for r in rows])
            if cursor is None:
                break
        assert pages == [[ids[4], ids[3]], [ids[2], ids[1]], [ids[0]]]

        def ids_for(**filters) -> list[str]:
            return [r.id for r in listing.page(session, listing.ListFilters(**filters),
                                                                limit=10)[0]]

        assert ids_for(verdict="NO-GO") == [ids[0]]
        assert ids_for(state="completed") == [ids[0]]
        assert ids_for(source_uri="file:///other") == [ids[1]]
        assert ids_for(artifact_sha256="b" * 64) == [ids[1]]
        assert ids_for(submitted_by="bob") == [ids[1]]
        assert ids_for(since=middle) == [ids[4], ids[3], ids[2]]
        assert ids_for(until=middle) == [ids[1], ids[0]]
        assert stats.verdict_counts(session) == {"NO-GO": 1}
        cursor = listing.encode_cursor(third)
        assert listing.decode_cursor(cursor) == (as_utc(third.created_at), ids[3])


def test_gate_durations_are_bucketed_in_sql(factory):
    for seconds in (0.4, 3.0, 50.0):
        verification_id = submitted(factory)
        attempt = running(factory, verification_id)
        report = REPORT | {"gates": {"storage": {"status": "passed", "seconds": seconds, "details": {}},
                                     "runtime": {"status": "passed", "seconds": 1.0}}}
        with transaction(factory) as session:
            assert repository.record_verdict(session, verification_id, attempt, report, worker="w")
    with factory() as session:
        histogram = stats.gate_duration_histogram(session, (0.5, 1.0, 5.0, 60.0))
    assert histogram == {"storage": ([1, 1, 2, 3], 3, pytest.approx(53.4)), "runtime": ([0, 3, 3, 3], 3, 3.0)}


def test_cluster_status_is_recorded_with_an_event_only_when_it_changes(factory):
    verification_id = submitted(factory)
    claimed(factory, verification_id)
    for status, position in (("pending admission", 3), ("pending admission", 1), ("admitted", None)):
        with transaction(factory) as session:
            repository.record_cluster_status(session, repository.get_verification(session, verification_id),
                                             status, position)
            assert repository.get_verification(session, verification_id).queue_position == position
    final = row(factory, verification_id)
    assert (final.cluster_status, final.queue_position) == ("admitted", None)
    with factory() as session:
        cluster = [(e.from_state, e.to_state, e.attempt, e.reason_code, e.message)
                   for e in repository.events(session, verification_id) if e.message.startswith("cluster:")]
    assert cluster == [("dispatched", "dispatched", 1, None, "cluster: pending admission"),
                       ("dispatched", "dispatched", 1, None, "cluster: admitted")]


def test_cluster_status_read_before_a_transition_is_not_written(factory):
    verification_id = submitted(factory)
    with factory() as reader:
        seen = repository.get_verification(reader, verification_id)  # queued
        reader.expunge(seen)  # a copy as read then
        reader.rollback()
        claimed(factory, verification_id)
        repository.record_cluster_status(reader, seen, "admitted", 0)
        reader.commit()
    assert row(factory, verification_id).cluster_status is None


def test_a_verification_whose_worker_can_never_start_fails_with_the_reason(factory):
    verification_id = submitted(factory)
    with transaction(factory) as session:
        assert repository.fail_unlaunchable(session, verification_id, "HTTP 403 forbidden", "refused 3 times")
    with transaction(factory) as session:  # terminal now: nothing more
        assert not repository.fail_unlaunchable(session, verification_id, "again", "again")
    final = row(factory, verification_id)
    assert (final.state, final.reason, final.reason_code) == (State.FAILED, "HTTP 403 forbidden",
                                                              Reason.DISPATCH_REFUSED)
    assert final.finished_at is not None
    with factory() as session:
        last = repository.events(session, verification_id)[-1]
    assert (last.from_state, last.to_state, last.message) == ("queued", "failed", "refused 3 times")


def test_verdict_rows_carry_the_evidence(factory):
    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    tensors = [{"gguf_name": "t", "gguf_type": "F32", "check": "bits", "max_abs": None, "rel_l2": None,
                "result": "pass"},
               {"gguf_name": "u", "gguf_type": "Q8_0", "check": "bound", "max_abs": 0.5, "rel_l2": 0.01,
                "result": "pass"}]
    report = REPORT | {"blockers": [{"code": "b.two"}, {"code": "a.one"}, {"code": "b.two"}],
                       "gates": {"storage": {"status": "passed", "seconds": 1.0, "details": {"tensors": tensors}}}}
    with transaction(factory) as session:
        assert repository.record_verdict(session, verification_id, attempt, report, worker="w")
    with factory() as session:
        verdict = repository.verdict_for(session, verification_id)
        assert (verdict.attempt, verdict.blocker_codes) == (attempt, ["a.one", "b.two"])
        rows = session.execute(text("SELECT gguf_name, gguf_type, check_kind, max_abs, rel_l2, result "
                                    "FROM tensor_rows ORDER BY gguf_name")).all()
        assert [tuple(r) for r in rows] == [("t", "F32", "bits", 0.0, -1.0, "pass"),
                                            ("u", "Q8_0", "bound", 0.5, 0.01, "pass")]
        digests = session.execute(text("SELECT uri, sha256, size FROM file_digests")).all()
        assert [tuple(d) for d in digests] == [("file:///m.gguf", "a" * 64, 3)]
        gates = session.execute(text("SELECT gate, status, seconds FROM gate_results")).all()
        assert [tuple(g) for g in gates] == [("storage", "passed", 1.0)]
    final = row(factory, verification_id)
    assert (final.verdict_result, final.progress, final.finished_at is not None) == ("GO",
                                                         None, True)


def test_same_moment_rows_are_ordered_by_id_and_paged_without_gaps(factory):
    ids = [submitted(factory) for _ in range(4)]
    moment = SYSTEM_CLOCK.now() - timedelta(minutes=1)
    with transaction(factory) as session:
        session.execute(update(Verification).where(Verification.id.in_(ids)).values(created_at=moment))
    seen, cursor = [], None
    with factory() as session:
        for _ in range(3):
            rows, cursor = listing.page(session, listing.ListFilters(), limit=2, cursor=cursor)
            seen.append([r.id for r in rows])
            if cursor is None:
                break
    assert seen == [sorted(ids, reverse=True)[:2], sorted(ids, reverse=True)[2:]]  # 4 rows, 2 pages, no third
    with transaction(factory) as session:
        assert [v.id for v in repository.claim_queued(session, 4, "d")] == sorted(ids)


def test_policy_origin_filters(factory):
    ids = [submitted(factory) for _ in range(3)]
    with transaction(factory) as session:
        for verification_id, origin in zip(ids, ("configured:default", "inline", "configured:strict"), strict=True):
            session.execute(update(Verification).where(Verification.id == verification_id)
                            .values(policy_origin=origin))
    with factory() as session:
        def ids_for(**filters) -> set[str]:
            return {r.id for r in listing.page(session, listing.ListFilters(**filters),
                                                                limit=10)[0]}

        assert ids_for(policy_origin="inline") == {ids[1]}
        assert ids_for(policy_origin="configured") == {ids[0], ids[2]}
        assert ids_for(policy="strict") == {ids[2]}
        assert ids_for(policy_origin="configured", policy="default") == {ids[0]}


def test_skip_locked_lets_a_second_dispatcher_take_other_work(request):
    """Postgres: a dispatcher's claim does not wait for rows another dispatcher is claiming."""
    from service.persistence.db import make_engine, session_factory

    engine = make_engine(request.getfixturevalue("pg"))
    factory = session_factory(engine)
    try:
        ids = [submitted(factory) for _ in range(2)]
        with factory() as first, factory() as second:
            assert [v.id for v in repository.claim_queued(first, 1, "d1")] == [ids[0]]  # not committed yet
            second.execute(text("SET LOCAL lock_timeout = '2s'"))
            assert [v.id for v in repository.claim_queued(second, 5, "d2")] == [ids[1]]
            second.commit()
            first.commit()
    finally:
        engine.dispose()


def test_cluster_status_touches_only_its_verification(factory):
    mine, other = submitted(factory), submitted(factory)
    with transaction(factory) as session:
        repository.record_cluster_status(session, repository.get_verification(session, mine), "admitted", 0)
    assert (row(factory, mine).cluster_status, row(factory, other).cluster_status) == ("admitted", None)


def test_idempotency_keys_and_utc(factory):
    from datetime import UTC, datetime

    with transaction(factory) as session:
        mine = seed(
            session, submitted_by="alice", idempotency_key="k", request_sha256="r" * 64,
            request={"source_uri": "file:///m", "artifact_uri": "file:///m.gguf", "artifact_sha256": "a" * 64},
            policy={}, policy_sha256="p" * 64, max_attempts=3).id
        seed(
            session, submitted_by="bob", idempotency_key="k2", request_sha256="r" * 64,
            request={"source_uri": "file:///m", "artifact_uri": "file:///m.gguf", "artifact_sha256": "a" * 64},
            policy={}, policy_sha256="p" * 64, max_attempts=3)
    with factory() as session:
        assert repository.by_idempotency_key(session, "alice", "k").id == mine
        assert repository.by_idempotency_key(session, "bob", "k") is None
        assert repository.by_idempotency_key(session, "alice", "k2") is None
    naive = datetime(2026, 1, 2, 3, 4, 5)
    assert as_utc(naive) == naive.replace(tzinfo=UTC) and as_utc(naive).tzinfo is UTC
    aware = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert as_utc(aware) is aware and as_utc(None) is None


def set_columns(factory, verification_id: str, **values) -> None:
    with transaction(factory) as session:
        session.execute(update(Verification).where(Verification.id == verification_id).values(**values))


def last_event(factory, verification_id: str) -> tuple:
    with factory() as session:
        e = repository.events(session, verification_id)[-1]
    return e.from_state, e.to_state, e.attempt, e.reason_code, e.message


def test_every_transition_writes_its_columns_and_its_event(factory):
    old = SYSTEM_CLOCK.now() - timedelta(hours=1)
    verification_id = submitted(factory)
    first = row(factory, verification_id)
    assert (first.request, first.attempt, first.failed_attempts) == (REQUEST_, 0, 0)
    assert last_event(factory, verification_id) == (None, "queued", 0, Reason.SUBMITTED, "submitted")

    set_columns(factory, verification_id, progress={"stale": True})
    with transaction(factory) as session:
        repository.claim(session, verification_id, "d")
    claimed_row = row(factory, verification_id)
    assert (claimed_row.worker, claimed_row.progress, claimed_row.attempt) == ("d", None, 1)
    assert as_utc(claimed_row.heartbeat_at) > old
    assert last_event(factory, verification_id) == ("queued", "dispatched", 1, Reason.DISPATCHED, "dispatched to d")

    set_columns(factory, verification_id, progress={"stale": True}, heartbeat_at=old)
    with transaction(factory) as session:
        repository.start_attempt(session, verification_id, "w", attempt=1)
    started = row(factory, verification_id)
    assert (started.worker, started.progress, started.started_at is not None) == ("w", None, True)
    assert as_utc(started.heartbeat_at) > old
    assert last_event(factory, verification_id) == ("dispatched", "running", 1, Reason.STARTED,
                                                    "attempt 1 started by w")

    set_columns(factory, verification_id, heartbeat_at=old)
    with transaction(factory) as session:
        assert repository.heartbeat(session, verification_id, 1, {"stage": "storage"}, worker="w")
        assert repository.end_attempt_without_verdict(session, verification_id, 1, Reason.WORKER_ERROR, "boom",
                                                      worker="someone-else") == State.RUNNING
    beat = row(factory, verification_id)
    assert (beat.progress, as_utc(beat.heartbeat_at) > old) == ({"stage": "storage"}, True)
    with transaction(factory) as session:
        assert repository.end_attempt_without_verdict(session, verification_id, 1, Reason.WORKER_ERROR, "boom",
                                                      worker="w") == State.QUEUED
    retried = row(factory, verification_id)
    assert (retried.progress, retried.finished_at, retried.reason, retried.reason_code) == (
        None, None, "boom", Reason.WORKER_ERROR)
    assert last_event(factory, verification_id) == ("running", "queued", 1, Reason.WORKER_ERROR,
                                                    "attempt 1 failed: boom; retrying")

    attempt = running(factory, verification_id, "w2")
    report = {"verdict": "GO", "blockers": [], "files": [], "gates": {"storage": {"status": "passed", "seconds": 2.0}}}
    with transaction(factory) as session:
        assert repository.heartbeat(session, verification_id, attempt, {"stage": "x"}, worker="w2")
        assert repository.record_verdict(session, verification_id, attempt, report, worker="w2")
    done = row(factory, verification_id)
    assert (done.state, done.progress, done.verdict_result, done.finished_at is not None) == (
        State.COMPLETED, None, "GO", True)
    assert last_event(factory, verification_id) == ("running", "completed", 2, Reason.VERDICT, "verdict GO (attempt 2)")
    with factory() as session:
        assert repository.verdict_for(session, verification_id).report == report



def test_the_last_failure_and_a_cancel_write_their_columns(factory):
    last_chance = submitted(factory, max_attempts=1)
    attempt = running(factory, last_chance)
    with transaction(factory) as session:
        assert repository.end_attempt_without_verdict(session, last_chance, attempt, Reason.WORKER_EXITED,
                                                      "exit 1") == State.FAILED
    assert row(factory, last_chance).finished_at is not None
    assert last_event(factory, last_chance) == ("running", "failed", 1, Reason.WORKER_EXITED,
                                                "attempt 1 failed: exit 1; no attempts left")

    cancelled = submitted(factory)
    attempt = running(factory, cancelled)
    with transaction(factory) as session:
        assert repository.heartbeat(session, cancelled, attempt, {"stage": "x"}, worker="w")
        repository.cancel(session, cancelled, "olga")
    final = row(factory, cancelled)
    assert (final.progress, final.reason, final.reason_code, final.finished_at is not None) == (
        None, "cancelled by olga", Reason.CANCELLED, True)


def test_stale_means_in_flight_with_an_old_heartbeat(factory):
    old = SYSTEM_CLOCK.now() - timedelta(hours=1)
    queued, flying = submitted(factory), submitted(factory)
    running(factory, flying)
    set_columns(factory, queued, updated_at=old)
    set_columns(factory, flying, heartbeat_at=old)  # updated_at is recent: the heartbeat is what counts
    with factory() as session:
        assert [v.id for v in repository.stale_attempts(session, timedelta(minutes=5))] == [flying]
    with transaction(factory) as session:
        assert repository.end_attempt_without_verdict(session, flying, 1, Reason.HEARTBEAT_LOST, "lost",
                                                      lease=timedelta(minutes=5)) == State.QUEUED


def test_a_transition_retries_from_where_another_writer_moved_it(factory, monkeypatch):
    verification_id = submitted(factory)
    real, calls = repository._state, []

    def stale_first(session, ident):
        calls.append(ident)
        return State.RUNNING if len(calls) == 1 else real(session, ident)

    monkeypatch.setattr(repository, "_state", stale_first)
    with transaction(factory) as session:
        assert repository.cancel(session, verification_id, "olga").state == State.CANCELLED
    assert calls == [verification_id, verification_id]
    assert last_event(factory, verification_id)[:2] == ("queued", "cancelled")


def test_guards_need_their_values():
    from service.lifecycle import Action

    for action, fence, guard in ((Action.START, repository.Fence(), "attempt"),
                                 (Action.HEARTBEAT, repository.Fence(attempt=1), "worker"),
                                 (Action.EXPIRED_RETRY, repository.Fence(attempt=1), "lease_expired")):
        with pytest.raises(ValueError, match=f"^the {guard} guard needs a value$"):
            repository._apply(None, action, "x", fence=fence)


def test_a_later_page_is_an_index_range_on_postgres_not_a_rescan(pg):
    """The keyset condition bounds `created_at` in the index, so page 10,000 of the auditor list costs what
    page 1 does. The OR form alone (`created_at < x OR (created_at = x AND id < y)`) is only a Filter on
    Postgres: the backward index scan walks every newer row before the page starts."""
    from sqlalchemy import event

    from service.persistence.db import make_engine, session_factory

    engine = make_engine(pg)
    pages = session_factory(engine)
    ids = [submitted(pages) for _ in range(3)]
    statements: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "ORDER BY verifications.created_at DESC" in statement:
            statements.append((statement, parameters))

    with pages() as session:
        first, cursor = listing.page(session, listing.ListFilters(), limit=1)
        event.listen(engine, "before_cursor_execute", capture)
        second, _ = listing.page(session, listing.ListFilters(), limit=1, cursor=cursor)
        event.remove(engine, "before_cursor_execute", capture)
    assert {first[0].id, second[0].id} <= set(ids) and first[0].id != second[0].id
    (statement, parameters), = statements
    with engine.connect() as connection:
        connection.exec_driver_sql("SET enable_seqscan = off")
        plan = "\n".join(line for line, in connection.exec_driver_sql("EXPLAIN " + statement, parameters))
    engine.dispose()
    index_conditions = [line for line in plan.splitlines() if "Index Cond" in line]
    assert any("created_at <=" in line for line in index_conditions), plan
