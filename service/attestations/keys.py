"""Ed25519 keys: the operator's signing key (a PEM file, in Kubernetes a mounted Secret) or, on the
embedded default, one generated on first use beside the cache and kept (mode 0600); and the public
keys trusted for verification, several at once so a rotated-out key's attestations still verify.

A key id is the hex sha256 of the raw 32-byte public key: stable, computable by anyone holding the
public key, and independent of how the PEM was wrapped."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from securesystemslib.signer import CryptoSigner, SSlibKey

from engine.errors import ConvgateError

if TYPE_CHECKING:
    from service.config import Settings

GENERATED_KEY = Path("keys") / "attestation-ed25519.pem"  # under the cache dir, when no key is configured


class KeyFileError(ConvgateError):
    """A key file that is missing, unreadable or not an Ed25519 key."""

    code = "attestation.key_unusable"


def public_raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def keyid_of(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(public_raw(public)).hexdigest()


def public_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def sslib_key(public: Ed25519PublicKey) -> SSlibKey:
    """The library's key object, under our key id (not its own default id)."""
    return SSlibKey.from_crypto(public, keyid=keyid_of(public))  # scheme ed25519, from the key


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def public_raw(self) -> bytes:
        return public_raw(self.public)

    @property
    def keyid(self) -> str:
        return keyid_of(self.public)

    def signer(self) -> CryptoSigner:
        return CryptoSigner(self.private, sslib_key(self.public))

    def private_pem(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())


def read_key_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror or exc}") from exc


def load_signing_key(path: Path) -> SigningKey:
    """An unencrypted PKCS#8 PEM Ed25519 private key (`openssl genpkey -algorithm ed25519`)."""
    try:
        private = serialization.load_pem_private_key(read_key_file(path), password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(private).__name__}; attestations are signed with Ed25519")
    return SigningKey(private)


def any_public_key(path: Path) -> PublicKeyTypes:
    """The public key in a PEM file; a private key file gives its public half."""
    data = read_key_file(path)
    try:
        return (serialization.load_pem_private_key(data, password=None).public_key() if b"PRIVATE KEY" in data
                else serialization.load_pem_public_key(data))
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not a PEM public key: {exc}") from exc


def load_public_key(path: Path) -> Ed25519PublicKey:
    """A PEM Ed25519 public key (what `convgate keys show` prints); a private key file gives its public half."""
    key = any_public_key(path)
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}; attestations are signed with Ed25519")
    return key


def generated_pem(path: Path, make: Callable[[], bytes]) -> bytes:
    """The key file at `path`, made there first by `make` if absent: written to a private temporary file
    and linked into place, so concurrent first uses agree on one key and nobody reads half a file."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".key-")  # created 0600
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(make())
            os.link(temporary, path)  # fails if another process won the race: theirs is the key
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
    return read_key_file(path)


def generated_key(path: Path) -> SigningKey:
    """The Ed25519 key at `path`, generated there first if absent."""
    generated_pem(path, lambda: SigningKey.generate().private_pem())
    return load_signing_key(path)


def active_signing_key(settings: Settings) -> SigningKey:
    """The operator's key when one is configured; otherwise the embedded default's generated one."""
    if settings.signing_key_file is not None:
        return load_signing_key(settings.signing_key_file)
    return generated_key(settings.cache_dir / GENERATED_KEY)


def trusted_public_keys(settings: Settings) -> list[Ed25519PublicKey]:
    """The active key's public half, then every extra trusted Ed25519 key (those rotated out, still
    honoured); the list's ECDSA keys are model-signing keys (`service.attestations.oms`)."""
    rotated = [any_public_key(path) for path in settings.trusted_key_files]
    for path, key in zip(settings.trusted_key_files, rotated, strict=True):
        if not isinstance(key, Ed25519PublicKey | EllipticCurvePublicKey):
            raise KeyFileError(f"{path} holds a {type(key).__name__}: neither an attestation key (Ed25519) nor a "
                               "model-signing key (ECDSA)")
    return [active_signing_key(settings).public, *(key for key in rotated if isinstance(key, Ed25519PublicKey))]
