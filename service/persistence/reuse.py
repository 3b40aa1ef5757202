"""Queries for verdict reuse (revision 0009): find an earlier verdict by reuse key, and store a new
verification that is born completed with a copy of it. Flush, never commit, like the repository."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import insert, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.lifecycle import Reason, State
from service.persistence import repository
from service.persistence.clock import now
from service.persistence.models import Verdict, Verification, VerificationEvent

CANDIDATES = 5  # newest first: an older one was written by the same verifier or an older one


class Reusable(NamedTuple):
    original_id: str  # the verification whose run produced the verdict
    verdict_id: int
    verdict: str


def reusable(session: Session, key: str, same_verifier: Callable[[object], bool], *,
             submitted_by: str | None) -> Reusable | None:
    """The newest completed verification with this key (and, given `submitted_by`, that submitter's)
    whose report's environment `same_verifier` accepts (only that part of each report is read), naming
    the run that produced its verdict."""
    query = (select(Verification.id, Verification.reused_from, Verdict.id, Verdict.verdict,
                    Verdict.report["environment"])
             .where(Verdict.verification_id == Verification.id, Verification.reuse_key == key,
                    Verification.state == State.COMPLETED))
    if submitted_by is not None:
        query = query.where(Verification.submitted_by == submitted_by)
    rows = session.execute(query.order_by(Verification.created_at.desc()).limit(CANDIDATES))
    for verification_id, reused_from, verdict_id, verdict_value, environment in rows:
        if same_verifier(environment):
            return Reusable(reused_from or verification_id, verdict_id, verdict_value)
    return None


def insert_reused(session: Session, found: Reusable, **columns: Any) -> Verification | None:
    """A verification already completed with a copy of `verdict` (copied inside the database: a report
    can be large), its one event, no attempt; None when the submitter already used the idempotency key."""
    row = repository.new_row(now(session), **columns)  # the one place a verification's columns are made
    row |= {"state": State.COMPLETED, "verdict_result": found.verdict, "finished_at": row["created_at"],
            "reused_from": found.original_id}
    if session.scalar(_INSERT_UNLESS_KNOWN[session.get_bind().dialect.name], row) is None:
        return None
    verification = Verification(**row)  # as written; like insert_unless_known's, not read back
    session.execute(insert(Verdict).from_select(
        ["verification_id", "attempt", "verdict", "blocker_codes", "report", "created_at"],
        select(literal(verification.id), literal(0), Verdict.verdict, Verdict.blocker_codes, Verdict.report,
               literal(row["created_at"], Verdict.created_at.type)).where(Verdict.id == found.verdict_id)))
    session.execute(insert(VerificationEvent), {
        "verification_id": verification.id, "at": row["created_at"],  # no from_state: born completed
        "to_state": State.COMPLETED, "attempt": 0, "reason_code": Reason.VERDICT,
        "message": f"verdict {found.verdict} reused from {found.original_id} (same pinned inputs, policy and "
                   "verifier; no Job)"})
    return verification


_INSERT_UNLESS_KNOWN = {name: dialect.insert(Verification.__table__).on_conflict_do_nothing()
                        .returning(Verification.__table__.c.id)
                        for name, dialect in (("postgresql", postgresql), ("sqlite", sqlite))}
