"""The engine's check of publishers' signatures (`engine/signature_check.py`) on small files, every way it
can end: recorded, or NO-GO with the input's own code and a reason that names what is wrong. The same
checks on the trained MiniLM are in tests/integration/test_signed_sources.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from engine import oms
from engine.policy import Policy
from engine.report import FileDigest
from engine.signature_check import SignatureInput, check_signatures

SOURCE_URI = "hf://org/model@" + "a" * 40
KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC = KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                       serialization.PublicFormat.SubjectPublicKeyInfo).decode()
FILES = {"config.json": b"{}", "model.safetensors": b"weights", "sub/extra.bin": b"x"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _source() -> list[FileDigest]:
    return [FileDigest(uri=f"{SOURCE_URI}/{name}", sha256=_sha(data), size=len(data)) for name, data in FILES.items()]


ARTIFACT = [FileDigest(uri="https://cdn.example/m.gguf?sig=secret", sha256=_sha(b"GGUF"), size=4)]


def _signature(tmp_path: Path, files: dict[str, str], name: str = "s.sig", key=KEY) -> Path:
    path = tmp_path / name
    path.write_bytes(oms.sign(key, "model", files))
    return path


def _check(signatures, *, policy: Policy | None = None, pieces=ARTIFACT, trusted=(PUBLIC,)):
    return check_signatures(signatures, trusted, policy or Policy(), pieces=pieces, source_files=_source(),
                            source_uri=SOURCE_URI)


def test_good_signatures_are_recorded_with_their_digest_and_signer(tmp_path) -> None:
    source = _signature(tmp_path, {name: _sha(data) for name, data in FILES.items()}, "source.sig")
    artifact = _signature(tmp_path, {oms.SINGLE_FILE: ARTIFACT[0].sha256}, "artifact.sig")
    outcome = _check([SignatureInput("source", source, "file:///source.sig", _sha(source.read_bytes())),
                      SignatureInput("artifact", artifact, "file:///artifact.sig")],
                     policy=Policy(require_source_signature=True))
    assert outcome.blockers == []
    assert [(c.of, c.uri, c.sha256, c.files) for c in outcome.checks] == [
        ("source", "file:///source.sig", _sha(source.read_bytes()), 3),
        ("artifact", "file:///artifact.sig", _sha(artifact.read_bytes()), 1)]
    assert {c.signer for c in outcome.checks} == {oms.key_id(KEY.public_key())}
    assert [f.uri for f in outcome.files] == ["file:///source.sig", "file:///artifact.sig"]


def test_a_split_artifact_is_covered_shard_by_shard(tmp_path) -> None:
    shards = [FileDigest(uri=f"file:///r/m-0000{n}-of-00002.gguf", sha256=_sha(bytes([n])), size=1) for n in (1, 2)]
    signed = {piece.uri.rsplit("/", 1)[-1]: piece.sha256 for piece in shards}
    good = _check([SignatureInput("artifact", _signature(tmp_path, signed), "file:///a.sig")], pieces=shards)
    assert good.blockers == [] and good.checks[0].files == 2
    one_shard = _check([SignatureInput("artifact", _signature(tmp_path, dict(list(signed.items())[:1]), "b.sig"),
                                       "file:///b.sig")], pieces=shards)
    assert [b.code for b in one_shard.blockers] == ["artifact.signature_invalid"]
    assert "m-00002-of-00002.gguf is not covered" in one_shard.blockers[0].why


@pytest.mark.parametrize(("change", "why"), [
    ({"config.json": "0" * 64}, "config.json differs from the signed file"),
    ({"sub/extra.bin": None}, "sub/extra.bin is not covered by the signature"),
])
def test_a_source_signature_that_does_not_match_what_was_read_is_no_go(tmp_path, change, why) -> None:
    signed = {name: _sha(data) for name, data in FILES.items()} | change
    path = _signature(tmp_path, {name: digest for name, digest in signed.items() if digest is not None})
    outcome = _check([SignatureInput("source", path, "file:///s.sig")])
    assert [b.code for b in outcome.blockers] == ["source.signature_invalid"] and outcome.checks == []
    assert why in outcome.blockers[0].why and outcome.blockers[0].gate == "input"
    assert outcome.files[0].sha256 == _sha(path.read_bytes())  # the refused signature is digested too


def test_more_than_five_problems_are_counted_not_listed(tmp_path) -> None:
    many = [FileDigest(uri=f"{SOURCE_URI}/f{n}", sha256=_sha(bytes([n])), size=1) for n in range(8)]
    path = _signature(tmp_path, {"other": "0" * 64})
    outcome = check_signatures([SignatureInput("source", path, "file:///s.sig")], (PUBLIC,), Policy(), pieces=ARTIFACT,
                               source_files=many, source_uri=SOURCE_URI)
    assert outcome.blockers[0].why.endswith("; and 3 more")


def test_another_key_a_wrong_digest_or_a_missing_file_is_no_go(tmp_path) -> None:
    signed = {name: _sha(data) for name, data in FILES.items()}
    other = _signature(tmp_path, signed, "other.sig", key=ec.generate_private_key(ec.SECP256R1()))
    good = _signature(tmp_path, signed, "good.sig")
    outcomes = {
        "another key": _check([SignatureInput("source", other, "file:///o.sig")]),
        "no trusted key": _check([SignatureInput("source", good, "file:///g.sig")], trusted=()),
        "pinned otherwise": _check([SignatureInput("source", good, "file:///g.sig", "f" * 64)]),
        "not a file": _check([SignatureInput("artifact", tmp_path / "absent.sig", "file:///absent.sig")]),
        "not a key": _check([SignatureInput("source", good, "file:///g.sig")], trusted=("not a key",)),
    }
    reasons = {name: [(b.code, b.why) for b in outcome.blockers] for name, outcome in outcomes.items()}
    assert reasons["another key"] == [("source.signature_invalid",
                                       "the source's signature: the signature does not verify with any trusted key")]
    assert "no signing key is trusted" in reasons["no trusted key"][0][1]
    assert "expected ffff" in reasons["pinned otherwise"][0][1]
    assert reasons["not a file"] == [("artifact.signature_invalid",
                                      "the artifact's signature file:///absent.sig is not a readable file")]
    assert outcomes["not a file"].files == []
    assert reasons["not a key"][0][0] == "source.signature_invalid"
    assert all(outcome.checks == [] for outcome in outcomes.values())


def test_a_policy_that_requires_a_source_signature_refuses_an_artifact_signature_alone(tmp_path) -> None:
    artifact = _signature(tmp_path, {oms.SINGLE_FILE: ARTIFACT[0].sha256})
    outcome = _check([SignatureInput("artifact", artifact, "file:///a.sig")],
                     policy=Policy(require_source_signature=True))
    assert [b.code for b in outcome.blockers] == ["source.signature_required"]
    assert [c.of for c in outcome.checks] == ["artifact"]
    assert _check([]).blockers == [] and _check([]).checks == []


def test_exact_reasons_a_root_with_a_trailing_slash_and_a_named_artifact(tmp_path) -> None:
    five = [FileDigest(uri=f"{SOURCE_URI}/f{n}", sha256=_sha(bytes([n])), size=1) for n in range(5)]
    path = _signature(tmp_path, {"other": "0" * 64})
    outcome = check_signatures([SignatureInput("source", path, "file:///s.sig")], (PUBLIC,), Policy(),
                               pieces=ARTIFACT, source_files=five, source_uri=SOURCE_URI + "/")
    assert outcome.blockers[0].why == "the source's signature does not cover what was read: " + "; ".join(
        f"f{n} is not covered by the signature" for n in range(5))
    required = _check([], policy=Policy(require_source_signature=True)).blockers
    assert [b.why for b in required] == ["the policy requires the source's publisher signature, and none was given"]
    named = _signature(tmp_path, {"m.gguf": ARTIFACT[0].sha256, "n.gguf": _sha(b"n")}, "split.sig")
    pieces = [*ARTIFACT, FileDigest(uri="https://cdn.example/n.gguf?sig=secret", sha256=_sha(b"n"), size=1)]
    assert _check([SignatureInput("artifact", named, "file:///split.sig")], pieces=pieces).blockers == []
