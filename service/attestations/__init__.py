"""Signed attestations: each verdict as an in-toto Statement in an Ed25519-signed DSSE envelope that an
auditor can check offline, without trusting our database (`convgate attestation verify`)."""

from service.attestations.envelope import (
    PAYLOAD_TYPE,
    AttestationRefusedError,
    Verified,
    canonical_payload,
    sign_payload,
    sign_statement,
    verify_envelope,
)
from service.attestations.issue import attestation_for
from service.attestations.keys import (
    KeyFileError,
    SigningKey,
    active_signing_key,
    generated_key,
    keyid_of,
    load_public_key,
    load_signing_key,
    public_pem,
    trusted_public_keys,
)
from service.attestations.statement import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Attested,
    Predicate,
    Statement,
    build_statement,
)
from service.attestations.subjects import check_subjects
from service.attestations.tensors import check_tensors

__all__ = [
    "PAYLOAD_TYPE", "PREDICATE_TYPE", "STATEMENT_TYPE", "AttestationRefusedError", "Attested", "KeyFileError",
    "Predicate", "SigningKey", "Statement", "Verified", "active_signing_key", "attestation_for", "build_statement",
    "canonical_payload", "check_subjects", "check_tensors", "generated_key", "keyid_of", "load_public_key",
    "load_signing_key", "public_pem", "sign_payload", "sign_statement", "trusted_public_keys", "verify_envelope",
]
