"""Issue 13 item 1, tensor by tensor: the per-tensor data digests the engine writes into a real report
reach the attestation, and a recipient's copy of the GGUF is checked tensor by tensor against them
(`convgate attestation verify --tensors FILE.gguf`), whatever the file's whole-file digest."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.formats.gguf_structure import read_layout
from engine.policy import Policy
from engine.verification import LocalInputs, VerifyRequest, verify
from service.attestations import Attested, SigningKey, build_statement, check_tensors, public_pem, sign_statement
from service.cli import app
from tests.fuzz.hostile import write_honest_pair


@pytest.fixture
def verified(tmp_path: Path):
    source, artifact = write_honest_pair(tmp_path)
    report = verify(VerifyRequest(gates=frozenset({1})), LocalInputs(source=source, artifact=artifact), Policy())
    produced = report.model_dump(mode="json")
    key = SigningKey.generate()
    statement = build_statement(Attested(
        verification_id="v-1", report=produced, verdict_at=datetime(2026, 11, 30, tzinfo=UTC),
        policy_origin="configured:default", artifact_uri=produced["artifact"]["uri"],
        artifact_sha256=produced["artifact"]["sha256"]), key.keyid)
    return statement, artifact, key


def test_the_engine_s_tensor_digests_are_the_bytes_in_the_file(verified):
    statement, artifact, _ = verified
    layout = read_layout(artifact)
    data = artifact.read_bytes()
    expected = {t.name: hashlib.sha256(data[t.offset:t.offset + t.nbytes]).hexdigest() for t in layout.tensors}
    assert statement.predicate.tensor_data_sha256 == expected and expected
    assert statement.predicate.tensors_without_digest == []
    assert check_tensors(statement, artifact) == []


def test_a_changed_tensor_is_named(verified):
    statement, artifact, _ = verified
    tensor = read_layout(artifact).tensors[0]
    data = bytearray(artifact.read_bytes())
    data[tensor.offset + 3] ^= 0x01
    artifact.write_bytes(bytes(data))
    problems = check_tensors(statement, artifact)
    assert len(problems) == 1 and tensor.name in problems[0] and "sha256" in problems[0]


def test_the_cli_checks_tensors_and_refuses_an_unreadable_gguf(verified, tmp_path):
    statement, artifact, key = verified
    (tmp_path / "att.json").write_text(json.dumps(sign_statement(statement, key)))
    (tmp_path / "pub.pem").write_text(public_pem(key.public))
    args = ["attestation", "verify", str(tmp_path / "att.json"), "--key", str(tmp_path / "pub.pem")]
    result = CliRunner().invoke(app, [*args, "--tensors", str(artifact)])
    assert result.exit_code == 0, result.output
    assert "1 tensor(s) match" in result.stdout
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x00")
    result = CliRunner().invoke(app, [*args, "--tensors", str(tmp_path / "junk.gguf")])
    assert result.exit_code == 1 and "junk.gguf" in result.stderr
