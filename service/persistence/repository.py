"""Every query the service and the Job entrypoint run. Functions take a session and flush, never
commit: the caller (a request dependency or `transaction()`) owns the unit of work."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import and_, func, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from service.lifecycle import ENDINGS, IN_FLIGHT, TRANSITIONS, Action, Guard, Reason, State
from service.persistence import submission_insert
from service.persistence.clock import as_utc, now
from service.persistence.db import writing
from service.persistence.models import (
    FileDigestRecord,
    GateResultRow,
    TensorRowRecord,
    Verdict,
    Verification,
    VerificationEvent,
)


def instant(moment: datetime) -> datetime:
    """`moment` as the UTC time every column holds, for comparing against one. Postgres compares aware
    times as instants, but SQLite compares the stored text: a bound kept in its own offset (`23:00+02:00`)
    would be read as 23:00 UTC. A naive moment is UTC already, as `as_utc` reads it."""
    return as_utc(moment).astimezone(UTC)


# --- verifications --------------------------------------------------------------------------

def _event(session: Session, verification_id: str, from_state: str | None, to_state: str, attempt: int,
           reason: Reason | None, message: str) -> None:
    session.add(VerificationEvent(verification_id=verification_id, at=now(session), from_state=from_state,
                                  to_state=to_state, attempt=attempt, message=message, reason_code=reason))


def new_row(moment: datetime, *, submitted_by: str, idempotency_key: str | None, request_sha256: str,
            request: dict[str, Any], policy: dict[str, Any], policy_sha256: str, max_attempts: int,
            policy_origin: str | None = None, **optional: Any) -> dict[str, Any]:
    """A queued verification's columns, every one its insert writes (no default is left to SQLAlchemy, so
    the same row serves the driver's execution of the statement too); its id is made here. `optional`: the
    reuse key and the callback's columns (revision 0009), written only when given."""
    return dict(
        id=str(uuid.uuid4()), submitted_by=submitted_by, idempotency_key=idempotency_key,
        request_sha256=request_sha256, source_uri=request["source_uri"], artifact_uri=request["artifact_uri"],
        artifact_sha256=request["artifact_sha256"], request=request, policy=policy, policy_sha256=policy_sha256,
        state=State.QUEUED, attempt=0, failed_attempts=0, max_attempts=max_attempts, created_at=moment,
        updated_at=moment,
        **({} if policy_origin is None else {"policy_origin": policy_origin}),
        **{column: value for column, value in optional.items() if value is not None},
    )


def insert_unless_known(session: Session, **columns: Any) -> Verification | None:
    """The new verification and its event, or None when the submitter already used `idempotency_key`:
    the INSERT yields to the unique index (ON CONFLICT DO NOTHING, waiting for a concurrent duplicate
    to commit or roll back) instead of failing, so a submission needs no savepoint and no SELECT first."""
    row = new_row(now(session), **columns)
    if not submission_insert.insert_queued(session, row):
        return None
    # Built from what was written, not read back: an ORM insert RETURNING the whole row cost as much
    # CPU as the rest of a submission (scripts/bench_api.py). Not in the session; the caller only reads it.
    return Verification(**row)


def by_idempotency_key(session: Session, submitted_by: str, key: str) -> Verification | None:
    return session.scalar(select(Verification).where(Verification.submitted_by == submitted_by,
                                                     Verification.idempotency_key == key))


def get_verification(session: Session, verification_id: str) -> Verification | None:
    """The row as the database has it now (not a stale copy from this session's identity map)."""
    return session.get(Verification, verification_id, populate_existing=True)


def events(session: Session, verification_id: str) -> list[VerificationEvent]:
    return list(session.scalars(select(VerificationEvent).where(VerificationEvent.verification_id == verification_id)
                                .order_by(VerificationEvent.id)))


# --- the lifecycle: every state change is one conditional write (service/lifecycle.py) ---------

@dataclass(frozen=True, slots=True)
class Fence:
    """What the caller holds: the values the transition's guards compare against."""

    attempt: int | None = None
    worker: str | None = None
    lease: timedelta | None = None
    replaces: str | None = None  # the worker a takeover replaces, as the caller read it


def _required(value: Any, guard: Guard) -> Any:
    if value is None:
        raise ValueError(f"the {guard} guard needs a value")
    return value


