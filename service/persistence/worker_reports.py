"""The control plane's half of the restricted worker channel: apply what workers reported.

A restricted worker's SQL functions only file reports in `worker_reports` (migration 0006). Each
dispatch tick applies the pending ones, oldest first, through `SessionAttempt` - the code a local
worker runs directly - so the repository's lifecycle fences decide, once, whether a report changes
anything. Each report is applied in its own savepoint: a report the repository refuses (a stale
attempt) or that does not parse (a worker is untrusted) is marked and never blocks the others.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.errors import ConvgateError
from engine.report import Report
from service.persistence.clock import now
from service.persistence.models import WorkerReport
from service.persistence.worker_channel import SessionAttempt

log = logging.getLogger("convgate.worker_reports")
ACCEPTED, REFUSED, INVALID = "accepted", "refused", "invalid"


class InvalidReportError(ConvgateError, ValueError):
    """A report whose payload is not what a worker sends."""

    code = "report.invalid"


def _progress(payload: dict[str, Any]) -> dict[str, Any] | None:
    progress = payload.get("progress")
    if progress is not None and not isinstance(progress, dict):
        raise InvalidReportError("progress is not an object")
    return progress


def _verdict(payload: dict[str, Any]) -> dict[str, Any]:
    report = payload.get("report")
    try:
        Report.model_validate(report)
    except ValidationError as exc:
        raise InvalidReportError(f"not a report: {exc.error_count()} errors") from exc
    assert isinstance(report, dict)  # validated above
    return report


def _end(payload: dict[str, Any]) -> tuple[str, bool]:
    reason, give_up = payload.get("reason"), payload.get("give_up")
    if not isinstance(reason, str) or not isinstance(give_up, bool):
        raise InvalidReportError("an end report needs a reason and give_up")
    return reason, give_up


def _shard(kind: str, payload: dict[str, Any]) -> tuple[int, int]:
    """(shard, shards) of a `shard-<k>` report; its part is checked where it is stored."""
    shards = payload.get("shards")
    if not kind[len("shard-"):].isdigit() or not isinstance(shards, int):
        raise InvalidReportError("a shard report needs its index and shard count")
    return int(kind[len("shard-"):]), shards


def apply_report(session: Session, report: WorkerReport) -> str:
    """What the repository made of one report: accepted, refused (fenced out) or invalid."""
    attempt = SessionAttempt(session, report.verification_id, report.attempt, report.worker)
    payload = report.payload if isinstance(report.payload, dict) else {}
    try:
        if report.kind == "start":
            return ACCEPTED if attempt.start() is not None else REFUSED
        if report.kind == "heartbeat":
            return ACCEPTED if attempt.heartbeat(_progress(payload)) else REFUSED
        if report.kind == "verdict":
            return ACCEPTED if attempt.record_verdict(_verdict(payload)) else REFUSED
        if report.kind.startswith("shard-"):
            return ACCEPTED if attempt.record_shard(*_shard(report.kind, payload), payload) else REFUSED
        if report.kind == "end":
            reason, give_up = _end(payload)
            return ACCEPTED if attempt.end_without_verdict(f"worker: {reason}", give_up=give_up) else REFUSED
    except InvalidReportError as exc:
        log.warning("verification %s attempt %s: invalid %s report: %s", report.verification_id,
                    report.attempt, report.kind, exc)
        return INVALID
    return INVALID


def apply_worker_reports(session: Session, limit: int = 500) -> int:
    """Apply up to `limit` pending reports, oldest first; returns how many were applied. Call it after
    the dispatcher's sync and before it reaps exited workers."""
    query = select(WorkerReport).where(WorkerReport.applied_at.is_(None)).order_by(WorkerReport.id).limit(limit)
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)  # replicas share the outbox
    reports = list(session.scalars(query))
    for report in reports:
        try:
            with session.begin_nested():
                outcome = apply_report(session, report)
        except Exception:  # one report the repository chokes on must not stop the others
            log.exception("verification %s: %s report not applied", report.verification_id, report.kind)
            outcome = INVALID  # its savepoint rolled back whatever it had begun
        report.applied_at, report.outcome = now(session), outcome
    session.flush()
    return len(reports)
