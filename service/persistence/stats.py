"""Aggregates for /metrics and the queue view, computed in SQL so a scrape never loads rows."""

from __future__ import annotations

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from service.persistence.models import GateResultRow, Verdict, Verification


def state_counts(session: Session) -> dict[str, int]:
    rows = session.execute(select(Verification.state, func.count()).group_by(Verification.state))
    return {state: count for state, count in rows}


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
