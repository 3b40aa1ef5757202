"""The lifecycle's fences, on Postgres and SQLite: a worker claims exactly the attempt it was
launched for, every state change is a conditional write that a stale writer loses, cancel never
overwrites a verdict, attempts are bounded by max_attempts, and every transition leaves its event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text, update

from service.lifecycle import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    Action,
    Guard,
    IllegalTransitionError,
    Reason,
    State,
    successors,
)
from service.lifecycle import check_transition as check
from service.persistence import repository
from service.persistence.clock import SYSTEM_CLOCK
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.models import Verification
from tests.service.seeding import seed

REQUEST = {"source_uri": "file:///m", "artifact_uri": "file:///m.gguf", "artifact_sha256": "a" * 64}
REPORT = {"verdict": "GO", "blockers": [], "gates": {"storage": {"status": "passed", "seconds": 1.0, "details": {}}},
          "files": [{"uri": "file:///m.gguf", "sha256": "a" * 64, "size": 3}]}
LEASE = timedelta(seconds=30)


@pytest.fixture(params=["postgres", "sqlite"])
def factory(request):
    url = request.getfixturevalue("pg" if request.param == "postgres" else "sqlite_url")
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()


def submitted(factory, max_attempts: int = 3) -> str:
    with transaction(factory) as session:
        return seed(
            session, submitted_by="alice", idempotency_key=None, request_sha256="r" * 64, request=REQUEST,
            policy={}, policy_sha256="p" * 64, max_attempts=max_attempts).id


def claimed(factory, verification_id: str) -> int:
    with transaction(factory) as session:
        verification = repository.claim(session, verification_id, "dispatcher")
        assert verification is not None
        return verification.attempt


def running(factory, verification_id: str, worker: str = "w") -> int:
    attempt = claimed(factory, verification_id)
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, worker, attempt=attempt) is not None
    return attempt


def second_attempt_running(factory, reason: Reason, first_worker: str, second_worker: str) -> tuple[str, int, int]:
    """A verification whose first attempt ended without a verdict (`reason`) and whose second is running:
    (id, first attempt, second attempt)."""
    verification_id = submitted(factory)
    first = running(factory, verification_id, first_worker)
    with transaction(factory) as session:
        repository.end_attempt_without_verdict(session, verification_id, first, reason, "ended")
    return verification_id, first, running(factory, verification_id, second_worker)


def row(factory, verification_id: str) -> Verification:
    with factory() as session:
        verification = repository.get_verification(session, verification_id)
        assert verification is not None
        return verification


def age_heartbeat(factory, verification_id: str, by: timedelta) -> None:
    with transaction(factory) as session:
        session.execute(update(Verification).where(Verification.id == verification_id)
                        .values(heartbeat_at=SYSTEM_CLOCK.now() - by, updated_at=SYSTEM_CLOCK.now() - by))


def assert_event_chain(factory, verification_id: str) -> None:
    """Every transition has its event: the events chain from None to the current state."""
    with factory() as session:
        events = repository.events(session, verification_id)
        current = repository.get_verification(session, verification_id).state
    previous = None
    for event in events:
        assert event.from_state == previous, [(e.from_state, e.to_state) for e in events]
        previous = event.to_state
    assert previous == current


# --- the table -----------------------------------------------------------------------------------

def test_terminal_states_have_no_way_out_and_active_ones_can_be_cancelled():
    for action, transition in TRANSITIONS.items():
        assert not (transition.sources & TERMINAL), action
        assert transition.sources <= ACTIVE
    for state in TERMINAL:
        with pytest.raises(IllegalTransitionError, match=f"^{state} -> running is not allowed$"):
            check(state, State.RUNNING)
    assert successors(State.QUEUED) == {State.DISPATCHED, State.FAILED, State.CANCELLED}
    assert successors(State.RUNNING) == {State.RUNNING, State.COMPLETED, State.FAILED, State.QUEUED,
                                         State.DISPATCHED, State.CANCELLED}
    assert TRANSITIONS[Action.CANCEL].sources == ACTIVE
    check(State.DISPATCHED, State.RUNNING)  # allowed: no error


def test_every_worker_write_is_fenced_by_attempt_and_worker():
    for action in (Action.HEARTBEAT, Action.VERDICT, Action.GIVE_UP, Action.WORKER_RETRY, Action.WORKER_EXHAUSTED):
        assert {Guard.ATTEMPT, Guard.WORKER} <= TRANSITIONS[action].guards, action
    for action, transition in TRANSITIONS.items():
        if transition.sources & {State.DISPATCHED, State.RUNNING}:
            assert Guard.ATTEMPT in transition.guards or action == Action.CANCEL, action
    assert [a for a, t in TRANSITIONS.items() if not t.event] == [Action.HEARTBEAT]
    assert {a for a, t in TRANSITIONS.items() if t.counts_failure} == {
        Action.WORKER_RETRY, Action.WORKER_EXHAUSTED, Action.LOST_RETRY, Action.LOST_EXHAUSTED,
        Action.EXPIRED_RETRY, Action.EXPIRED_EXHAUSTED}


# --- item 1: a worker claims exactly the attempt it was launched for ------------------------------

def test_claim_assigns_the_attempt_and_resets_the_heartbeat(factory):
    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    with transaction(factory) as session:
        repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.WORKER_EXITED, "exit 1")
    age_heartbeat(factory, verification_id, 2 * LEASE)  # the retry waited in the queue longer than a lease
    with transaction(factory) as session:
        (verification,) = repository.claim_queued(session, 5, "dispatcher")
        assert (verification.id, verification.attempt, verification.worker) == (verification_id, 2, "dispatcher")
    with factory() as session:
        assert repository.stale_attempts(session, LEASE) == []  # not "stale" the moment it is dispatched
    assert_event_chain(factory, verification_id)


def test_start_takes_only_the_dispatched_attempt(factory):
    verification_id = submitted(factory)
    with transaction(factory) as session:  # queued: nothing was dispatched, nothing to start
        assert repository.start_attempt(session, verification_id, "early", attempt=1) is None
    attempt = claimed(factory, verification_id)
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, "late", attempt=attempt - 1) is None
        assert repository.start_attempt(session, verification_id, "ahead", attempt=attempt + 1) is None
        started = repository.start_attempt(session, verification_id, "w1", attempt=attempt)
        assert (started.state, started.attempt, started.worker) == (State.RUNNING, attempt, "w1")
    with transaction(factory) as session:  # the same worker starting again, or a neighbouring attempt: nothing
        assert repository.start_attempt(session, verification_id, "w1", attempt=attempt) is None
        assert repository.start_attempt(session, verification_id, "w2", attempt=attempt - 1) is None
        assert repository.start_attempt(session, verification_id, "w2", attempt=attempt + 1) is None
    assert (row(factory, verification_id).worker, row(factory, verification_id).attempt) == ("w1", attempt)
    assert_event_chain(factory, verification_id)


def test_a_late_pod_of_an_old_attempt_cannot_take_over_a_newer_one(factory):
    verification_id, first, second = second_attempt_running(factory, Reason.HEARTBEAT_LOST, "pod-1", "pod-2")
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, "pod-1-late", attempt=first) is None
        assert not repository.heartbeat(session, verification_id, first, None, worker="pod-1")
        assert not repository.record_verdict(session, verification_id, first, REPORT, worker="pod-1")
        assert repository.end_attempt_without_verdict(
            session, verification_id, first, Reason.WORKER_ERROR, "boom", worker="pod-1") == State.RUNNING
        assert repository.heartbeat(session, verification_id, second, {"stage": "storage"}, worker="pod-2")
        assert repository.record_verdict(session, verification_id, second, REPORT, worker="pod-2")
    with factory() as session:
        assert repository.verdict_for(session, verification_id).attempt == second == 2
    assert_event_chain(factory, verification_id)


def test_two_pods_of_one_attempt_cannot_both_write(factory):
    """An evicted attempt goes back to DISPATCHED (no failure); the evicted pod's writes then miss."""
    verification_id = submitted(factory)
    attempt = running(factory, verification_id, "pod-a")
    with transaction(factory) as session:
        assert repository.heartbeat(session, verification_id, attempt, {"stage": "storage"}, worker="pod-a")
    age_heartbeat(factory, verification_id, 2 * LEASE)
    with transaction(factory) as session:
        assert not repository.release_evicted(session, verification_id, attempt + 1, "evicted: x", "dispatcher")
        assert repository.release_evicted(session, verification_id, attempt, "evicted: Preempted", "dispatcher")
    evicted = row(factory, verification_id)
    assert (evicted.state, evicted.worker, evicted.reason, evicted.reason_code, evicted.progress) == (
        State.DISPATCHED, "dispatcher", "evicted: Preempted", Reason.EVICTED, None)
    with factory() as session:
        assert repository.stale_attempts(session, LEASE) == []  # waiting for re-admission is not "stale"
        last = repository.events(session, verification_id)[-1]
    assert (last.reason_code, last.message) == (Reason.EVICTED, "evicted: Preempted: waiting for re-admission")
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, "pod-b", attempt=attempt) is not None
    with transaction(factory) as session:
        assert not repository.heartbeat(session, verification_id, attempt, None, worker="pod-a")
        assert not repository.record_verdict(session, verification_id, attempt, REPORT, worker="pod-a")
        assert not repository.fail_permanently(session, verification_id, attempt, "gone", worker="pod-a")
        assert repository.record_verdict(session, verification_id, attempt, REPORT, worker="pod-b")
    final = row(factory, verification_id)
    assert (final.state, final.attempt, final.failed_attempts) == (State.COMPLETED, 1, 0)
    assert_event_chain(factory, verification_id)


