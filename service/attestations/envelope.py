"""Signing and checking DSSE envelopes (payloadType application/vnd.in-toto+json), offline.

Library: securesystemslib (maintained by the Secure Systems Lab, the DSSE and in-toto authors; the
in-toto and TUF reference implementations build on it). Its `dsse.Envelope` computes the
pre-authentication encoding and its `CryptoSigner`/`SSlibKey` wrap pyca/cryptography's Ed25519, so
no signature byte layout is ours. `in-toto` itself is a layout/link tool (more than a verdict needs),
`in-toto-attestation` has had no release since 2023 and ships protobuf bindings, and `sigstore` is
keyless signing against Fulcio/Rekor, which an air-gapped auditor cannot reach.

Checking is ordered so every refusal names its reason: the envelope's shape, the payload type, a
trusted key for the signature's key id, the signature over the PAE (payload type and payload bytes),
then the statement's schema and that it names the key that signed it."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import Signature

from engine.errors import ConvgateError
from service.attestations.keys import SigningKey, keyid_of, sslib_key
from service.attestations.statement import Statement, statement_json
from service.attestations.vsa import VSA_PREDICATE_TYPE, VsaStatement

PAYLOAD_TYPE = "application/vnd.in-toto+json"


class AttestationRefusedError(ConvgateError):
    """An envelope that does not verify; `reasons` says why, one line each (checks stop at the first)."""

    code = "attestation.refused"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reasons = [reason]


class _SignatureShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keyid: str
    sig: str


class _EnvelopeShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    payload: str
    payloadType: str  # noqa: N815 - the DSSE field name
    signatures: list[_SignatureShape] = Field(min_length=1)


@dataclass(frozen=True)
class Verified:
    statement: Statement | VsaStatement  # convgate's predicate, or the SLSA Verification Summary of the verdict
    keyid: str  # the trusted key whose signature verified


def canonical_payload(statement: Statement) -> bytes:
    """Sorted keys, no whitespace: one statement, one payload."""
    return json.dumps(statement_json(statement), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def sign_payload(payload: bytes, key: SigningKey) -> dict[str, Any]:
    envelope = Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(key.signer())
    return envelope.to_dict()


def sign_statement(statement: Statement, key: SigningKey) -> dict[str, Any]:
    return sign_payload(canonical_payload(statement), key)


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AttestationRefusedError(f"{what} is not base64: {exc}") from exc


def _parse(data: Any) -> Envelope:
    try:
        shape = _EnvelopeShape.model_validate(data)
    except ValidationError as exc:
        raise AttestationRefusedError(f"not a DSSE envelope: {_first_errors(exc)}") from exc
    if shape.payloadType != PAYLOAD_TYPE:
        raise AttestationRefusedError(f"payloadType is {shape.payloadType!r}, expected {PAYLOAD_TYPE!r}")
    signatures: dict[str, Signature] = {}
    for entry in shape.signatures:
        if entry.keyid in signatures:
            raise AttestationRefusedError(f"two signatures name key {entry.keyid}")
        signatures[entry.keyid] = Signature(entry.keyid, _b64(entry.sig, "a signature").hex())
    return Envelope(_b64(shape.payload, "the payload"), shape.payloadType, signatures)


def _signed_by(envelope: Envelope, trusted: Sequence[Ed25519PublicKey]) -> str:
    keys = {keyid_of(public): public for public in trusted}
    known = [keyid for keyid in envelope.signatures if keyid in keys]
    if not known:
        raise AttestationRefusedError(f"signed by key {', '.join(envelope.signatures)}, which is not trusted "
                                      f"(trusted: {', '.join(keys) or 'none'})")
    try:
        accepted = envelope.verify([sslib_key(keys[keyid]) for keyid in known], threshold=1)
    except VerificationError as exc:
        raise AttestationRefusedError(f"the signature does not verify with trusted key {', '.join(known)}") from exc
    return next(iter(accepted))


def _first_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in error['loc']) or 'document'}: {error['msg']}"
                     for error in exc.errors()[:5])


def _statement(payload: bytes) -> Statement | VsaStatement:
    """The signed statement in the schema its predicate type names (read only after the signature
    verified): convgate's own, or the SLSA Verification Summary of the same verdict."""
    try:
        document = json.loads(payload)
    except ValueError:
        document = None  # the schema's own refusal says what is wrong with it
    vsa = isinstance(document, dict) and document.get("predicateType") == VSA_PREDICATE_TYPE
    try:
        return (VsaStatement if vsa else Statement).model_validate_json(payload)
    except ValidationError as exc:
        raise AttestationRefusedError(f"the statement does not fit the schema: {_first_errors(exc)}") from exc


def verify_envelope(data: Any, trusted: Sequence[Ed25519PublicKey]) -> Verified:
    """The statement inside `data`, if a trusted key signed it and it fits the schema; else refused."""
    envelope = _parse(data)
    keyid = _signed_by(envelope, trusted)
    statement = _statement(envelope.payload)
    if isinstance(statement, VsaStatement):  # SLSA's predicate has no field for the signing key
        return Verified(statement, keyid)
    if statement.predicate.signing_keyid != keyid:
        raise AttestationRefusedError(
            f"the statement names key {statement.predicate.signing_keyid} but was signed by {keyid}")
    return Verified(statement, keyid)
