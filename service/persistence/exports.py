"""The verdict export's one query: a keyset page of verdicts under the auditor filters, newest first.

Keyset pages rather than a server-side cursor, on both databases: each page is one short query on the
(created_at, id) index, so an export of a million rows holds no connection, transaction or snapshot
between pages (a long-lived Postgres snapshot would hold back vacuum for the whole download), and the
rows in memory are one page's. Only the columns a row needs are read: never the report or the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from service.persistence.models import Verdict, Verification
from service.persistence.repository import ListFilters, list_conditions, older_than

COLUMNS = (
    Verification.id, Verification.created_at, Verification.finished_at, Verdict.verdict,
    Verdict.blocker_codes.label("blockers"), Verification.artifact_sha256, Verification.artifact_uri,
    Verification.source_uri, Verification.submitted_by, Verification.policy_origin,
    Verification.policy["version"].as_string().label("policy_version"), Verification.policy_sha256,
    Verdict.attempt, Verification.reused_from,
)

Keyset = tuple[datetime, str]


def verdict_page(session: Session, filters: ListFilters, *, after: Keyset | None, limit: int) -> Sequence[Row[Any]]:
    """Up to `limit` verdicts older than `after` (the last row's (created_at, id)), in the list's order."""
    conditions = list_conditions(filters)
    if after is not None:
        conditions += older_than(*after)
    query = (select(*COLUMNS).join(Verdict, Verdict.verification_id == Verification.id).where(*conditions)
             .order_by(Verification.created_at.desc(), Verification.id.desc()).limit(limit))
    return session.execute(query).all()
