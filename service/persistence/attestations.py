"""The attestations table (revision 0008): one envelope per verification, inserted once. A racing
second insert does nothing and reads the winner's row, so every caller returns the same bytes."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from service.persistence.clock import now
from service.persistence.db import writing
from service.persistence.models import Attestation


def envelope_for(session: Session, verification_id: str) -> dict[str, Any] | None:
    return session.scalar(select(Attestation.envelope).where(Attestation.verification_id == verification_id))


def store_once(session: Session, verification_id: str, keyid: str, envelope: dict[str, Any]) -> dict[str, Any]:
    """Insert unless a row exists (ON CONFLICT DO NOTHING on both databases), then return the stored envelope,
    read inside the write (`writing`: in a request unit on SQLite, its read ends here)."""
    writing(session)
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(insert(Attestation).values(verification_id=verification_id, keyid=keyid, envelope=envelope,
                                               created_at=now(session))
                    .on_conflict_do_nothing(index_elements=[Attestation.verification_id]))
    return session.scalars(select(Attestation.envelope)
                           .where(Attestation.verification_id == verification_id)).one()
