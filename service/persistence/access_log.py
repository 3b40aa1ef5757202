"""The access log's queries (revision 0005): append a read, page through the reads newest first.
Kept apart from `repository.py` (verifications and their lifecycle): the log is its own append-only
record, written by the API's read endpoints and read back only by auditors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from service.persistence.models import AccessLogRecord
from service.persistence.repository import now


def record_access(session: Session, *, principal: str, role: str, action: str, path: str,
                  query: dict[str, Any], verification_id: str | None = None) -> None:
    """One INSERT, sent now (a failing write fails the read); nothing is read back, so no ORM object."""
    session.execute(_APPEND, {"at": now(), "principal": principal, "role": role, "action": action,
                              "verification_id": verification_id, "path": path, "query": query})


_APPEND = insert(AccessLogRecord)  # built once, executed with parameters


@dataclass(frozen=True)
class AccessFilters:
    principal: str | None = None
    verification_id: str | None = None
    action: str | None = None
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive


def access_log(session: Session, filters: AccessFilters, *, limit: int,
               before_id: int | None = None) -> tuple[list[AccessLogRecord], int | None]:
    """Newest first by id; the second value is the id to continue before, None on the last page."""
    conditions: list[Any] = [column == value for column, value in (
        (AccessLogRecord.principal, filters.principal), (AccessLogRecord.verification_id, filters.verification_id),
        (AccessLogRecord.action, filters.action)) if value is not None]
    if filters.since is not None:
        conditions.append(AccessLogRecord.at >= filters.since)
    if filters.until is not None:
        conditions.append(AccessLogRecord.at < filters.until)
    if before_id is not None:
        conditions.append(AccessLogRecord.id < before_id)
    rows = list(session.scalars(select(AccessLogRecord).where(*conditions).order_by(AccessLogRecord.id.desc())
                                .limit(limit + 1)))
    return rows[:limit], (rows[limit - 1].id if len(rows) > limit else None)