def test_a_replacement_pod_of_the_same_job_takes_over_without_spending_an_attempt(factory):
    """A pod disrupted by the cluster (the Eviction API, a node drain) is replaced by the Job with a new
    pod (same attempt, new name): it takes the RUNNING attempt over, no failure counted, with an event;
    the replaced pod's writes then miss, and no pod of another attempt can take over."""
    verification_id = submitted(factory, max_attempts=1)
    job = f"convgate-{verification_id}-1"
    attempt = running(factory, verification_id, f"{job}-aaaaa")
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, f"{job}-aaaaa", attempt=attempt) is None
        assert repository.start_attempt(session, verification_id, "late", attempt=attempt - 1) is None
        assert repository.start_attempt(session, verification_id, "ahead", attempt=attempt + 1) is None
        taken = repository.start_attempt(session, verification_id, f"{job}-bbbbb", attempt=attempt)
        assert taken is not None
        assert (taken.state, taken.attempt, taken.failed_attempts, taken.worker) == (
            State.RUNNING, attempt, 0, f"{job}-bbbbb")
    with factory() as session:
        last = repository.events(session, verification_id)[-1]
    assert (last.from_state, last.to_state, last.attempt, last.reason_code, last.message) == (
        State.RUNNING, State.RUNNING, attempt, Reason.TAKEN_OVER,
        f"attempt {attempt} taken over by {job}-bbbbb from {job}-aaaaa")
    with transaction(factory) as session:
        assert not repository.heartbeat(session, verification_id, attempt, None, worker=f"{job}-aaaaa")
        assert not repository.record_verdict(session, verification_id, attempt, REPORT, worker=f"{job}-aaaaa")
        assert repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.WORKER_ERROR,
                                                      "boom", worker=f"{job}-aaaaa") == State.RUNNING
        assert repository.record_verdict(session, verification_id, attempt, REPORT, worker=f"{job}-bbbbb")
    final = row(factory, verification_id)
    assert (final.state, final.attempt, final.failed_attempts, final.verdict_result) == (
        State.COMPLETED, 1, 0, "GO")
    assert_event_chain(factory, verification_id)