def _guard(session: Session, guard: Guard, fence: Fence) -> ColumnElement[bool]:
    failed_after = Verification.failed_attempts + 1
    if guard == Guard.ATTEMPT:
        return Verification.attempt == _required(fence.attempt, guard)
    if guard == Guard.WORKER:
        return Verification.worker == _required(fence.worker, guard)
    if guard == Guard.REPLACES:
        return and_(Verification.worker == _required(fence.replaces, guard),
                    Verification.worker != _required(fence.worker, guard))
    if guard == Guard.ATTEMPTS_LEFT:
        return Verification.failed_attempts < Verification.max_attempts
    if guard == Guard.RETRY_LEFT:
        return failed_after < Verification.max_attempts
    if guard == Guard.NO_RETRY_LEFT:
        return failed_after >= Verification.max_attempts
    lease = _required(fence.lease, guard)  # Guard.LEASE_EXPIRED
    cutoff = now(session) - lease
    return func.coalesce(Verification.heartbeat_at, Verification.updated_at) < cutoff


def _state(session: Session, verification_id: str) -> str | None:
    return session.scalar(select(Verification.state).where(Verification.id == verification_id))


def _apply(session: Session, action: Action, verification_id: str, *, fence: Fence = Fence(),
           reason: Reason | None = None, message: str = "", detail: str | None = None,
           **values: Any) -> Verification | None:
    """Try `action`: one UPDATE fenced by the state it was read in and the action's guards, plus its
    event. None when the lifecycle or a guard refuses (someone else won); the row never changes then.
    `detail` (with `reason`) becomes what operators see as the verification's reason."""
    transition = TRANSITIONS[action]
    guards = [_guard(session, guard, fence) for guard in sorted(transition.guards)]  # a missing value raises first
    changes: dict[str, Any] = {"state": transition.target, "updated_at": now(session), **values}
    if transition.counts_failure:
        changes["failed_attempts"] = Verification.failed_attempts + 1
    if detail is not None:
        changes |= {"reason": detail, "reason_code": reason}
    observed = _state(session, verification_id)
    while observed is not None and observed in transition.sources:
        statement = (update(Verification).where(Verification.id == verification_id, Verification.state == observed,
                                                *guards).values(changes)
                     .execution_options(synchronize_session=False))
        if cast(CursorResult, session.execute(statement)).rowcount == 1:
            verification = cast(Verification, get_verification(session, verification_id))
            if transition.event:
                _event(session, verification_id, observed, transition.target, verification.attempt, reason, message)
                session.flush()
            return verification
        current = _state(session, verification_id)
        if current == observed:
            return None  # a guard refused
        observed = current  # another writer moved it first: try again from where it is now
    return None


def claim(session: Session, verification_id: str, worker: str) -> Verification | None:
    """The dispatcher takes a queued verification: the next attempt number is assigned now, and the
    heartbeat restarts, so the lease counts from this dispatch."""
    moment = now(session)
    return _apply(session, Action.CLAIM, verification_id, reason=Reason.DISPATCHED, message=f"dispatched to {worker}",
                  attempt=Verification.attempt + 1, worker=worker, heartbeat_at=moment, progress=None)


def claim_queued(session: Session, limit: int, worker: str) -> list[Verification]:
    """Oldest queued verifications for a dispatcher; SKIP LOCKED lets several dispatchers share a queue."""
    query = (select(Verification.id).where(Verification.state == State.QUEUED)
             .order_by(Verification.created_at, Verification.id).limit(limit))
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    claimed = [claim(session, verification_id, worker) for verification_id in session.scalars(query)]
    return [verification for verification in claimed if verification is not None]


