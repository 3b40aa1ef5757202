"""OpenSSF Model Signing (OMS) signatures, as the `model-signing` library writes and reads them with a
key: a Sigstore bundle (v0.3, no transparency log) whose DSSE envelope carries an in-toto statement
listing every signed file's sha256.

convgate reads and writes the format itself, with `cryptography` only, for two reasons the library
cannot serve. Reading: a verification must know *which* files a signature covers, to require that
it covers every file the verification read, and the library's verifier only says yes or no about a
whole directory. Writing: the service signs a verified artifact from the digest it stored, without
the artifact's bytes, and the library signs only files it hashes itself. The tests check both
directions against the library (`tests/unit/test_oms.py`): its signatures read here, ours accepted by
its own `model_signing verify`.

The key method's curves only: ECDSA P-256, P-384 or P-521, each with its own hash (the library
refuses Ed25519)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from engine.errors import ConvgateError

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
SINGLE_FILE = "."  # a signature of one file names it so: paths are relative to what was signed
# What the library leaves out of a directory's signature unless told otherwise: repository metadata
# that no model loader reads. A verification does not require a signature to cover these.
GIT_METADATA = frozenset({".git", ".gitattributes", ".github", ".gitignore"})
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MAX_BUNDLE_BYTES = 16 << 20  # a bundle lists one line per file: a few KB for a model directory
_HASHES: dict[str, Callable[[], hashes.HashAlgorithm]] = {
    "secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}


class SignatureInvalidError(ConvgateError):
    """A signature that does not verify, is not an OMS signature, or names none of the trusted keys."""

    code = "engine.signature_invalid"


@dataclass(frozen=True, slots=True)
class SignedManifest:
    """What a verified signature says: who signed it and every file it covers."""

    signer: str  # sha256 of the signer's public key (SubjectPublicKeyInfo PEM), as the bundle's hint
    name: str  # the subject's name: the signed file's or directory's base name when it was signed
    files: Mapping[str, str]  # relative POSIX path ("." for a single file) -> sha256 hex


def key_id(key: ec.EllipticCurvePublicKey) -> str:
    """The library's hint for a key: the sha256 of its SubjectPublicKeyInfo PEM."""
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def load_public_key(pem: bytes | str) -> ec.EllipticCurvePublicKey:
    """A trusted key from the operator's configuration; anything but an EC key on a supported curve is
    refused here, where the operator sees it, not at the first verification."""
    key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in _HASHES:
        raise ValueError("an OMS key is an ECDSA P-256, P-384 or P-521 public key (PEM)")
    return key


def _pae(payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    return b"DSSEv1 %d %s %d " % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload)) + payload


def _root_digest(resources: Sequence[tuple[str, str]]) -> str:
    """The subject's digest: sha256 over the files' raw digests in the listed (name) order."""
    return hashlib.sha256(b"".join(bytes.fromhex(digest) for _name, digest in resources)).hexdigest()


def _field(value: Any, key: str, kind: type) -> Any:
    if not isinstance(value, dict) or not isinstance(value.get(key), kind):
        raise SignatureInvalidError(f"not an OMS signature: no {key} ({kind.__name__})")
    return value[key]


