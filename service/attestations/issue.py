"""A verdict's attestation, signed once: the first request signs and stores it, every later one (and
every concurrent one, which loses the insert) returns the stored envelope unchanged."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.attestations.envelope import sign_statement
from service.attestations.keys import active_signing_key
from service.attestations.statement import Attested, build_statement
from service.config import Settings
from service.persistence import attestations, repository
from service.persistence.models import Verification


def attestation_for(session: Session, settings: Settings, verification: Verification) -> dict[str, Any] | None:
    """The DSSE envelope (JSON) of `verification`'s verdict; None while it has no verdict. Flushes, never commits."""
    stored = attestations.envelope_for(session, verification.id)
    if stored is not None:
        return stored
    verdict = repository.verdict_for(session, verification.id)
    if verdict is None:
        return None
    key = active_signing_key(settings)
    attested = Attested(verification_id=verification.id, report=verdict.report,
                        verdict_at=repository.as_utc(verdict.created_at), policy_origin=verification.policy_origin,
                        artifact_uri=verification.artifact_uri, artifact_sha256=verification.artifact_sha256,
                        reused_from=verification.reused_from)
    envelope = sign_statement(build_statement(attested, key.keyid), key)
    return attestations.store_once(session, verification.id, key.keyid, envelope)
