"""What the start estimate and its replay read: the latest verifications' times and artifact sizes, as
columns only (never a report or a request body), through the created_at index."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import Label

from service.lifecycle import State
from service.persistence.clock import as_utc
from service.persistence.models import FileDigestRecord, Verification
from service.queue_replay import Past


def _size_column() -> Label[int]:
    """The artifact's bytes: as measured by any run that read the same bytes (the digests are
    content-addressed, so one sha256 has one size), else as the submission declared it."""
    measured = (select(func.max(FileDigestRecord.size)).where(FileDigestRecord.sha256 == Verification.artifact_sha256)
                .correlate(Verification).scalar_subquery())
    declared = Verification.request["artifact_size"].as_integer()
    return func.coalesce(measured, declared).label("size")


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else as_utc(moment).timestamp()


def history(session: Session, limit: int = 300) -> list[Past]:
    """The latest `limit` verifications by submission, oldest first."""
    rows = session.execute(
        select(Verification.id, Verification.state, Verification.reused_from, Verification.created_at,
               Verification.started_at, Verification.finished_at, _size_column())
        .order_by(Verification.created_at.desc(), Verification.id.desc()).limit(limit)).all()
    return [Past(id=row.id, created=as_utc(row.created_at).timestamp(), started=_seconds(row.started_at),
                 finished=_seconds(row.finished_at) if row.state in (State.COMPLETED, State.FAILED, State.CANCELLED)
                 else None,
                 completed=row.state == State.COMPLETED and row.reused_from is None and row.started_at is not None,
                 size=None if row.size is None else int(row.size))
            for row in reversed(rows)]


def sizes_of(session: Session, ids: Sequence[str]) -> dict[str, int]:
    """The artifact sizes known for these verifications (see `_size_column`)."""
    if not ids:
        return {}
    rows = session.execute(select(Verification.id, _size_column()).where(Verification.id.in_(list(ids))))
    return {row.id: int(row.size) for row in rows if row.size is not None}
