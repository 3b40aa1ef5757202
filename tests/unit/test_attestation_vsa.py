"""The SLSA Verification Summary Attestation of a verdict (issue 25, item 1, first step: the statement and its
signature; not yet served): its fields as SLSA defines them, and its signature checked by securesystemslib's
own DSSE verification, not convgate's."""

from __future__ import annotations

import base64
import copy
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError

from service.attestations import Attested, SigningKey, sign_payload
from service.attestations.keys import sslib_key
from service.attestations.vsa import VERIFIER_ID, VSA_PREDICATE_TYPE, build_vsa, vsa_payload
from tests.unit.attestation_reports import report, write_files

MOMENT = datetime(2026, 12, 2, 14, 0, tzinfo=timezone(timedelta(hours=2)))


def attested(tmp_path: Path, verdict: str = "GO") -> Attested:
    produced = report(write_files(tmp_path), verdict=verdict)
    return Attested(verification_id="0b5f3f1e-0000-4000-8000-000000000002", report=produced, verdict_at=MOMENT,
                    policy_origin="configured:default", artifact_uri="https://hub.example/m.gguf",
                    artifact_sha256="f" * 64)


def test_a_go_verdict_is_passed_with_the_levels_of_the_gates_that_passed(tmp_path):
    given = attested(tmp_path)
    statement = json.loads(vsa_payload(build_vsa(given)))
    predicate = statement["predicate"]
    artifact = given.report["artifact"]
    assert statement["_type"] == "https://in-toto.io/Statement/v1" and statement["predicateType"] == VSA_PREDICATE_TYPE
    assert statement["subject"] == [{"name": artifact["uri"], "digest": {"sha256": artifact["sha256"]}}]
    assert predicate["verifier"]["id"] == VERIFIER_ID and predicate["verifier"]["version"]
    assert predicate["timeVerified"] == "2026-12-02T12:00:00Z"  # UTC, whatever the stored offset
    assert predicate["resourceUri"] == artifact["uri"]
    assert predicate["policy"] == {"uri": "urn:convgate:policy:configured:default:v1",
                                   "digest": {"sha256": given.report["policy"]["sha256"]}}
    assert predicate["verificationResult"] == "PASSED"
    assert predicate["verifiedLevels"] == ["CONVGATE_STORAGE_V1", "CONVGATE_RUNTIME_V1"]  # release did not run
    assert predicate["inputAttestations"] == [] and predicate["slsaVersion"] == "1.0"


def test_a_no_go_verdict_is_failed_with_no_level(tmp_path):
    predicate = build_vsa(attested(tmp_path, "NO-GO")).predicate
    assert (predicate.verificationResult, predicate.verifiedLevels) == ("FAILED", [])


def test_a_report_without_its_policy_hash_gets_no_vsa(tmp_path):
    given = attested(tmp_path)
    del given.report["policy"]["sha256"]
    with pytest.raises(ValueError, match="no policy hash"):
        build_vsa(given)


def test_securesystemslib_verifies_the_signed_vsa_and_refuses_a_changed_one(tmp_path):
    key = SigningKey.generate()
    envelope = sign_payload(vsa_payload(build_vsa(attested(tmp_path))), key)
    trusted = [sslib_key(key.public)]

    def parsed(data: dict) -> Envelope:
        return Envelope.from_dict(copy.deepcopy(data))  # the library consumes the dict it reads

    parsed(envelope).verify(trusted, 1)  # raises if it does not verify
    changed = json.loads(base64.b64decode(envelope["payload"]))
    changed["predicate"]["verificationResult"] = "FAILED"
    forged = dict(envelope, payload=base64.b64encode(json.dumps(changed).encode()).decode())
    with pytest.raises(VerificationError):
        parsed(forged).verify(trusted, 1)
    with pytest.raises(VerificationError):
        parsed(envelope).verify([sslib_key(SigningKey.generate().public)], 1)


def test_convgate_attestation_verify_checks_a_vsa_and_its_subject(tmp_path):
    from typer.testing import CliRunner

    from service.attestations import public_pem
    from service.cli import app

    key = SigningKey.generate()
    given = attested(tmp_path)
    envelope_file, key_file = tmp_path / "vsa.json", tmp_path / "pub.pem"
    envelope_file.write_text(json.dumps(sign_payload(vsa_payload(build_vsa(given)), key)))
    key_file.write_text(public_pem(key.public))
    artifact = tmp_path / "model-Q8_0.gguf"
    run = CliRunner().invoke(app, ["attestation", "verify", str(envelope_file), "--key", str(key_file),
                                   "--subject", str(artifact)])
    assert run.exit_code == 0, run.output
    assert "SLSA verification summary PASSED" in run.stdout and "1 local file(s) match" in run.stdout
    refused = CliRunner().invoke(app, ["attestation", "verify", str(envelope_file), "--key", str(key_file),
                                       "--tensors", str(artifact)])
    assert refused.exit_code == 1 and "names no tensors" in refused.stderr
    artifact.write_bytes(artifact.read_bytes() + b"\0")
    changed = CliRunner().invoke(app, ["attestation", "verify", str(envelope_file), "--key", str(key_file),
                                       "--subject", str(artifact)])
    assert changed.exit_code == 1
    other = tmp_path / "other.pem"
    other.write_text(public_pem(SigningKey.generate().public))
    assert CliRunner().invoke(app, ["attestation", "verify", str(envelope_file), "--key", str(other)]).exit_code == 1
