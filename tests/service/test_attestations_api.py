"""Issue 13 item 1 through the API, on Postgres and on the embedded default (SQLite): a verdict's
attestation is signed on first request, stored, returned identical ever after (even once the signing
key has rotated), visible exactly as the verification is, and verifies offline with the CLI against
the real files."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from typer.testing import CliRunner

from service.api.app import create_app, no_loops
from service.attestations import SigningKey, load_signing_key
from service.auth import Role
from service.cli import app as cli
from service.persistence import attestations, repository
from service.persistence.db import transaction
from service.persistence.models import AccessLogRecord, Attestation
from tests.service.conftest import add_token, settings_for
from tests.unit.attestation_reports import ReportFiles, report, write_files


@pytest.fixture(params=["postgres", "sqlite"])
def database(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


@pytest.fixture
def files(tmp_path: Path) -> ReportFiles:
    return write_files(tmp_path / "models")


def client_for(url: str, tmp_path: Path, **overrides) -> TestClient:
    settings = settings_for(url, tmp_path, allow_file_uris=True, file_roots=(tmp_path / "models",), **overrides)
    return TestClient(create_app(settings, loops=no_loops))


@pytest.fixture
def api(database, tmp_path):
    tokens = {"submitter": add_token(database, Role.SUBMITTER), "other": add_token(database, Role.SUBMITTER),
              "auditor": add_token(database, Role.AUDITOR)}
    with client_for(database, tmp_path) as client:
        client.tokens = tokens
        yield client


def headers(api, who: str = "submitter") -> dict[str, str]:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submitted(api, files: ReportFiles) -> str:
    body = {"source_uri": (files.artifact.parent / "source").as_uri(), "artifact_uri": files.artifact.as_uri(),
            "artifact_sha256": report(files)["artifact"]["sha256"]}
    response = api.post("/v1/verifications", json=body, headers=headers(api))
    assert response.status_code == 202, response.text
    return response.json()["id"]


def complete(api, verification_id: str, files: ReportFiles, changes: dict | None = None) -> None:
    with transaction(api.app.state.session_factory) as session:
        claimed = repository.claim(session, verification_id, "test")
        assert claimed is not None
        assert repository.start_attempt(session, verification_id, "test", attempt=claimed.attempt) is not None
        produced = report(files, reverse=True) | (changes or {})
        assert repository.record_verdict(session, verification_id, claimed.attempt, produced, worker="test")


def attestation(api, verification_id: str, who: str = "submitter", **extra):
    return api.get(f"/v1/verifications/{verification_id}/attestation", headers=headers(api, who) | extra)


def test_the_attestation_verifies_offline_against_the_real_files(api, files, tmp_path, monkeypatch):
    created = submitted(api, files)
    conflict = attestation(api, created)
    assert conflict.status_code == 409 and "no verdict yet" in conflict.json()["detail"]
    complete(api, created, files)
    first = attestation(api, created)
    assert first.status_code == 200 and first.headers["content-type"] == "application/json"
    second = attestation(api, created, "auditor", Accept="application/vnd.dsse.envelope.v1+json")
    assert second.headers["content-type"] == "application/vnd.dsse.envelope.v1+json"
    assert second.content == first.content  # the stored envelope, byte for byte
    (tmp_path / "att.json").write_bytes(first.content)
    monkeypatch.setenv("CONVGATE_CACHE_DIR", str(api.app.state.settings.cache_dir))
    shown = CliRunner().invoke(cli, ["keys", "show", "--json"])
    (tmp_path / "pub.pem").write_text(json.loads(shown.stdout)["public_key_pem"])
    subjects = [arg for path in files.all for arg in ("--subject", str(path))]
    result = CliRunner().invoke(cli, ["attestation", "verify", str(tmp_path / "att.json"),
                                      "--key", str(tmp_path / "pub.pem"), *subjects, "--json"])
    assert result.exit_code == 0, result.output
    predicate = json.loads(result.stdout)["statement"]["predicate"]
    assert predicate["verification_id"] == created and predicate["verdict"] == "GO"
    files.artifact.write_bytes(files.artifact.read_bytes() + b"\x00")  # one byte appended: refused
    result = CliRunner().invoke(cli, ["attestation", "verify", str(tmp_path / "att.json"),
                                      "--key", str(tmp_path / "pub.pem"), "--subject", str(files.artifact)])
    assert result.exit_code == 1 and "model-Q8_0.gguf: sha256" in result.stderr


def test_visibility_follows_the_verification_and_reads_are_logged(api, files):
    created = submitted(api, files)
    complete(api, created, files)
    assert attestation(api, created, "other").status_code == 404  # another submitter's
    missing = api.get("/v1/verifications/00000000-0000-4000-8000-000000000000/attestation", headers=headers(api))
    assert missing.status_code == 404
    assert api.get(f"/v1/verifications/{created}/attestation").status_code == 401
    assert attestation(api, created, "auditor").status_code == 200
    with transaction(api.app.state.session_factory) as session:
        logged = session.scalars(select(AccessLogRecord.principal).where(
            AccessLogRecord.action == "read_attestation")).all()
        assert len(logged) == 1 and logged[0].startswith("auditor")


def test_a_rotated_key_does_not_change_what_was_signed(api, database, files, tmp_path):
    created = submitted(api, files)
    complete(api, created, files)
    before = attestation(api, created)
    rotated = tmp_path / "new.pem"
    rotated.write_bytes(SigningKey.generate().private_pem())
    with client_for(database, tmp_path, signing_key_file=rotated) as after:
        again = after.get(f"/v1/verifications/{created}/attestation", headers=headers(api))
        assert again.content == before.content
        later = submitted(api, files)
        complete(api, later, files)
        newer = after.get(f"/v1/verifications/{later}/attestation", headers=headers(api)).json()
    new_keyid = load_signing_key(rotated).keyid
    assert [s["keyid"] for s in newer["signatures"]] == [new_keyid] != [s["keyid"] for s in before.json()["signatures"]]
    with transaction(api.app.state.session_factory) as session:
        assert session.scalar(select(func.count()).select_from(Attestation)) == 2
    broken = tmp_path / "broken.pem"
    broken.write_text("not a key")
    with client_for(database, tmp_path, signing_key_file=broken) as unsigned:  # stored: no key needed
        assert unsigned.get(f"/v1/verifications/{created}/attestation", headers=headers(api)).content == before.content


def test_an_artifact_never_fetched_is_attested_by_the_submitted_digest(api, files):
    created = submitted(api, files)
    complete(api, created, files, {"verdict": "NO-GO", "artifact": None, "files": [],
                                   "blockers": [{"code": "artifact.sha256_mismatch", "gate": "input", "why": "x"}]})
    statement = json.loads(base64.b64decode(attestation(api, created).json()["payload"]))
    assert statement["subject"] == [{"name": files.artifact.as_uri(),
                                     "digest": {"sha256": report(files)["artifact"]["sha256"]}}]
    assert statement["predicate"]["blocker_codes"] == ["artifact.sha256_mismatch"]


def test_a_second_store_keeps_the_first_envelope(api, files):
    created = submitted(api, files)
    with transaction(api.app.state.session_factory) as session:
        assert attestations.store_once(session, created, "a" * 64, {"first": True}) == {"first": True}
    with transaction(api.app.state.session_factory) as session:
        assert attestations.store_once(session, created, "b" * 64, {"second": True}) == {"first": True}
        assert session.scalar(select(func.count()).select_from(Attestation)) == 1


def test_an_unloadable_signing_key_is_a_503_that_says_so(database, files, tmp_path):
    token = add_token(database, Role.SUBMITTER)
    broken = tmp_path / "broken.pem"
    broken.write_text("not a key")
    with client_for(database, tmp_path, signing_key_file=broken) as client:
        client.tokens = {"submitter": token}
        created = submitted(client, files)
        complete(client, created, files)
        response = attestation(client, created)
    assert response.status_code == 503 and "signing key" in response.json()["detail"]


def test_the_vsa_is_served_signed_by_the_same_key_and_securesystemslib_verifies_it(api, files):
    """issue 25 item 1: `?predicate=vsa` is the SLSA Verification Summary of the same verdict, checked here by
    securesystemslib's own DSSE verification against the key `convgate keys show` prints."""
    import base64
    import copy

    from securesystemslib.dsse import Envelope

    from service.attestations import active_signing_key
    from service.attestations.keys import sslib_key

    created = submitted(api, files)
    vsa = api.get(f"/v1/verifications/{created}/attestation", params={"predicate": "vsa"}, headers=headers(api))
    assert vsa.status_code == 409  # no verdict yet
    complete(api, created, files)
    first = api.get(f"/v1/verifications/{created}/attestation", params={"predicate": "vsa"}, headers=headers(api))
    again = api.get(f"/v1/verifications/{created}/attestation", params={"predicate": "vsa"},
                    headers=headers(api, "auditor"))
    assert first.status_code == 200 and first.content == again.content  # deterministic for one key
    envelope = first.json()
    key = active_signing_key(api.app.state.settings)
    Envelope.from_dict(copy.deepcopy(envelope)).verify([sslib_key(key.public)], 1)
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == "https://slsa.dev/verification_summary/v1"
    assert statement["predicate"]["verificationResult"] == "PASSED"
    assert statement["subject"][0]["digest"]["sha256"] == report(files)["artifact"]["sha256"]
    assert api.get(f"/v1/verifications/{created}/attestation", params={"predicate": "other"},
                   headers=headers(api)).status_code == 422


