"""Aggregates for /metrics and the queue view, computed in SQL so a scrape never loads rows: each query
returns one row per label value (a state, a reason, a blocker-code combination), never one per
verification. Every count is over append-only rows (events, verdicts, deliveries) or monotone columns,
so the ones /metrics exports as counters only grow, and every API replica reports the same numbers."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, case, cast, func, select
from sqlalchemy.orm import Session

from service.lifecycle import Reason, State
from service.persistence.models import (
    CallbackDelivery,
    GateResultRow,
    Verdict,
    Verification,
    VerificationEvent,
)

# The reasons an attempt ends without a verdict *and counts as failed* (lifecycle: counts_failure)
FAILURE_REASONS = (Reason.WORKER_ERROR, Reason.WORKER_EXITED, Reason.HEARTBEAT_LOST,
                   Reason.DISPATCHER_RESTARTED, Reason.JOB_LOST)
WAITING = (State.QUEUED, State.DISPATCHED)


def state_counts(session: Session) -> dict[str, int]:
    rows = session.execute(select(Verification.state, func.count()).group_by(Verification.state))
    return {state: count for state, count in rows}


def verdict_counts(session: Session) -> dict[str, int]:
    rows = session.execute(select(Verdict.verdict, func.count()).group_by(Verdict.verdict))
    return {verdict: count for verdict, count in rows}


def gate_duration_histogram(session: Session, buckets: tuple[float, ...]) -> dict[str, tuple[list[int], int, float]]:
    """Per gate: cumulative counts at each bucket bound, total count and sum, computed in SQL."""
    columns = [func.sum(case((GateResultRow.seconds <= bound, 1), else_=0)) for bound in buckets]
    query = select(GateResultRow.gate, func.count(), func.sum(GateResultRow.seconds), *columns)
    histogram: dict[str, tuple[list[int], int, float]] = {}
    for row in session.execute(query.group_by(GateResultRow.gate)):
        gate, total, seconds, *counts = tuple(row)
        histogram[str(gate)] = ([int(c or 0) for c in counts], int(total), float(seconds or 0.0))
    return histogram


def attempts_started(session: Session) -> int:
    """Every attempt a worker started (the START transition's event; a takeover continues one)."""
    return session.scalar(select(func.count()).where(VerificationEvent.reason_code == Reason.STARTED)) or 0


def last_start(session: Session) -> datetime | None:
    return session.scalar(select(func.max(VerificationEvent.at)).where(VerificationEvent.reason_code == Reason.STARTED))


def attempt_failures(session: Session) -> dict[tuple[str, bool], int]:
    """(reason code, OOM-killed?) -> failed attempts. The OOM kill is told apart from other exits by the
    outcome the dispatcher read from the pod, which it writes as `worker OOMKilled (exit code 137)`."""
    oom = VerificationEvent.message.like("%OOMKilled%")
    rows = session.execute(select(VerificationEvent.reason_code, oom, func.count())
                           .where(VerificationEvent.reason_code.in_(FAILURE_REASONS),
                                  VerificationEvent.to_state.in_((State.QUEUED, State.FAILED)))
                           .group_by(VerificationEvent.reason_code, oom))
    return {(str(code), bool(killed)): count for code, killed, count in rows}


def nogo_blocker_sets(session: Session) -> dict[str, int]:
    """The NO-GO verdicts, grouped by their list of blocker codes (as stored, JSON text): few distinct
    lists however many verdicts, so the caller splits them into families and codes."""
    codes = cast(Verdict.blocker_codes, String)
    rows = session.execute(select(codes, func.count()).where(Verdict.verdict == "NO-GO").group_by(codes))
    return {str(text): count for text, count in rows}


def callback_deliveries(session: Session) -> dict[bool, int]:
    """Delivery attempts by outcome: True for a 2xx answer, False for any other answer or no answer."""
    delivered = (CallbackDelivery.status_code >= 200) & (CallbackDelivery.status_code < 300) \
        & CallbackDelivery.error.is_(None)
    flag = case((delivered, 1), else_=0)
    rows = session.execute(select(flag, func.count()).group_by(flag))
    return {bool(ok): count for ok, count in rows}


def oldest_waiting(session: Session) -> Verification | None:
    """The verification that has waited longest to start: queued, or dispatched and not yet running."""
    return session.scalar(select(Verification).where(Verification.state.in_(WAITING))
                          .order_by(Verification.created_at, Verification.id).limit(1))
