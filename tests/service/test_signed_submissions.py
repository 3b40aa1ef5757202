"""Publishers' signatures through the service (issue 25 item 3): a submission names a signature and its
sha256, never a key; the operator's publisher keys are fixed into the stored request at admission; a real
worker checks the trained MiniLM source against them; the verdict, its VSA and the access to it carry
the signature. A key file the operator got wrong is a 503, not a verdict."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi.testclient import TestClient
from model_signing import signing

from engine.digests import sha256_file
from service.api.app import create_app, no_loops
from service.auth import Role
from service.job import run_verification
from service.persistence import repository
from service.persistence.db import transaction
from tests.conftest import fixtures_root
from tests.service.conftest import add_token, settings_for


def _publisher(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "publisher.pem", tmp_path / "publisher.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _body(root: Path, signature: Path, **extra: object) -> dict[str, object]:
    artifact = root / "minilm-Q8_0.gguf"
    return {"source_uri": (root / "source").as_uri(), "artifact_uri": artifact.as_uri(),
            "artifact_sha256": sha256_file(artifact), "gates": [1],
            "source_signature_uri": signature.as_uri(), "source_signature_sha256": sha256_file(signature)} | extra


@pytest.fixture(params=["sqlite", "postgres"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


@pytest.mark.slow
def test_a_signed_source_is_checked_by_the_worker_with_the_operators_keys(url, tmp_path):
    root = fixtures_root() / "minilm"
    private, public = _publisher(tmp_path)
    signature = tmp_path / "signatures" / "source.sig"
    signature.parent.mkdir()
    signing.Config().use_elliptic_key_signer(private_key=private).sign(root / "source", signature)
    settings = settings_for(url, tmp_path, dispatcher="none", file_roots=(fixtures_root(), signature.parent),
                            publisher_key_files=(public,))
    app = create_app(settings, loops=no_loops)
    submitter = {"Authorization": f"Bearer {add_token(url, Role.SUBMITTER, 'pipeline')}"}
    with TestClient(app) as api:
        created = api.post("/v1/verifications", headers=submitter, json=_body(root, signature))
        assert created.status_code == 202, created.text
        verification_id = created.json()["id"]
        with transaction(app.state.session_factory) as session:
            stored = repository.get_verification(session, verification_id)
            assert stored is not None and stored.request["trusted_signers"] == [public.read_text()]
            attempt = repository.claim(session, verification_id, "test-dispatcher").attempt
        assert run_verification(settings, verification_id, "worker-1", attempt) == 0
        report = api.get(f"/v1/verifications/{verification_id}/report", headers=submitter).json()
        vsa = api.get(f"/v1/verifications/{verification_id}/attestation", params={"predicate": "vsa"},
                      headers=submitter).json()
    assert report["verdict"] == "GO", report["blockers"]
    assert [(s["of"], s["uri"], s["sha256"]) for s in report["signatures"]] == [
        ("source", signature.as_uri(), sha256_file(signature))]
    statement = json.loads(base64.b64decode(vsa["payload"]))
    assert statement["predicate"]["inputAttestations"] == [
        {"uri": signature.as_uri(), "digest": {"sha256": sha256_file(signature)}}]


def test_a_signature_needs_its_digest_and_a_readable_publisher_key(sqlite_url, tmp_path):
    root = tmp_path / "models"
    (root / "source").mkdir(parents=True)
    (root / "minilm-Q8_0.gguf").write_bytes(b"GGUF")
    signature = root / "source.sig"
    signature.write_text("{}")
    broken = tmp_path / "broken.pub"
    broken.write_text("not a key")
    token = {"Authorization": f"Bearer {add_token(sqlite_url, Role.SUBMITTER, 'pipeline')}"}
    settings = settings_for(sqlite_url, tmp_path, dispatcher="none", file_roots=(root,), publisher_key_files=(broken,))
    with TestClient(create_app(settings, loops=no_loops)) as api:
        unpinned = _body(root, signature)
        del unpinned["source_signature_sha256"]
        refused = api.post("/v1/verifications", headers=token, json=unpinned)
        assert refused.status_code == 422 and "go together" in refused.text
        outside = api.post("/v1/verifications", headers=token, json=_body(root, signature) | {
            "source_signature_uri": (tmp_path / "elsewhere.sig").as_uri()})
        assert outside.status_code == 422, outside.text  # the URI policy's file roots hold for signatures too
        unreadable = api.post("/v1/verifications", headers=token, json=_body(root, signature))
        assert unreadable.status_code == 503 and unreadable.json()["code"] == "attestation.key_unusable"
        unsigned = api.post("/v1/verifications", headers=token, json={
            key: value for key, value in _body(root, signature).items() if "signature" not in key})
        assert unsigned.status_code == 202, unsigned.text  # no signature named: no key is read
        assert "trusted_signers" not in api.get(f"/v1/verifications/{unsigned.json()['id']}", headers=token).text