def test_a_pod_of_an_older_attempt_never_takes_over_a_running_newer_one(factory):
    verification_id, first, second = second_attempt_running(factory, Reason.JOB_LOST, "pod-1-a", "pod-2-a")
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, "pod-1-b", attempt=first) is None
        assert repository.start_attempt(session, verification_id, "pod-3-a", attempt=second + 1) is None
    current = row(factory, verification_id)
    assert (current.state, current.attempt, current.worker, current.failed_attempts) == (
        State.RUNNING, second, "pod-2-a", 1)


def test_max_attempts_bounds_failed_attempts_and_claims(factory):
    verification_id = submitted(factory, max_attempts=2)
    for expected in (State.QUEUED, State.FAILED):
        attempt = running(factory, verification_id)
        with transaction(factory) as session:
            assert repository.end_attempt_without_verdict(
                session, verification_id, attempt, Reason.WORKER_ERROR, "boom", worker="w") == expected
    final = row(factory, verification_id)
    assert (final.state, final.attempt, final.failed_attempts, final.reason_code) == (
        State.FAILED, 2, 2, Reason.WORKER_ERROR)
    with transaction(factory) as session:  # a forged queued row with no attempts left is not claimed
        session.execute(update(Verification).where(Verification.id == verification_id).values(state=State.QUEUED))
    with transaction(factory) as session:
        assert repository.claim(session, verification_id, "dispatcher") is None
        assert repository.claim_queued(session, 5, "dispatcher") == []


def test_lease_expiry_ends_only_an_attempt_whose_heartbeat_is_old(factory):
    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    with transaction(factory) as session:
        assert repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.HEARTBEAT_LOST,
                                                      "lost", lease=LEASE) == State.RUNNING
    age_heartbeat(factory, verification_id, 2 * LEASE)
    with factory() as session:
        assert [v.id for v in repository.stale_attempts(session, LEASE)] == [verification_id]
    with transaction(factory) as session:
        assert repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.HEARTBEAT_LOST,
                                                      "lost", lease=LEASE) == State.QUEUED
    final = row(factory, verification_id)
    assert (final.failed_attempts, final.reason_code) == (1, Reason.HEARTBEAT_LOST)
    assert_event_chain(factory, verification_id)