def start_attempt(session: Session, verification_id: str, worker: str, *, attempt: int) -> Verification | None:
    """A worker takes exactly the attempt it was launched for: the one waiting to start or, as a
    replacement pod of the same Job, the one a disrupted pod was running (no failure counted). None
    for an older or newer attempt, a second start by the same worker, a cancelled or finished one."""
    moment = now(session)
    started = _apply(session, Action.START, verification_id, fence=Fence(attempt=attempt), reason=Reason.STARTED,
                     message=f"attempt {attempt} started by {worker}", worker=worker, started_at=moment,
                     heartbeat_at=moment, progress=None)
    if started is not None:
        return started
    replaced = session.scalar(select(Verification.worker).where(Verification.id == verification_id))
    if replaced is None:
        return None
    return _apply(session, Action.TAKEOVER, verification_id,
                  fence=Fence(attempt=attempt, worker=worker, replaces=replaced), reason=Reason.TAKEN_OVER,
                  message=f"attempt {attempt} taken over by {worker} from {replaced}", worker=worker,
                  heartbeat_at=moment, progress=None)


def join_sharded_attempt(session: Session, verification_id: str, worker: str, *, attempt: int) -> Verification | None:
    """Another shard of a running sharded attempt (same attempt, same worker name: the Indexed Job's)
    joins it; no state changes. None for anything else, so an unsharded second start is still refused."""
    verification = get_verification(session, verification_id)
    if (verification is None or verification.state != State.RUNNING or verification.attempt != attempt
            or verification.worker != worker or int((verification.request or {}).get("shards", 1)) <= 1):
        return None
    return verification


def heartbeat(session: Session, verification_id: str, attempt: int, progress: dict[str, Any] | None, *,
              worker: str) -> bool:
    """Record liveness and progress; False when this worker's attempt is no longer the current one."""
    return _apply(session, Action.HEARTBEAT, verification_id, fence=Fence(attempt=attempt, worker=worker),
                  heartbeat_at=now(session), progress=progress) is not None


def record_verdict(session: Session, verification_id: str, attempt: int, report: dict[str, Any], *,
                   worker: str) -> bool:
    """Write the verdict of `attempt`, fenced: a stale attempt, a cancelled or ended run writes nothing.
    The state change comes first, so the one-verdict constraint is never what stops a second verdict."""
    verdict_value = report["verdict"]
    if _apply(session, Action.VERDICT, verification_id, fence=Fence(attempt=attempt, worker=worker),
              reason=Reason.VERDICT, message=f"verdict {verdict_value} (attempt {attempt})",
              verdict_result=verdict_value, finished_at=now(session), progress=None) is None:
        return False
    verdict = Verdict(verification_id=verification_id, attempt=attempt, verdict=verdict_value,
                      blocker_codes=sorted({b["code"] for b in report["blockers"]}), report=report,
                      created_at=now(session))
    session.add(verdict)
    session.flush()
    for name, gate in report["gates"].items():
        session.add(GateResultRow(verdict_id=verdict.id, gate=name, status=gate["status"],
                                  seconds=gate["seconds"]))
    for row in (report["gates"].get("storage") or {}).get("details", {}).get("tensors", []):
        session.add(TensorRowRecord(verdict_id=verdict.id, gguf_name=row["gguf_name"], gguf_type=row["gguf_type"],
                                    check_kind=row["check"], max_abs=row["max_abs"] or 0.0,
                                    rel_l2=row["rel_l2"] if row["rel_l2"] is not None else -1.0,
                                    result=row["result"]))
    for digest in report["files"]:
        session.add(FileDigestRecord(verdict_id=verdict.id, uri=digest["uri"], sha256=digest["sha256"],
                                     size=digest["size"]))
    session.flush()
    return True


def end_attempt_without_verdict(session: Session, verification_id: str, attempt: int, reason: Reason,
                                detail: str, *, worker: str | None = None, lease: timedelta | None = None) -> str:
    """Attempt `attempt` ended without a verdict: retry while attempts remain, else fail with the reason.
    Noticed by its own `worker`, by the dispatcher after a `lease` without heartbeat, or otherwise by the
    dispatcher (the worker is gone). Returns the state the verification is in afterwards."""
    ending = "worker" if worker is not None else "expired" if lease is not None else "lost"
    fence = Fence(attempt=attempt, worker=worker, lease=lease)
    retry, last = ENDINGS[ending]
    for action, outcome in ((retry, "retrying"), (last, "no attempts left")):
        if _apply(session, action, verification_id, fence=fence, reason=reason, detail=detail,
                  message=f"attempt {attempt} failed: {detail}; {outcome}", progress=None,
                  **({"finished_at": now(session)} if action == last else {})) is not None:
            return TRANSITIONS[action].target
    return _state(session, verification_id) or "missing"


