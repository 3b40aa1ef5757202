"""A verdict's attestation, signed once: the first request signs and stores it, every later one (and
every concurrent one, which loses the insert) returns the stored envelope unchanged. Its SLSA
Verification Summary Attestation is signed on request (deterministic, so identical for one key)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.attestations.envelope import sign_payload, sign_statement
from service.attestations.keys import active_signing_key
from service.attestations.statement import Attested, build_statement
from service.attestations.vsa import build_vsa, vsa_payload
from service.config import Settings
from service.persistence import attestations, repository
from service.persistence.clock import as_utc
from service.persistence.models import Verdict, Verification


def attestation_for(session: Session, settings: Settings, verification: Verification) -> dict[str, Any] | None:
    """The DSSE envelope (JSON) of `verification`'s verdict; None while it has no verdict. Flushes, never commits."""
    stored = attestations.envelope_for(session, verification.id)
    if stored is not None:
        return stored
    verdict = repository.verdict_for(session, verification.id)
    if verdict is None:
        return None
    key = active_signing_key(settings)
    envelope = sign_statement(build_statement(_attested(verification, verdict), key.keyid), key)
    return attestations.store_once(session, verification.id, key.keyid, envelope)


def vsa_for(session: Session, settings: Settings, verification: Verification) -> dict[str, Any] | None:
    """The verdict's SLSA Verification Summary Attestation, signed with the active key; None while it has
    no verdict. Not stored: Ed25519 signatures are deterministic, so the same verdict and key give the
    same envelope on every request (after a key rotation, the new key's)."""
    verdict = repository.verdict_for(session, verification.id)
    if verdict is None:
        return None
    return sign_payload(vsa_payload(build_vsa(_attested(verification, verdict))), active_signing_key(settings))


def _attested(verification: Verification, verdict: Verdict) -> Attested:
    return Attested(verification_id=verification.id, report=verdict.report,
                    verdict_at=as_utc(verdict.created_at), policy_origin=verification.policy_origin,
                    artifact_uri=verification.artifact_uri, artifact_sha256=verification.artifact_sha256,
                    reused_from=verification.reused_from)
