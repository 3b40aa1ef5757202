"""OpenSSF Model Signing signatures (`engine/oms.py`) against the `model-signing` library itself: what the
library signs is read here (good, tampered, wrong key, a file it does not cover, a forged payload), and
what convgate signs the library's own verifier accepts, for one file and for a split's shards."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from model_signing import hashing, signing, verifying

from engine import oms


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


def _rebuilt(bundle: bytes, *, document=None, statement=None, key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    """`bundle` with its document or statement changed by the given functions, re-signed by `key` when given
    (so the change is signed, and only the statement's own checks can refuse it)."""
    parsed = json.loads(bundle)
    envelope = parsed["dsseEnvelope"]
    if statement is not None:
        payload = json.loads(base64.b64decode(envelope["payload"]))
        statement(payload)
        encoded = json.dumps(payload).encode()
        envelope["payload"] = base64.b64encode(encoded).decode()
        if key is not None:
            signature = key.sign(oms._pae(encoded), ec.ECDSA(hashes.SHA256()))
            envelope["signatures"][0]["sig"] = base64.b64encode(signature).decode()
    if document is not None:
        document(parsed)
    return json.dumps(parsed).encode()


SIGNER = ec.generate_private_key(ec.SECP256R1())
SIGNED = oms.sign(SIGNER, "model", {"config.json": "a" * 64, "weights.bin": "b" * 64})


def _set(path: tuple[str, ...], value):
    def change(target: dict) -> None:
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize(("document", "message"), [
    (_set(("mediaType",), "application/json"), f"not an OMS signature: media type is not {oms.BUNDLE_MEDIA_TYPE}"),
    (_set(("dsseEnvelope",), []), "not an OMS signature: no dsseEnvelope (dict)"),
    (_set(("dsseEnvelope", "payloadType"), "text/plain"), f"not an OMS signature: payload type is not "
                                                          f"{oms.PAYLOAD_TYPE}"),
    (_set(("dsseEnvelope", "signatures"), []), "an OMS signature carries exactly one signature"),
    (lambda d: d["dsseEnvelope"]["signatures"].append({"sig": ""}), "an OMS signature carries exactly one signature"),
    (_set(("dsseEnvelope", "payload"), "not base64!"), "the signature's payload or signature is not base64"),
    (_set(("dsseEnvelope", "payload"), "e30=e30="), "the signature's payload or signature is not base64"),
    (_set(("dsseEnvelope", "signatures", 0, "sig"), "AAAA*"), "the signature's payload or signature is not base64"),
    (_set(("dsseEnvelope", "signatures", 0, "sig"), 7), "not an OMS signature: no sig (str)"),
])
def test_each_malformed_envelope_is_refused_with_its_reason(document, message) -> None:
    with pytest.raises(oms.SignatureInvalidError) as refused:
        oms.read_signature(_rebuilt(SIGNED, document=document), [SIGNER.public_key()])
    assert str(refused.value) == message


@pytest.mark.parametrize(("statement", "message"), [
    (_set(("_type",), "https://in-toto.io/Statement/v0.1"), f"the signed statement is not an in-toto statement of "
                                                              f"{oms.PREDICATE_TYPE}"),
    (_set(("predicateType",), "https://slsa.dev/provenance/v1"), f"the signed statement is not an in-toto statement "
                                                                 f"of {oms.PREDICATE_TYPE}"),
    (_set(("predicate", "serialization", "method"), "shards"), "only whole-file sha256 signatures are read (the "
                                                               "library's default); this one is 'shards'/'sha256'"),
    (_set(("predicate", "serialization", "hash_type"), "blake3"), "only whole-file sha256 signatures are read (the "
                                                                  "library's default); this one is 'files'/'blake3'"),
    (_set(("predicate", "resources", 0, "algorithm"), "blake3"), "'config.json': not a sha256 digest"),
    (_set(("predicate", "resources", 0, "digest"), "A" * 64), "'config.json': not a sha256 digest"),
    (_set(("predicate", "resources", 0, "digest"), "a" * 63), "'config.json': not a sha256 digest"),
    (_set(("predicate", "resources", 0, "digest"), "a" * 63 + "g"), "'config.json': not a sha256 digest"),
    (_set(("predicate", "resources", 1, "name"), "config.json"), "the signature names a file twice"),
    (_set(("subject", 0, "digest", "sha256"), "c" * 64), "the signature's subject digest does not match its files"),
    (lambda s: s["subject"].append(s["subject"][0]), "the signature's subject digest does not match its files"),
])
def test_each_signed_but_malformed_statement_is_refused_with_its_reason(statement, message) -> None:
    with pytest.raises(oms.SignatureInvalidError) as refused:
        oms.read_signature(_rebuilt(SIGNED, statement=statement, key=SIGNER), [SIGNER.public_key()])
    assert str(refused.value) == message


def test_a_statement_that_is_not_json_is_refused_after_its_signature_verified() -> None:
    payload = b"not json"
    signature = SIGNER.sign(oms._pae(payload), ec.ECDSA(hashes.SHA256()))
    bundle = _rebuilt(SIGNED, document=lambda d: d["dsseEnvelope"].update(
        payload=base64.b64encode(payload).decode(), signatures=[{"sig": base64.b64encode(signature).decode()}]))
    with pytest.raises(oms.SignatureInvalidError) as refused:
        oms.read_signature(bundle, [SIGNER.public_key()])
    assert str(refused.value) == "the signed statement is not JSON"


def test_the_size_limit_is_inclusive_and_every_trusted_key_is_tried() -> None:
    padded = SIGNED + b" " * (oms.MAX_BUNDLE_BYTES - len(SIGNED))
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    manifest = oms.read_signature(padded, [other, SIGNER.public_key()])
    assert (manifest.name, manifest.signer) == ("model", oms.key_id(SIGNER.public_key()))
    assert dict(manifest.files) == {"config.json": "a" * 64, "weights.bin": "b" * 64}
    with pytest.raises(oms.SignatureInvalidError) as refused:
        oms.read_signature(padded + b" ", [SIGNER.public_key()])
    assert str(refused.value) == "the signature file is over 16 MiB"
    with pytest.raises(oms.SignatureInvalidError) as none:
        oms.read_signature(SIGNED, [])
    assert str(none.value) == "no signing key is trusted (the operator configures them)"


def test_only_top_level_repository_metadata_is_exempt() -> None:
    manifest = oms.SignedManifest(signer="", name="m", files={"a": "1" * 64, ".gitattributes": "2" * 64})
    read = {"a": "1" * 64, ".git/config": "3" * 64, ".github/workflow.yml": "3" * 64, ".gitignore": "3" * 64,
            ".gitattributes": "4" * 64, "sub/.gitignore": "3" * 64, "gitfoo": "3" * 64}
    assert oms.uncovered(manifest, read) == [
        ".gitattributes differs from the signed file (sha256 " + "4" * 64 + ", signed " + "2" * 64 + ")",
        "gitfoo is not covered by the signature", "sub/.gitignore is not covered by the signature"]


def test_what_convgate_signs_is_the_library_s_layout_exactly() -> None:
    bundle = json.loads(SIGNED)
    assert bundle["mediaType"] == oms.BUNDLE_MEDIA_TYPE
    assert bundle["verificationMaterial"] == {"publicKey": {"hint": oms.key_id(SIGNER.public_key())},
                                              "tlogEntries": []}
    assert bundle["dsseEnvelope"]["signatures"][0]["keyid"] == ""
    payload = base64.b64decode(bundle["dsseEnvelope"]["payload"])
    statement = json.loads(payload)
    assert payload == json.dumps(statement, separators=(",", ":"), sort_keys=True).encode()  # canonical bytes
    assert statement["predicate"]["serialization"] == {
        "method": "files", "hash_type": "sha256", "allow_symlinks": False, "ignore_paths": sorted(oms.GIT_METADATA)}
    assert [r["name"] for r in statement["predicate"]["resources"]] == ["config.json", "weights.bin"]


def test_a_refused_key_says_which_kinds_are_keys() -> None:
    with pytest.raises(ValueError) as sign_refused:
        oms.sign(ec.generate_private_key(ec.SECP256K1()), "x", {".": "0" * 64})
    assert str(sign_refused.value) == "an OMS key is an ECDSA P-256, P-384 or P-521 key"
    pem = ec.generate_private_key(ec.SECP256K1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(ValueError) as load_refused:
        oms.load_public_key(pem.decode())
    assert str(load_refused.value) == "an OMS key is an ECDSA P-256, P-384 or P-521 public key (PEM)"
