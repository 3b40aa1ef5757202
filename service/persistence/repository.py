"""Every query the service and the Job entrypoint run. Functions take a session and flush, never
commit: the caller (a request dependency or `transaction()`) owns the unit of work."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast, overload

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from service.persistence.models import (
    ApiToken,
    FileDigestRecord,
    GateResultRow,
    TensorRowRecord,
    Verdict,
    Verification,
    VerificationEvent,
)
from service.states import State, check_transition


def now() -> datetime:
    return datetime.now(UTC)


@overload
def as_utc(moment: datetime) -> datetime: ...
@overload
def as_utc(moment: None) -> None: ...
def as_utc(moment: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything here is UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


# --- tokens ---------------------------------------------------------------------------------

def add_token(session: Session, name: str, role: str, token_sha256: str) -> ApiToken:
    token = ApiToken(name=name, role=role, token_sha256=token_sha256, created_at=now())
    session.add(token)
    session.flush()
    return token


def active_token(session: Session, token_sha256: str) -> ApiToken | None:
    return session.scalar(select(ApiToken).where(ApiToken.token_sha256 == token_sha256,
                                                 ApiToken.revoked_at.is_(None)))


def revoke_token(session: Session, name: str) -> bool:
    result = session.execute(update(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
                             .values(revoked_at=now()))
    return cast(CursorResult, result).rowcount == 1


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


# --- verifications --------------------------------------------------------------------------

def _event(session: Session, verification: Verification, from_state: str | None, to_state: State,
           message: str) -> None:
    session.add(VerificationEvent(verification_id=verification.id, at=now(), from_state=from_state,
                                  to_state=to_state, attempt=verification.attempt, message=message))


def insert_verification(session: Session, *, submitted_by: str, idempotency_key: str | None, request_sha256: str,
                        request: dict[str, Any], policy: dict[str, Any], policy_sha256: str,
                        max_attempts: int) -> Verification:
    """Raises IntegrityError when the submitter already used `idempotency_key`."""
    moment = now()
    verification = Verification(
        id=str(uuid.uuid4()), submitted_by=submitted_by, idempotency_key=idempotency_key,
        request_sha256=request_sha256, source_uri=request["source_uri"], artifact_uri=request["artifact_uri"],
        artifact_sha256=request["artifact_sha256"], request=request, policy=policy, policy_sha256=policy_sha256,
        state=State.QUEUED, attempt=0, max_attempts=max_attempts, created_at=moment, updated_at=moment,
    )
    session.add(verification)
    session.flush()
    _event(session, verification, None, State.QUEUED, "submitted")
    session.flush()
    return verification


def by_idempotency_key(session: Session, submitted_by: str, key: str) -> Verification | None:
    return session.scalar(select(Verification).where(Verification.submitted_by == submitted_by,
                                                     Verification.idempotency_key == key))


def get_verification(session: Session, verification_id: str, *, for_update: bool = False) -> Verification | None:
    query = select(Verification).where(Verification.id == verification_id)
    return session.scalar(query.with_for_update() if for_update else query)


def transition(session: Session, verification: Verification, target: State, message: str, **values: Any) -> None:
    """Move to `target` if the lifecycle allows it, recording an event."""
    check_transition(verification.state, target)
    previous = verification.state
    verification.state = target
    verification.updated_at = now()
    for key, value in values.items():
        setattr(verification, key, value)
    _event(session, verification, previous, target, message)
    session.flush()


def events(session: Session, verification_id: str) -> list[VerificationEvent]:
    return list(session.scalars(select(VerificationEvent).where(VerificationEvent.verification_id == verification_id)
                                .order_by(VerificationEvent.id)))


@dataclass(frozen=True)
class ListFilters:
    artifact_sha256: str | None = None
    source_uri: str | None = None
    verdict: str | None = None
    state: str | None = None
    submitted_by: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def encode_cursor(verification: Verification) -> str:
    raw = json.dumps([as_utc(verification.created_at).isoformat(), verification.id])
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    created, ident = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    return datetime.fromisoformat(created), str(ident)


def list_verifications(session: Session, filters: ListFilters, *, limit: int,
                       cursor: str | None = None) -> tuple[list[Verification], str | None]:
    """Newest first, ordered by (created_at, id) so pages never skip or repeat a row."""
    query = select(Verification)
    conditions = []
    for column, value in ((Verification.artifact_sha256, filters.artifact_sha256),
                          (Verification.source_uri, filters.source_uri),
                          (Verification.verdict_result, filters.verdict), (Verification.state, filters.state),
                          (Verification.submitted_by, filters.submitted_by)):
        if value is not None:
            conditions.append(column == value)
    if filters.since is not None:
        conditions.append(Verification.created_at >= filters.since)
    if filters.until is not None:
        conditions.append(Verification.created_at < filters.until)
    if cursor is not None:
        created, ident = decode_cursor(cursor)
        conditions.append(or_(Verification.created_at < created,
                              and_(Verification.created_at == created, Verification.id < ident)))
    query = query.where(*conditions).order_by(Verification.created_at.desc(), Verification.id.desc())
    rows = list(session.scalars(query.limit(limit + 1)))
    next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return rows[:limit], next_cursor


# --- dispatch and attempts --------------------------------------------------------------------

def claim_queued(session: Session, limit: int, worker: str) -> list[Verification]:
    """Queued verifications handed to a dispatcher; SKIP LOCKED lets several dispatchers share a queue."""
    query = (select(Verification).where(Verification.state == State.QUEUED)
             .order_by(Verification.created_at, Verification.id).limit(limit))
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    claimed = list(session.scalars(query))
    for verification in claimed:
        transition(session, verification, State.DISPATCHED, f"dispatched to {worker}", worker=worker)
    return claimed


def start_attempt(session: Session, verification_id: str, worker: str) -> Verification | None:
    """A worker claims the next attempt; None when there is nothing to run (finished or cancelled)."""
    verification = get_verification(session, verification_id, for_update=True)
    if verification is None or verification.state not in (State.QUEUED, State.DISPATCHED, State.RUNNING):
        return None
    moment = now()
    # a RUNNING verification is taken over from a worker that stopped without an outcome (its pod was
    # preempted or evicted and started again): a new attempt number for fencing, not a failed attempt
    replaces = f" (attempt {verification.attempt} was interrupted)" if verification.state == State.RUNNING else ""
    transition(session, verification, State.RUNNING,
               f"attempt {verification.attempt + 1} started by {worker}{replaces}",
               attempt=verification.attempt + 1, worker=worker, started_at=moment, heartbeat_at=moment,
               progress=None)
    return verification


def heartbeat(session: Session, verification_id: str, attempt: int, progress: dict[str, Any] | None) -> bool:
    """Record liveness and progress; False when this attempt is no longer the current one."""
    result = session.execute(
        update(Verification)
        .where(Verification.id == verification_id, Verification.attempt == attempt,
               Verification.state == State.RUNNING)
        .values(heartbeat_at=now(), progress=progress, updated_at=now())
    )
    return cast(CursorResult, result).rowcount == 1


def record_verdict(session: Session, verification_id: str, attempt: int, report: dict[str, Any]) -> bool:
    """Write the verdict of `attempt`, fenced: a stale attempt (or a cancelled run) writes nothing."""
    verification = get_verification(session, verification_id, for_update=True)
    if verification is None or verification.state != State.RUNNING or verification.attempt != attempt:
        return False
    verdict = Verdict(verification_id=verification_id, attempt=attempt, verdict=report["verdict"],
                      blocker_codes=sorted({b["code"] for b in report["blockers"]}), report=report,
                      created_at=now())
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
    transition(session, verification, State.COMPLETED, f"verdict {report['verdict']} (attempt {attempt})",
               verdict_result=report["verdict"], finished_at=now(), progress=None)
    return True


def end_attempt_without_verdict(session: Session, verification_id: str, attempt: int | None, reason: str) -> str:
    """An attempt died or errored: retry while attempts remain, else fail with the reason."""
    verification = get_verification(session, verification_id, for_update=True)
    if verification is None or verification.state not in (State.DISPATCHED, State.RUNNING):
        return verification.state if verification else "missing"
    current = verification.attempt + (1 if verification.state == State.DISPATCHED else 0)
    if attempt is not None and attempt != current:
        return verification.state  # a newer attempt owns it
    if verification.state == State.DISPATCHED:
        verification.attempt += 1  # the worker died before it could claim: still an attempt
    verification.failed_attempts += 1
    counted = f"attempt {verification.attempt} failed ({verification.failed_attempts} of {verification.max_attempts})"
    if verification.failed_attempts >= verification.max_attempts:
        transition(session, verification, State.FAILED, f"{counted}: {reason}; no attempts left", reason=reason,
                   finished_at=now(), progress=None)
    else:
        transition(session, verification, State.QUEUED, f"{counted}: {reason}; retrying", reason=reason,
                   progress=None)
    return verification.state


def fail_permanently(session: Session, verification_id: str, attempt: int, reason: str) -> None:
    """No verdict is possible (e.g. the source cannot be read): no retry."""
    verification = get_verification(session, verification_id, for_update=True)
    if verification is not None and verification.state == State.RUNNING and verification.attempt == attempt:
        transition(session, verification, State.FAILED, reason, reason=reason, finished_at=now(), progress=None)


def stale_attempts(session: Session, lease: timedelta) -> list[Verification]:
    """Running or dispatched verifications whose worker stopped heartbeating."""
    cutoff = now() - lease
    return list(session.scalars(select(Verification).where(
        Verification.state.in_((State.RUNNING, State.DISPATCHED)),
        func.coalesce(Verification.heartbeat_at, Verification.updated_at) < cutoff)))


def record_cluster_status(session: Session, verification: Verification, status: str, position: int | None) -> None:
    """What the cluster says (Kueue admission, Job state), with an event whenever it changes."""
    if verification.cluster_status != status:
        _event(session, verification, verification.state, State(verification.state), f"cluster: {status}")
        verification.cluster_status = status
    verification.queue_position = position
    session.flush()


def undispatch(session: Session, verification_id: str, reason: str, cluster_status: str | None = None) -> None:
    """The dispatcher could not start the worker (e.g. the API server refused): back to the queue,
    without spending an attempt; `reason` (and `cluster_status`) say why, for operators."""
    verification = get_verification(session, verification_id, for_update=True)
    if verification is not None and verification.state == State.DISPATCHED:
        if cluster_status is not None:
            record_cluster_status(session, verification, cluster_status, None)
        transition(session, verification, State.QUEUED, f"dispatch failed: {reason}", reason=reason)


def verdict_for(session: Session, verification_id: str) -> Verdict | None:
    return session.scalar(select(Verdict).where(Verdict.verification_id == verification_id))


def state_counts(session: Session) -> dict[str, int]:
    rows = session.execute(select(Verification.state, func.count()).group_by(Verification.state))
    return {state: count for state, count in rows}


def oldest_queued(session: Session) -> Verification | None:
    return session.scalar(select(Verification).where(Verification.state == State.QUEUED)
                          .order_by(Verification.created_at).limit(1))


def active(session: Session, limit: int = 100) -> list[Verification]:
    return list(session.scalars(select(Verification).where(Verification.state.in_(
        (State.QUEUED, State.DISPATCHED, State.RUNNING))).order_by(Verification.created_at).limit(limit)))


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
