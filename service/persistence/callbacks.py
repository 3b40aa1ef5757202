"""Queries for completion callbacks (revision 0009): the submitters' secrets, which deliveries are due,
claiming one (a conditional UPDATE, so replicas sharing the database never send it twice at once), and
the record of every attempt. Flush, never commit, like the repository."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import cast

from sqlalchemy import func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from service.lifecycle import TERMINAL
from service.persistence.clock import now
from service.persistence.db import writing
from service.persistence.models import CallbackDelivery, CallbackSecret, Verification


class CallbackState(StrEnum):
    PENDING = "pending"  # to be sent once the verification is terminal (and callback_due_at has passed)
    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # every attempt failed


def replace_secret(session: Session, submitter: str, secret: str) -> CallbackSecret:
    """One statement that inserts or replaces: a read then an insert let two first secrets of one submitter,
    made at once on Postgres, both find none, and the second failed the primary key (a 500)."""
    writing(session)
    created_at = now(session)
    insert: postgresql.Insert | sqlite.Insert = (postgresql.insert(CallbackSecret)
                                                  if session.get_bind().dialect.name == "postgresql"
                                                  else sqlite.insert(CallbackSecret))
    session.execute(insert.values(submitter=submitter, secret=secret, created_at=created_at).on_conflict_do_update(
        index_elements=[CallbackSecret.submitter], set_={"secret": secret, "created_at": created_at}))
    return session.get_one(CallbackSecret, submitter, populate_existing=True)


def secret_for(session: Session, submitter: str) -> str | None:
    return session.scalar(select(CallbackSecret.secret).where(CallbackSecret.submitter == submitter))


def _due(moment: datetime) -> list[ColumnElement[bool]]:
    return [Verification.callback_state == CallbackState.PENDING, Verification.state.in_(TERMINAL),
            or_(Verification.callback_due_at.is_(None), Verification.callback_due_at <= moment)]


def due(session: Session, limit: int) -> list[str]:
    """Verifications whose callback should be attempted now, longest waiting first."""
    return [verification_id for verification_id, _url in due_with_urls(session, limit)]


def due_with_urls(session: Session, limit: int) -> list[tuple[str, str]]:
    """(verification id, callback URL) of the callbacks that should be attempted now, longest waiting first:
    the sender picks at most one per receiver from them (`service.callbacks_loop`)."""
    rows = session.execute(select(Verification.id, Verification.callback_url).where(*_due(now(session)))
                           .order_by(Verification.callback_due_at, Verification.id).limit(limit))
    return [(verification_id, url) for verification_id, url in rows if url]  # a pending callback has its URL


def claim(session: Session, verification_id: str, lease: timedelta) -> bool:
    """Take one due delivery for `lease`: a process that dies while sending leaves it due again after it."""
    moment = now(session)
    result = session.execute(update(Verification).where(Verification.id == verification_id, *_due(moment))
                             .values(callback_due_at=moment + lease).execution_options(synchronize_session=False))
    return cast(CursorResult, result).rowcount == 1


def attempts_made(session: Session, verification_id: str) -> int:
    return session.scalar(select(func.count()).where(CallbackDelivery.verification_id == verification_id)) or 0


def record(session: Session, delivery: CallbackDelivery, outcome: CallbackState) -> None:
    """Append the attempt and move the callback on: delivered, failed, or due again at its retry time."""
    session.add(delivery)
    session.execute(update(Verification).where(Verification.id == delivery.verification_id,
                                               Verification.callback_state == CallbackState.PENDING)
                    .values(callback_state=outcome, callback_due_at=delivery.next_retry_at)
                    .execution_options(synchronize_session=False))
    session.flush()


def deliveries(session: Session, verification_id: str) -> list[CallbackDelivery]:
    return list(session.scalars(select(CallbackDelivery).where(CallbackDelivery.verification_id == verification_id)
                                .order_by(CallbackDelivery.attempt)))