def fail_permanently(session: Session, verification_id: str, attempt: int, detail: str, *, worker: str,
                     reason: Reason = Reason.SOURCE_UNAVAILABLE) -> bool:
    """No verdict is possible (e.g. the source cannot be read): no retry."""
    return _apply(session, Action.GIVE_UP, verification_id, fence=Fence(attempt=attempt, worker=worker),
                  reason=reason, message=detail, detail=detail, finished_at=now(session), progress=None) is not None


def fail_unlaunchable(session: Session, verification_id: str, detail: str, message: str) -> bool:
    """The dispatcher gives up on a queued verification whose worker can never be started (the API
    server refused its Job for good, repeatedly)."""
    return _apply(session, Action.REFUSE, verification_id, reason=Reason.DISPATCH_REFUSED, message=message,
                  detail=detail, finished_at=now(session), progress=None) is not None


def release_evicted(session: Session, verification_id: str, attempt: int, detail: str, dispatcher: str) -> bool:
    """Kueue evicted the running `attempt`: it waits for re-admission under the same number, no failure
    counted; the evicted worker's writes no longer match."""
    return _apply(session, Action.EVICT, verification_id, fence=Fence(attempt=attempt), reason=Reason.EVICTED,
                  message=f"{detail}: waiting for re-admission", detail=detail, worker=dispatcher,
                  heartbeat_at=now(session), progress=None) is not None


def cancel(session: Session, verification_id: str, by: str) -> Verification | None:
    """Cancel unless it already ended; returns the verification as it now is (a verdict that was
    committed first wins, and is what the caller sees)."""
    writing(session)
    cancelled = _apply(session, Action.CANCEL, verification_id, reason=Reason.CANCELLED,
                       message=f"cancelled by {by}", detail=f"cancelled by {by}", finished_at=now(session),
                       progress=None)
    return cancelled or get_verification(session, verification_id)


def stale_attempts(session: Session, lease: timedelta) -> list[Verification]:
    """Running or dispatched verifications whose worker stopped heartbeating."""
    cutoff = now(session) - lease
    return list(session.scalars(select(Verification).where(
        Verification.state.in_(IN_FLIGHT),
        func.coalesce(Verification.heartbeat_at, Verification.updated_at) < cutoff)))


def record_cluster_status(session: Session, verification: Verification, status: str, position: int | None) -> None:
    """What the cluster says (Kueue admission, Job state), with an event whenever it changes; written
    only while the verification is still in the state it was read in."""
    changed = verification.cluster_status != status
    result = session.execute(update(Verification).where(Verification.id == verification.id,
                                                        Verification.state == verification.state)
                             .values(cluster_status=status, queue_position=position)
                             .execution_options(synchronize_session=False))
    if cast(CursorResult, result).rowcount == 1 and changed:
        _event(session, verification.id, verification.state, verification.state, verification.attempt, None,
               f"cluster: {status}")
    session.flush()
    get_verification(session, verification.id)


def undispatch(session: Session, verification_id: str, attempt: int, detail: str,
               cluster_status: str | None = None) -> bool:
    """The dispatcher could not start `attempt`'s worker (e.g. the API server refused): back to the
    queue without counting a failure; `detail` (and `cluster_status`) say why, for operators."""
    verification = get_verification(session, verification_id)
    if verification is not None and cluster_status is not None:
        record_cluster_status(session, verification, cluster_status, None)
    return _apply(session, Action.UNDISPATCH, verification_id, fence=Fence(attempt=attempt),
                  reason=Reason.DISPATCH_FAILED, message=f"dispatch failed: {detail}", detail=detail) is not None


def verdict_for(session: Session, verification_id: str) -> Verdict | None:
    return session.scalar(select(Verdict).where(Verdict.verification_id == verification_id))


def oldest_queued(session: Session) -> Verification | None:
    return session.scalar(select(Verification).where(Verification.state == State.QUEUED)
                          .order_by(Verification.created_at).limit(1))


def active(session: Session, limit: int = 100) -> list[Verification]:
    return list(session.scalars(select(Verification).where(Verification.state.in_(
        (State.QUEUED, State.DISPATCHED, State.RUNNING))).order_by(Verification.created_at).limit(limit)))
