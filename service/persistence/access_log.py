"""The access log's queries (revision 0005): append a read, page through the reads newest first.
Kept apart from `repository.py` (verifications and their lifecycle): the log is its own append-only
record, written by the API's read endpoints and read back only by auditors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from edge.redact import HIDDEN, redact_uri
from service.persistence.models import AccessLogRecord
from service.persistence.repository import instant

# Query values kept as sent: parameters whose value the endpoints only accept in a closed shape that
# cannot carry a secret, and only when the value has that shape. A URI filter is stored redacted like
# a stored URI; every other value (free text such as a name filter or a cursor, or a parameter no
# endpoint declares, where a client may have pasted a token) is hidden, its name kept.
_CLOSED_SHAPES: dict[str, re.Pattern[str]] = {
    "artifact_sha256": re.compile(r"[0-9a-f]{64}"),
    "verification_id": re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
    "limit": re.compile(r"[0-9]{1,4}"),
    "verdict": re.compile(r"GO|NO-GO"),
    "state": re.compile(r"[a-z_]{1,24}"),
    "policy_origin": re.compile(r"configured|inline|unrecorded"),
    "action": re.compile(r"[a-z_]{1,32}"),
    "attestation": re.compile(r"true|false|1|0", re.IGNORECASE),
    "format": re.compile(r"jsonl|csv"),
    "since": re.compile(r"[0-9T:.+Z -]{1,40}"),
    "until": re.compile(r"[0-9T:.+Z -]{1,40}"),
}
_URI_PARAMETERS = frozenset({"source_uri"})


def redacted_query(query: dict[str, str]) -> dict[str, str]:
    """What the log keeps of a read's query string: every name, values only where they hold no secret."""
    return {name: _kept_value(name, value) for name, value in query.items()}


def _kept_value(name: str, value: str) -> str:
    if name in _URI_PARAMETERS:
        return redact_uri(value)
    shape = _CLOSED_SHAPES.get(name)
    return value if shape is not None and shape.fullmatch(value) else HIDDEN


def record_access(session: Session, row: dict[str, Any]) -> None:
    """One INSERT of `entry`'s row, sent now (a failing write fails the read); nothing is read back, so no
    ORM object."""
    session.execute(_APPEND, row)


def entry(*, at: datetime, principal: str, role: str, action: str, path: str, query: dict[str, str],
          verification_id: str | None = None) -> dict[str, Any]:
    """One read's row as it is written, by the ORM unit or on the driver (`listing.logged_page_on_driver`):
    its query kept through `redacted_query`, whoever writes it."""
    return {"at": at, "principal": principal, "role": role, "action": action, "verification_id": verification_id,
            "path": path, "query": redacted_query(query)}


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
        conditions.append(AccessLogRecord.at >= instant(filters.since))
    if filters.until is not None:
        conditions.append(AccessLogRecord.at < instant(filters.until))
    if before_id is not None:
        conditions.append(AccessLogRecord.id < before_id)
    rows = list(session.scalars(select(AccessLogRecord).where(*conditions).order_by(AccessLogRecord.id.desc())
                                .limit(limit + 1)))
    return rows[:limit], (rows[limit - 1].id if len(rows) > limit else None)
