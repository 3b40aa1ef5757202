"""The verdict export's one query: a keyset page of verdicts under the auditor filters, newest first.

Keyset pages rather than a server-side cursor, on both databases: each page is one short query on the
(created_at, id) index, so an export of a million rows holds no connection, transaction or snapshot
between pages (a long-lived Postgres snapshot would hold back vacuum for the whole download), and the
rows in memory are one page's. Only the columns a row needs are read: never the report or the request.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from service.persistence.listing import Keyset, ListFilters, list_values, newest_first
from service.persistence.models import Verdict, Verification

COLUMNS = (
    Verification.id, Verification.created_at, Verification.finished_at, Verdict.verdict,
    Verdict.blocker_codes.label("blockers"), Verification.artifact_sha256, Verification.artifact_uri,
    Verification.source_uri, Verification.submitted_by, Verification.policy_origin,
    Verification.policy["version"].as_string().label("policy_version"), Verification.policy_sha256,
    Verdict.attempt, Verification.reused_from,
)
# What reading a stored row can raise when the row holds what it should not: the database refusing to
# read its JSON (SQLite: "malformed JSON" for a NaN), a driver failing to decode its text, the JSON column's
# decoder failing in Python (a ValueError, as UnicodeDecodeError is).
UNREADABLE = (DBAPIError, ValueError)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A verdict whose stored row cannot be read: the export says so in its place and goes on."""

    id: str
    created_at: datetime


def _ordered(columns: Sequence[Any], filters: ListFilters, after: Keyset | None) -> Select[Any]:
    """`columns` of the verdicts under the filters after the keyset, in the list's order."""
    return newest_first(select(*columns).join(Verdict, Verdict.verification_id == Verification.id),
                        list_values(filters, after))


def verdict_page(session: Session, filters: ListFilters, *, after: Keyset | None,
                 limit: int) -> Sequence[Row[Any] | Unreadable]:
    """Up to `limit` verdicts older than `after` (the last row's (created_at, id)), in the list's order.
    One query, as long as every row can be read; else the page again row by row, so one bad row is
    one `Unreadable` and not the end of the export."""
    try:
        return session.execute(_ordered(COLUMNS, filters, after).limit(limit)).all()
    except UNREADABLE:
        session.rollback()  # Postgres ends a transaction at its first error
        log.warning("a page of the verdict export holds a row that cannot be read; reading it row by row")
    keys = session.execute(_ordered((Verification.created_at, Verification.id), filters, after)
                           .limit(limit)).all()
    return [_one(session, key.created_at, key.id) for key in keys]


def _one(session: Session, created_at: datetime, ident: str) -> Row[Any] | Unreadable:
    try:
        return session.execute(select(*COLUMNS).join(Verdict, Verdict.verification_id == Verification.id)
                               .where(Verification.id == ident)).one()
    except UNREADABLE:
        session.rollback()
        log.warning("verification %s: its stored row cannot be read for the export", ident)
        return Unreadable(ident, created_at)
