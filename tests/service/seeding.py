"""Rows for tests, written by the insert every submission makes (`repository.insert_unless_known`, what
`service.verifications.submit` calls): a seeded verification is stored exactly as a submitted one is.
Tests whose rows the URI policy would refuse (hostile URIs for the escaping tests, rows an older
release may have stored) use this rather than the API; every other test submits through the API."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.persistence import repository
from service.persistence.models import Verification


def seed(session: Session, **columns: Any) -> Verification:
    """The stored verification, in `session` (a repeated idempotency key is a test's own mistake)."""
    inserted = repository.insert_unless_known(session, **columns)
    assert inserted is not None, f"idempotency key {columns.get('idempotency_key')!r} used twice"
    stored = repository.get_verification(session, inserted.id)
    assert stored is not None
    return stored
