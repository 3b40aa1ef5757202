"""OpenSSF Model Signing signatures (`worker/oms.py`) against the `model-signing` library itself: what the
library signs is read here (good, tampered, wrong key, a file it does not cover, a forged payload), and
what convgate signs the library's own verifier accepts, for one file and for a split's shards."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from model_signing import hashing, signing, verifying

from worker import oms


def _key(tmp_path: Path, name: str, curve: ec.EllipticCurve | None = None) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    (tmp_path / f"{name}.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (tmp_path / f"{name}.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key


def _model(root: Path) -> Path:
    model = root / "model"
    (model / "1_Pooling").mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "bert"}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (model / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (model / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    return model


def _read(model: Path) -> dict[str, str]:
    """What a verification reads: every file, by relative path, with its sha256."""
    return {p.relative_to(model).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(model.rglob("*")) if p.is_file()}


def _library_signs(model: Path, key: Path, signature: Path, ignore: tuple[str, ...] = ()) -> bytes:
    config = signing.Config().use_elliptic_key_signer(private_key=key)
    if ignore:
        config = config.set_hashing_config(hashing.Config().set_ignored_paths(paths=list(ignore)))
    config.sign(model, signature)
    return signature.read_bytes()


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, bytes, ec.EllipticCurvePublicKey]:
    key = _key(tmp_path, "publisher")
    model = _model(tmp_path)
    return model, _library_signs(model, tmp_path / "publisher.pem", tmp_path / "model.sig"), key.public_key()


def test_a_signature_the_library_made_is_read_and_covers_every_file(signed) -> None:
    model, bundle, public = signed
    manifest = oms.read_signature(bundle, [public])
    assert manifest.signer == oms.key_id(public)
    assert dict(manifest.files) == {path: digest for path, digest in _read(model).items() if path != ".gitattributes"}
    assert oms.uncovered(manifest, _read(model)) == []  # repository metadata is left to the signer


def test_a_file_changed_after_signing_is_named(signed) -> None:
    model, bundle, public = signed
    (model / "config.json").write_text('{"model_type": "bert", "hidden_act": "relu"}')
    problems = oms.uncovered(oms.read_signature(bundle, [public]), _read(model))
    assert len(problems) == 1 and problems[0].startswith("config.json differs from the signed file")


def test_a_file_the_signature_does_not_cover_is_named(tmp_path) -> None:
    """The library lets a signer leave files out; a verification that reads one refuses the signature."""
    key = _key(tmp_path, "publisher")
    model = _model(tmp_path)
    bundle = _library_signs(model, tmp_path / "publisher.pem", tmp_path / "model.sig", ignore=("1_Pooling",))
    manifest = oms.read_signature(bundle, [key.public_key()])
    assert oms.uncovered(manifest, _read(model)) == ["1_Pooling/config.json is not covered by the signature"]
    (model / "tokenizer.json").write_text("{}")  # added after signing
    assert "tokenizer.json is not covered by the signature" in oms.uncovered(manifest, _read(model))


def test_another_key_or_no_trusted_key_is_refused(signed, tmp_path) -> None:
    _model_dir, bundle, _public = signed
    other = _key(tmp_path, "other").public_key()
    with pytest.raises(oms.SignatureInvalidError, match="does not verify with any trusted key"):
        oms.read_signature(bundle, [other])
    with pytest.raises(oms.SignatureInvalidError, match="no signing key is trusted"):
        oms.read_signature(bundle, [])


def test_a_forged_payload_is_refused_before_it_is_read(signed) -> None:
    _model_dir, bundle, public = signed
    document = json.loads(bundle)
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(oms.SignatureInvalidError, match="does not verify"):
        oms.read_signature(json.dumps(document).encode(), [public])


@pytest.mark.parametrize(("bundle", "why"), [
    (b"\xff not json", "not JSON"),
    (b"[]", "no mediaType"),
    (json.dumps({"mediaType": "application/json"}).encode(), "media type"),
    (b"{" * 200_000, "not JSON"),
    (b" " * (oms.MAX_BUNDLE_BYTES + 1), "over 16 MiB"),
])
def test_what_is_not_a_signature_is_refused_clearly(signed, bundle, why) -> None:
    with pytest.raises(oms.SignatureInvalidError, match=why):
        oms.read_signature(bundle, [signed[2]])


def test_a_signature_of_another_hash_is_refused_by_name(tmp_path) -> None:
    key = _key(tmp_path, "publisher")
    model = _model(tmp_path)
    signing.Config().use_elliptic_key_signer(private_key=tmp_path / "publisher.pem").set_hashing_config(
        hashing.Config().use_file_serialization(hashing_algorithm="blake2")).sign(model, tmp_path / "b.sig")
    with pytest.raises(oms.SignatureInvalidError, match="whole-file sha256"):
        oms.read_signature((tmp_path / "b.sig").read_bytes(), [key.public_key()])


@pytest.mark.parametrize("curve", [ec.SECP256R1(), ec.SECP384R1()])
def test_what_convgate_signs_the_library_verifies_and_a_changed_file_it_refuses(tmp_path, curve) -> None:
    key = _key(tmp_path, "convgate", curve)
    artifact = tmp_path / "model-Q4_K_M.gguf"
    artifact.write_bytes(b"GGUF" + bytes(range(200)) * 50)
    signature = tmp_path / "model.sig"
    signature.write_bytes(oms.sign(key, artifact.name, {oms.SINGLE_FILE: hashlib.sha256(artifact.read_bytes())
                                                        .hexdigest()}))
    verifier = verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "convgate.pub")
    verifier.verify(artifact, signature)
    assert oms.read_signature(signature.read_bytes(), [key.public_key()]).name == artifact.name
    artifact.write_bytes(artifact.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="mismatch"):
        verifier.verify(artifact, signature)


def test_a_split_is_signed_as_the_directory_of_its_shards(tmp_path) -> None:
    key = _key(tmp_path, "convgate")
    shards = tmp_path / "release"
    shards.mkdir()
    digests = {}
    for number in (1, 2):
        shard = shards / f"model-0000{number}-of-00002.gguf"
        shard.write_bytes(bytes([number]) * 1000)
        digests[shard.name] = hashlib.sha256(shard.read_bytes()).hexdigest()
    signature = tmp_path / "split.sig"
    signature.write_bytes(oms.sign(key, "model-00001-of-00002.gguf", digests))
    verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "convgate.pub").verify(shards, signature)


def test_only_the_library_s_curves_are_keys(tmp_path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ed = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(ValueError, match="P-256, P-384 or P-521"):
        oms.load_public_key(ed)
    k1 = ec.generate_private_key(ec.SECP256K1())
    with pytest.raises(ValueError, match="P-256, P-384 or P-521"):
        oms.sign(k1, "x", {".": "0" * 64})
