"""The negative controls travel with the verdict: a real worker runs a real verification submitted through
the API, and the stored report the API returns lists every control and the per-tensor digests - on
Postgres and on the embedded default (SQLite)."""

from __future__ import annotations

import hashlib

import pytest
from fastapi.testclient import TestClient

from engine.digests import sha256_file
from engine.formats.gguf_structure import read_layout
from service.api.app import create_app, no_loops
from service.auth import Role
from service.job import run_verification
from service.persistence import repository
from service.persistence.db import transaction
from tests.conftest import fixtures_root
from tests.service.conftest import add_token, settings_for

pytestmark = pytest.mark.slow
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Platform teams gate every model before it ships."]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


def test_the_stored_report_lists_the_controls_and_tensor_digests(url, tmp_path):
    root = fixtures_root() / "minilm"
    artifact = root / "minilm-Q8_0.gguf"
    settings = settings_for(url, tmp_path, dispatcher="none", file_roots=(fixtures_root(),))
    app = create_app(settings, loops=no_loops)
    submitter, auditor = add_token(url, Role.SUBMITTER, "pipeline"), add_token(url, Role.AUDITOR, "auditor")
    with TestClient(app) as api:
        created = api.post("/v1/verifications", headers={"Authorization": f"Bearer {submitter}"}, json={
            "source_uri": (root / "source").as_uri(), "artifact_uri": artifact.as_uri(),
            "artifact_sha256": sha256_file(artifact), "texts": TEXTS, "gates": [1, 2, 3]})
        assert created.status_code == 202, created.text
        verification_id = created.json()["id"]
        with transaction(app.state.session_factory) as session:
            attempt = repository.claim(session, verification_id, "test-dispatcher").attempt
        assert run_verification(settings, verification_id, "worker-1", attempt) == 0
        report = api.get(f"/v1/verifications/{verification_id}/report",
                         headers={"Authorization": f"Bearer {auditor}"}).json()
    assert report["verdict"] == "GO", report["blockers"]
    controls = report["controls"]
    assert [(c["gate"], c["check"]) for c in controls] == [
        ("storage", "tensor values"), ("storage", "tensor values"), ("runtime", "tokenizer ids"),
        ("runtime", "embeddings"), ("release", "release digest")]
    assert {c["outcome"] for c in controls} == {"detected"}
    assert all(c["detected_by"] and c["defect"] and c["location"] and c["seconds"] >= 0 for c in controls)
    assert 0 < report["timings"]["controls_share"] < 0.10
    layout = read_layout(artifact)
    with artifact.open("rb") as handle:
        first = layout.tensors[0]
        handle.seek(first.offset)
        expected = hashlib.sha256(handle.read(first.nbytes)).hexdigest()
    rows = {row["gguf_name"]: row for row in report["gates"]["storage"]["details"]["tensors"]}
    assert rows[first.name]["data_sha256"] == expected
    assert all(len(row["data_sha256"]) == 64 for row in rows.values())
