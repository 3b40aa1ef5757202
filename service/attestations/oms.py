"""OpenSSF Model Signing (OMS) on the service's side: the operator's keys, and the signature of a GO
artifact in the form platforms verify with `model_signing verify key`.

Two kinds of key, both from the operator's configuration and never from a submitter:
- convgate's own model-signing key (`model_signing_key_file`, ECDSA P-256: the library's key method
  refuses Ed25519, so it cannot be the attestation key) signs what convgate verified. Its rotated-out
  public keys join the attestation keys' rotation list (`trusted_key_files`), and the chart mounts it
  from the attestation key's Secret.
- publishers' public keys (`publisher_key_files`) are what a submitted source or artifact signature
  must verify with.

The signature is made from the digests the verdict stored (the artifact's sha256, every shard's), so
the service never needs the artifact's bytes; the engine measured them. Only a GO is signed: a
signature says "convgate verified exactly these bytes and found them good"."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy.orm import Session

from engine import oms
from engine.formats.artifact_files import split_shard_uris, uri_name
from service.attestations.keys import KeyFileError, any_public_key, generated_pem, read_key_file
from service.config import Settings
from service.persistence import repository
from service.persistence.models import Verification

GENERATED_MODEL_SIGNING_KEY = Path("keys") / "model-signing-p256.pem"  # under the cache dir, when none is configured


def _new_key_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def model_signing_key(settings: Settings) -> ec.EllipticCurvePrivateKey:
    """The configured key, else one generated under the cache dir on first use (shared by the processes
    that share the directory)."""
    path = settings.model_signing_key_file or settings.cache_dir / GENERATED_MODEL_SIGNING_KEY
    data = read_key_file(path) if settings.model_signing_key_file else generated_pem(path, _new_key_pem)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise KeyFileError(f"{path} holds a {type(key).__name__}; model signatures are signed with ECDSA P-256")
    return key


def public_pem(key: ec.EllipticCurvePublicKey) -> str:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _public_key(path: Path) -> ec.EllipticCurvePublicKey | None:
    """The ECDSA public key in `path` (a private key file gives its public half); None for an Ed25519 one,
    which belongs to the attestations' rotation list."""
    key = any_public_key(path)
    if isinstance(key, ec.EllipticCurvePublicKey):
        try:
            return oms.load_public_key(public_pem(key))
        except ValueError as exc:
            raise KeyFileError(f"{path}: {exc}") from exc
    return None


def rotated_public_keys(settings: Settings) -> list[ec.EllipticCurvePublicKey]:
    """The model-signing keys rotated out but still trusted: the ECDSA ones of `trusted_key_files`."""
    return [key for path in settings.trusted_key_files if (key := _public_key(path)) is not None]


def publisher_keys(settings: Settings) -> tuple[str, ...]:
    """The publishers' public keys (PEM) a submitted signature must verify with."""
    keys = []
    for path in settings.publisher_key_files:
        key = _public_key(path)
        if key is None:
            raise KeyFileError(f"{path}: a publisher's key is an ECDSA public key (OpenSSF Model Signing)")
        keys.append(public_pem(key))
    return tuple(keys)


def artifact_files(verification: Verification) -> tuple[str, dict[str, str]]:
    """(the signature's subject name, the files it covers) of a verified artifact: one file is signed as
    itself ("."), a split as the directory of its shards, by their published names. A GO verified every
    shard against its pinned digest, so the pinned digests are the measured ones."""
    uri = verification.artifact_uri
    shards = list((verification.request or {}).get("artifact_shard_sha256") or ())
    if len(shards) < 2:
        return uri_name(uri), {oms.SINGLE_FILE: verification.artifact_sha256}
    names = [uri_name(shard) for shard in (uri, *split_shard_uris(uri, len(shards)))]
    return uri_name(uri), dict(zip(names, shards, strict=True))


def model_signature_for(session: Session, settings: Settings, verification: Verification) -> bytes | None:
    """The OMS signature (a Sigstore bundle) of a GO verification's artifact; None for anything else."""
    verdict = repository.verdict_for(session, verification.id)
    if verdict is None or verdict.report.get("verdict") != "GO":
        return None
    name, files = artifact_files(verification)
    return oms.sign(model_signing_key(settings), name, files)