def _envelope(bundle: bytes) -> tuple[bytes, bytes]:
    """(payload, signature) of a bundle, every field checked for its type. The bundle's key hint is not
    read: every trusted key is tried, so a hint could only save time, never change the answer."""
    if len(bundle) > MAX_BUNDLE_BYTES:
        raise SignatureInvalidError(f"the signature file is over {MAX_BUNDLE_BYTES >> 20} MiB")
    try:
        document = json.loads(bundle)
    except (ValueError, RecursionError) as exc:
        raise SignatureInvalidError("the signature file is not JSON") from exc
    if _field(document, "mediaType", str) != BUNDLE_MEDIA_TYPE:
        raise SignatureInvalidError(f"not an OMS signature: media type is not {BUNDLE_MEDIA_TYPE}")
    envelope = _field(document, "dsseEnvelope", dict)
    if _field(envelope, "payloadType", str) != PAYLOAD_TYPE:
        raise SignatureInvalidError(f"not an OMS signature: payload type is not {PAYLOAD_TYPE}")
    signatures = _field(envelope, "signatures", list)
    if len(signatures) != 1:
        raise SignatureInvalidError("an OMS signature carries exactly one signature")
    try:
        payload = base64.b64decode(_field(envelope, "payload", str), validate=True)
        signature = base64.b64decode(_field(signatures[0], "sig", str), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignatureInvalidError("the signature's payload or signature is not base64") from exc
    return payload, signature


def _statement(payload: bytes) -> tuple[str, dict[str, str]]:
    """(the subject's name, the files) of a verified payload, every field checked."""
    try:
        statement = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise SignatureInvalidError("the signed statement is not JSON") from exc
    if _field(statement, "_type", str) != STATEMENT_TYPE or _field(statement, "predicateType", str) != PREDICATE_TYPE:
        raise SignatureInvalidError(f"the signed statement is not an in-toto statement of {PREDICATE_TYPE}")
    subjects = _field(statement, "subject", list)
    predicate = _field(statement, "predicate", dict)
    serialization_ = _field(predicate, "serialization", dict)
    if serialization_.get("method") != "files" or serialization_.get("hash_type") != "sha256":
        raise SignatureInvalidError("only whole-file sha256 signatures are read (the library's default); this one "
                                    f"is {serialization_.get('method')!r}/{serialization_.get('hash_type')!r}")
    resources: list[tuple[str, str]] = []
    for resource in _field(predicate, "resources", list):
        name, digest = _field(resource, "name", str), _field(resource, "digest", str)
        if _field(resource, "algorithm", str) != "sha256" or not SHA256_HEX.fullmatch(digest):
            raise SignatureInvalidError(f"{name!r}: not a sha256 digest")
        resources.append((name, digest))
    names = [name for name, _digest in resources]
    if len(set(names)) != len(names):
        raise SignatureInvalidError("the signature names a file twice")
    if len(subjects) != 1 or _field(_field(subjects[0], "digest", dict), "sha256", str) != _root_digest(resources):
        raise SignatureInvalidError("the signature's subject digest does not match its files")
    return _field(subjects[0], "name", str), dict(resources)


def read_signature(bundle: bytes, trusted: Sequence[ec.EllipticCurvePublicKey]) -> SignedManifest:
    """The manifest of a signature made by one of the `trusted` keys; SignatureInvalidError otherwise.
    The envelope is verified before its statement is read."""
    payload, signature = _envelope(bundle)
    for key in trusted:
        try:
            key.verify(signature, _pae(payload), ec.ECDSA(_HASHES[key.curve.name]()))
        except InvalidSignature:
            continue
        name, files = _statement(payload)
        return SignedManifest(signer=key_id(key), name=name, files=files)
    raise SignatureInvalidError("the signature does not verify with any trusted key" if trusted
                                else "no signing key is trusted (the operator configures them)")


def uncovered(manifest: SignedManifest, read: Mapping[str, str]) -> list[str]:
    """What is wrong between a verified manifest and the files a verification read (relative path ->
    sha256): each file not signed, or signed with other bytes. Repository metadata is exempt."""
    problems = []
    for path, digest in sorted(read.items()):
        if path.split("/", 1)[0] in GIT_METADATA and path not in manifest.files:
            continue
        signed = manifest.files.get(path)
        if signed is None:
            problems.append(f"{path} is not covered by the signature")
        elif signed != digest:
            problems.append(f"{path} differs from the signed file (sha256 {digest}, signed {signed})")
    return problems


def sign(private_key: ec.EllipticCurvePrivateKey, name: str, files: Mapping[str, str]) -> bytes:
    """An OMS signature of files known by their digests: `{".": sha256}` for one file named `name`, or
    the files of a directory by relative path. What `model_signing verify key` accepts for the same bytes."""
    if private_key.curve.name not in _HASHES:
        raise ValueError("an OMS key is an ECDSA P-256, P-384 or P-521 key")
    resources = sorted(files.items())
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": _root_digest(resources)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                              "ignore_paths": sorted(GIT_METADATA)},
            "resources": [{"name": path, "algorithm": "sha256", "digest": digest} for path, digest in resources],
        },
    }
    payload = json.dumps(statement, separators=(",", ":"), sort_keys=True).encode()
    signature = private_key.sign(_pae(payload), ec.ECDSA(_HASHES[private_key.curve.name]()))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": key_id(private_key.public_key())}, "tlogEntries": []},
        "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                         "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}]},
    }
    return json.dumps(bundle, indent=1).encode()
