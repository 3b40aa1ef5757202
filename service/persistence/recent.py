"""The operator page's recent finished verifications: outcome, first blocker and failure reason.

Read through the (state, created_at) index, newest submissions of each end state first, then ordered
by when they finished: the page refreshes every two seconds, and a sort of every finished row by
`finished_at` (no index) would scan the whole table each time. A long run finishing behind more than
`per_state` newer submissions of its state is left to the auditor page.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from service.lifecycle import TERMINAL
from service.persistence.models import Verdict, Verification

COLUMNS = (
    Verification.id, Verification.state, Verification.submitted_by, Verification.source_uri,
    Verification.artifact_uri, Verification.verdict_result, Verification.reason, Verification.created_at,
    Verification.started_at, Verification.finished_at,
    Verdict.report[("blockers", 0, "code")].as_string().label("first_blocker"),
)


def recent_finished(session: Session, limit: int = 20, per_state: int = 50) -> list[Row[Any]]:
    """Up to `limit` finished verifications, the latest to finish first."""
    rows: list[Row[Any]] = []
    for state in sorted(TERMINAL):
        query = (select(*COLUMNS).outerjoin(Verdict, Verdict.verification_id == Verification.id)
                 .where(Verification.state == state)
                 .order_by(Verification.created_at.desc()).limit(per_state))
        rows += session.execute(query).all()
    return sorted(rows, key=_finished_key, reverse=True)[:limit]


def _finished_key(row: Row[Any]) -> tuple[datetime, str]:
    return (row.finished_at or row.created_at, row.id)

