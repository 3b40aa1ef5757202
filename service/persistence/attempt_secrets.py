"""The per-attempt worker secret: issued by the dispatcher when it claims an attempt, handed only to
that attempt's worker, stored only as a digest bound to (verification id, attempt number).

Binding the digest to the id and the number means a secret is good for one attempt of one
verification, and every claim overwrites the digest, so an older attempt's secret stops working the
moment a newer attempt is claimed. The SQL side of the check is `convgate_worker_authenticated`
(migration 0006), which computes the same digest."""

from __future__ import annotations

import hashlib
import secrets
from typing import cast

from sqlalchemy import update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from engine.errors import ConvgateError
from service.lifecycle import State
from service.persistence.models import Verification

SECRET_BYTES = 32  # 256 bits, URL-safe base64: 43 characters


class AttemptNotClaimedError(ConvgateError, RuntimeError):
    """The verification is not dispatched any more (cancelled, or claimed by someone else)."""

    code = "attempt.not_claimed"


def secret_digest(verification_id: str, attempt: int, secret: str) -> str:
    return hashlib.sha256(f"{verification_id}:{attempt}:{secret}".encode()).hexdigest()


def issue_attempt_secret(session: Session, verification_id: str, attempt: int) -> str:
    """A new secret for the attempt just claimed; only its digest is stored, with a conditional write
    (the verification must still be dispatched). Call it in the claim's transaction."""
    secret = secrets.token_urlsafe(SECRET_BYTES)
    result = session.execute(
        update(Verification)
        .where(Verification.id == verification_id, Verification.state == State.DISPATCHED)
        .values(attempt_secret_sha256=secret_digest(verification_id, attempt, secret))
        .execution_options(synchronize_session=False))
    if cast(CursorResult, result).rowcount != 1:
        raise AttemptNotClaimedError(f"verification {verification_id} is not dispatched: no secret issued")
    return secret
