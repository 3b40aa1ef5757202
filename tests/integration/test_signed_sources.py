"""Publishers' signatures on a trained model (issue 25 item 3): all-MiniLM-L6-v2's source and llama.cpp's
Q8_0 conversion of it, signed by the `model-signing` library itself. A good signature by a trusted key is
GO and recorded (report, convgate's predicate, the VSA's inputAttestations); a tampered file, another
key, a file the signature leaves out, or no signature where the policy requires one is NO-GO, named."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from model_signing import hashing, signing

from engine.policy import Policy
from engine.report import Report
from engine.verification import LocalInputs, VerifyRequest, verify
from service.attestations.statement import Attested, build_statement
from service.attestations.vsa import build_vsa
from tests.conftest import codes
from tests.integration.test_cli import convgate, last_line

pytestmark = pytest.mark.slow


def _publisher(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A publisher's key file (PKCS#8) and its public key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = tmp_path / f"{name}.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return private, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _sign(target: Path, key: Path, signature: Path, ignore: tuple[str, ...] = ()) -> Path:
    config = signing.Config().use_elliptic_key_signer(private_key=key)
    if ignore:
        config = config.set_hashing_config(hashing.Config().set_ignored_paths(paths=list(ignore)))
    config.sign(target, signature)
    return signature


def _verify(source: Path, artifact: Path, trusted: tuple[str, ...], *, gates: frozenset[int] = frozenset({1}),
            policy: Policy | None = None, source_signature: Path | None = None,
            artifact_signature: Path | None = None) -> Report:
    inputs = LocalInputs(source=source, artifact=artifact, source_signature=source_signature,
                         artifact_signature=artifact_signature)
    return verify(VerifyRequest(gates=gates, trusted_signers=trusted), inputs, policy or Policy())


@pytest.fixture(scope="module")
def publisher(tmp_path_factory) -> tuple[Path, str]:
    return _publisher(tmp_path_factory.mktemp("keys"), "publisher")


def test_signed_source_and_artifact_of_a_trained_model_are_go_and_recorded(minilm, publisher, tmp_path):
    key, public = publisher
    artifact = minilm / "minilm-Q8_0.gguf"
    source_sig = _sign(minilm / "source", key, tmp_path / "source.sig")
    artifact_sig = _sign(artifact, key, tmp_path / "artifact.sig")
    report = _verify(minilm / "source", artifact, (public,), gates=frozenset({1, 2, 3}),
                     policy=Policy(require_source_signature=True), source_signature=source_sig,
                     artifact_signature=artifact_sig)
    assert report.verdict == "GO", report.blockers
    assert [(s.of, s.files) for s in report.signatures] == [
        ("source", sum(p.is_file() for p in (minilm / "source").rglob("*"))), ("artifact", 1)]
    assert {f.uri for f in report.files} >= {source_sig.as_uri(), artifact_sig.as_uri()}  # digested like inputs
    stored = json.loads(report.model_dump_json())
    attested = Attested(verification_id="v", report=stored, verdict_at=datetime.now(UTC), policy_origin="configured",
                        artifact_uri=artifact.as_uri(), artifact_sha256=stored["artifact"]["sha256"])
    assert [s["uri"] for s in build_statement(attested, "0" * 64).predicate.input_signatures] == [
        source_sig.as_uri(), artifact_sig.as_uri()]
    assert [(d.uri, d.digest.sha256) for d in build_vsa(attested).predicate.inputAttestations] == [
        (s.uri, s.sha256) for s in report.signatures]


def test_a_source_file_changed_after_signing_is_no_go(minilm, publisher, tmp_path):
    key, public = publisher
    source = shutil.copytree(minilm / "source", tmp_path / "source")
    signature = _sign(source, key, tmp_path / "source.sig")
    (source / "README.md").write_text((source / "README.md").read_text() + "\nchanged after signing\n")
    report = _verify(source, minilm / "minilm-Q8_0.gguf", (public,), source_signature=signature)
    assert report.verdict == "NO-GO" and "source.signature_invalid" in codes(report)
    assert "README.md differs from the signed file" in next(
        b.why for b in report.blockers if b.code == "source.signature_invalid")
    assert report.signatures == []


def test_a_signature_by_a_key_the_operator_does_not_trust_is_no_go(minilm, publisher, tmp_path):
    key, _public = publisher
    _other_key, other_public = _publisher(tmp_path, "other")
    signature = _sign(minilm / "source", key, tmp_path / "source.sig")
    report = _verify(minilm / "source", minilm / "minilm-Q8_0.gguf", (other_public,), source_signature=signature)
    assert "source.signature_invalid" in codes(report)
    assert "does not verify with any trusted key" in report.blockers[0].why


def test_a_signature_that_leaves_out_a_file_read_is_no_go(minilm, publisher, tmp_path):
    key, public = publisher
    signature = _sign(minilm / "source", key, tmp_path / "source.sig", ignore=("vocab.txt",))
    report = _verify(minilm / "source", minilm / "minilm-Q8_0.gguf", (public,), source_signature=signature)
    assert "source.signature_invalid" in codes(report)
    assert "vocab.txt is not covered by the signature" in report.blockers[0].why


def test_an_artifact_signature_of_other_bytes_is_no_go(minilm, publisher, tmp_path):
    key, public = publisher
    signature = _sign(minilm / "minilm-Q4_K_M.gguf", key, tmp_path / "artifact.sig")
    report = _verify(minilm / "source", minilm / "minilm-Q8_0.gguf", (public,), artifact_signature=signature)
    assert codes(report) == {"artifact.signature_invalid"}


def test_a_policy_that_requires_a_source_signature_refuses_none(minilm):
    report = _verify(minilm / "source", minilm / "minilm-Q8_0.gguf", (), policy=Policy(require_source_signature=True))
    assert codes(report) == {"source.signature_required"}


def test_the_cli_checks_a_signature_with_the_keys_it_is_given(minilm, publisher, tmp_path):
    key, public = publisher
    signature = _sign(minilm / "source", key, tmp_path / "source.sig")
    trusted = tmp_path / "publisher.pub"
    trusted.write_text(public)
    args = ("--source", minilm / "source", "--artifact", minilm / "minilm-Q8_0.gguf", "--gates", "1",
            "--source-signature", signature)
    good = convgate(*args, "--trusted-signer", trusted)
    assert good.returncode == 0 and last_line(good) == "GO", good.stdout + good.stderr
    untrusted = convgate(*args)
    assert untrusted.returncode == 1 and "source.signature_invalid" in untrusted.stdout
    not_a_key = tmp_path / "not-a-key.pub"
    not_a_key.write_text(public.replace("PUBLIC", "PUBLIK"))
    refused = convgate(*args, "--trusted-signer", not_a_key)
    assert refused.returncode == 2 and "--trusted-signer" in refused.stderr