def test_undispatch_gives_the_slot_back_without_counting_a_failure(factory):
    verification_id = submitted(factory)
    attempt = claimed(factory, verification_id)
    with transaction(factory) as session:
        assert not repository.undispatch(session, "nope", attempt, "missing", "job not created")
        assert not repository.undispatch(session, verification_id, attempt + 1, "wrong attempt")
        assert repository.undispatch(session, verification_id, attempt, "HTTP 403", "job not created")
    final = row(factory, verification_id)
    assert (final.state, final.attempt, final.failed_attempts) == (State.QUEUED, 1, 0)
    assert (final.reason_code, final.reason, final.cluster_status) == (Reason.DISPATCH_FAILED, "HTTP 403",
                                                                       "job not created")
    with factory() as session:
        assert repository.events(session, verification_id)[-1].message == "dispatch failed: HTTP 403"
    assert_event_chain(factory, verification_id)


# --- item 2: cancel never overwrites a verdict ---------------------------------------------------

def test_cancel_after_a_verdict_reports_the_verdict(factory):
    from service.verifications import cancel

    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    with transaction(factory) as canceller:
        seen = repository.get_verification(canceller, verification_id)  # read before the verdict lands
        assert seen.state == State.RUNNING
        canceller.commit()
        with transaction(factory) as worker:
            assert repository.record_verdict(worker, verification_id, attempt, REPORT, worker="w")
        result = cancel(canceller, seen, "olga")
        assert (result.state, result.verdict_result) == (State.COMPLETED, "GO")
    final = row(factory, verification_id)
    assert (final.state, final.verdict_result) == (State.COMPLETED, "GO")
    assert_event_chain(factory, verification_id)


def test_cancel_wins_over_a_later_verdict_and_ending(factory):
    from service.verifications import cancel

    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    with transaction(factory) as session:
        assert cancel(session, repository.get_verification(session, verification_id), "olga").state == State.CANCELLED
    with transaction(factory) as session:
        assert not repository.record_verdict(session, verification_id, attempt, REPORT, worker="w")
        assert repository.end_attempt_without_verdict(
            session, verification_id, attempt, Reason.WORKER_EXITED, "exit 0") == State.CANCELLED
        assert repository.cancel(session, verification_id, "again").state == State.CANCELLED
    with factory() as session:
        assert repository.verdict_for(session, verification_id) is None
        cancels = [e for e in repository.events(session, verification_id) if e.to_state == State.CANCELLED]
        assert [(e.reason_code, e.message) for e in cancels] == [(Reason.CANCELLED, "cancelled by olga")]
    assert repository.cancel
    assert_event_chain(factory, verification_id)


def test_verdict_after_an_ending_writes_nothing_and_no_constraint_is_hit(factory):
    verification_id = submitted(factory)
    attempt = running(factory, verification_id)
    with transaction(factory) as session:
        assert repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.WORKER_EXITED,
                                                      "exit 1") == State.QUEUED
    with transaction(factory) as session:
        assert not repository.record_verdict(session, verification_id, attempt, REPORT, worker="w")
    with factory() as session:
        assert session.scalar(text("SELECT count(*) FROM verdicts")) == 0


def test_missing_verification(factory):
    with transaction(factory) as session:
        assert repository.cancel(session, "nope", "olga") is None
        assert repository.claim(session, "nope", "d") is None
        assert repository.start_attempt(session, "nope", "w", attempt=1) is None
        assert repository.end_attempt_without_verdict(session, "nope", 1, Reason.WORKER_EXITED, "x") == "missing"


def test_a_worker_gives_up_when_no_verdict_is_possible(factory):
    verification_id = submitted(factory)
    attempt = running(factory, verification_id, "w")
    with transaction(factory) as session:
        assert repository.heartbeat(session, verification_id, attempt, {"stage": "fetch"}, worker="w")
        assert not repository.fail_permanently(session, verification_id, attempt, "gone", worker="other")
        assert repository.fail_permanently(session, verification_id, attempt, "source unavailable: 404", worker="w")
    final = row(factory, verification_id)
    assert (final.state, final.reason, final.reason_code, final.progress, final.failed_attempts) == (
        State.FAILED, "source unavailable: 404", Reason.SOURCE_UNAVAILABLE, None, 0)
    assert final.finished_at is not None
    with factory() as session:
        last = repository.events(session, verification_id)[-1]
    assert (last.from_state, last.to_state, last.reason_code, last.message) == (
        "running", "failed", Reason.SOURCE_UNAVAILABLE, "source unavailable: 404")