def _model_signing_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The model-signing library's own command, as a platform runs it."""
    command = shutil.which("model_signing", path=str(Path(sys.executable).parent)) or shutil.which("model_signing")
    assert command, "model-signing is a dev dependency: its model_signing command must be installed"
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=120, check=False)


def test_a_go_artifact_is_signed_in_oms_and_the_librarys_own_verifier_accepts_only_its_bytes(api, files, tmp_path):
    """issue 25 item 2: the signature of a GO artifact, served like its attestation, verifies with
    `model_signing verify key` against the key `convgate keys show --model-signing` prints, and refuses a
    changed artifact and another key."""
    from service.attestations.oms import model_signing_key, public_pem

    created = submitted(api, files)
    assert api.get(f"/v1/verifications/{created}/signature", headers=headers(api)).status_code == 409  # no verdict
    complete(api, created, files)
    assert api.get(f"/v1/verifications/{created}/signature", headers=headers(api, "other")).status_code == 404
    response = api.get(f"/v1/verifications/{created}/signature", headers=headers(api, "auditor"))
    assert response.status_code == 200, response.text
    assert response.headers["content-disposition"] == f'attachment; filename="{files.artifact.name}.sig"'
    signature, public = tmp_path / "artifact.sig", tmp_path / "convgate.pub"
    signature.write_bytes(response.content)
    public.write_text(public_pem(model_signing_key(api.app.state.settings).public_key()))
    accepted = _model_signing_cli("verify", "key", str(files.artifact), "--signature", str(signature),
                                  "--public_key", str(public))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    changed = tmp_path / "changed" / files.artifact.name
    changed.parent.mkdir()
    changed.write_bytes(files.artifact.read_bytes()[:-1] + bytes([files.artifact.read_bytes()[-1] ^ 1]))
    refused = _model_signing_cli("verify", "key", str(changed), "--signature", str(signature),
                                 "--public_key", str(public))
    assert refused.returncode != 0 and "Verification succeeded" not in refused.stdout
    other = tmp_path / "other.pub"
    other.write_text(public_pem(ec.generate_private_key(ec.SECP256R1()).public_key()))
    wrong_key = _model_signing_cli("verify", "key", str(files.artifact), "--signature", str(signature),
                                   "--public_key", str(other))
    assert wrong_key.returncode != 0


def test_a_no_go_artifact_is_not_signed(api, files):
    created = submitted(api, files)
    complete(api, created, files, {"verdict": "NO-GO", "blockers": [
        {"code": "gguf.truncated", "gate": "storage", "why": "cut short"}]})
    response = api.get(f"/v1/verifications/{created}/signature", headers=headers(api))
    assert response.status_code == 409 and "only a GO artifact is signed" in response.json()["detail"]


def test_an_unloadable_model_signing_key_is_a_503_and_an_ed25519_one_is_refused(database, files, tmp_path):
    token = add_token(database, Role.SUBMITTER)
    ed25519 = tmp_path / "ed25519.pem"
    ed25519.write_bytes(SigningKey.generate().private_pem())  # the library's key method refuses Ed25519
    with client_for(database, tmp_path, model_signing_key_file=ed25519) as client:
        client.tokens = {"submitter": token}
        created = submitted(client, files)
        complete(client, created, files)
        response = client.get(f"/v1/verifications/{created}/signature", headers=headers(client))
    assert response.status_code == 503 and "ECDSA P-256" in response.json()["detail"]
