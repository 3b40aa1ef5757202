"""A single-file artifact never implies shards (issue 34). The red team submitted `file://roots/esc/model.gguf`,
a symlink to `x-00001-of-00002.gguf`, beside which `x-00002-of-00002.gguf` led outside every root: the worker
found the "sibling" by the resolved name and read it with no root check and no pinned digest (202, the
outside file's sha256, size and first bytes in the report; with a real shard there, GO, though the VSA named
only `model.gguf`). A split is declared with every shard's digest, as the API requires; anything else is one
file, and a file that says it is one shard of several is NO-GO on its own."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from edge.download import FetchPolicy
from edge.inputs import InputUris, fetch_inputs
from edge.store import ContentStore
from edge.uri_policy import UriPolicy
from engine.digests import sha256_file
from engine.formats.artifact_files import artifact_paths
from engine.policy import Policy
from engine.report import Report
from engine.verification import LocalInputs, VerifyRequest
from service.api.app import create_app, no_loops
from service.auth import Role
from service.job import run_verification
from service.persistence import repository
from service.persistence.db import transaction
from tests.conftest import fixtures_root
from tests.gguf_split_writer import resplit
from tests.service.conftest import add_token, settings_for


def _escape(root: Path, outside: Path, second: bytes, first: bytes) -> Path:
    """The red team's layout: model.gguf -> x-00001-of-00002.gguf, whose implied sibling leads outside."""
    esc = root / "esc"
    esc.mkdir(parents=True)
    (esc / "x-00001-of-00002.gguf").write_bytes(first)
    (outside / "x-00002-of-00002.gguf").write_bytes(second)
    (esc / "x-00002-of-00002.gguf").symlink_to(outside / "x-00002-of-00002.gguf")
    (esc / "model.gguf").symlink_to(esc / "x-00001-of-00002.gguf")
    return esc / "model.gguf"


@pytest.fixture(scope="module")
def minilm_halves(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """llama.cpp's Q8_0 MiniLM as two real gguf-split shards (gguf-py)."""
    folder = tmp_path_factory.mktemp("halves")
    return [shard.read_bytes() for shard in resplit(fixtures_root() / "minilm" / "minilm-Q8_0.gguf",
                                                     folder / "m.gguf", 2)]


@pytest.mark.slow
def test_a_single_file_uri_whose_target_is_named_as_a_shard_reads_no_sibling(sqlite_url, tmp_path, minilm_halves):
    root, outside = tmp_path / "roots", tmp_path / "outside"
    outside.mkdir()
    first, second = minilm_halves
    artifact = _escape(root, outside, second, first)
    settings = settings_for(sqlite_url, tmp_path, dispatcher="none", file_roots=(root, fixtures_root()))
    submitter = add_token(sqlite_url, Role.SUBMITTER, "pipeline")
    with TestClient(create_app(settings, loops=no_loops)) as api:
        headers = {"Authorization": f"Bearer {submitter}"}
        created = api.post("/v1/verifications", headers=headers, json={
            "source_uri": (fixtures_root() / "minilm" / "source").as_uri(), "artifact_uri": artifact.as_uri(),
            "artifact_sha256": hashlib.sha256(first).hexdigest(), "gates": [1]})
        assert created.status_code == 202, created.text
        verification_id = created.json()["id"]
        with transaction(api.app.state.session_factory) as session:
            attempt = repository.claim(session, verification_id, "test-dispatcher").attempt
        run_verification(settings, verification_id, "worker-1", attempt)
        report = api.get(f"/v1/verifications/{verification_id}/report", headers=headers).json()
    text = json.dumps(report)
    assert hashlib.sha256(second).hexdigest() not in text and "x-00002-of-00002" not in text
    assert [file["uri"] for file in report["files"] if file["uri"].endswith(".gguf")] == [artifact.as_uri()]
    assert report["verdict"] == "NO-GO"  # the file alone says it is shard 1 of 2: not a model by itself
    assert any(blocker["code"].startswith("artifact.split") for blocker in report["blockers"]), report["blockers"]


def _inputs(tmp_path: Path, artifact: str, roots: tuple[Path, ...]) -> LocalInputs | Report:
    (tmp_path / "source").mkdir(exist_ok=True)
    uris = InputUris(source=(tmp_path / "source").as_uri(), artifact=artifact)
    return fetch_inputs(VerifyRequest(), uris, Policy(), FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=roots)),
                        ContentStore(tmp_path / "store"))


def test_the_engine_is_handed_one_file_however_its_target_is_named(tmp_path):
    root, outside = tmp_path / "roots", tmp_path / "outside"
    outside.mkdir()
    artifact = _escape(root, outside, b"outside bytes", b"GGUF shard one")
    inputs = _inputs(tmp_path, artifact.as_uri(), (root, tmp_path / "source"))
    assert isinstance(inputs, LocalInputs)
    assert artifact_paths(inputs.artifact) == (inputs.artifact,)
    assert inputs.artifact.read_bytes() == b"GGUF shard one"


def test_a_local_split_named_by_its_first_shard_reads_siblings_only_inside_the_roots(tmp_path):
    """The CLI's way (a first shard's path, the others beside it, no digests given): each sibling is judged
    by the roots like any file, here as in the service."""
    root, outside = tmp_path / "roots", tmp_path / "outside"
    outside.mkdir()
    artifact = _escape(root, outside, b"outside bytes", b"GGUF shard one").with_name("x-00001-of-00002.gguf")
    refused = _inputs(tmp_path, artifact.as_uri(), (root, tmp_path / "source"))
    assert isinstance(refused, Report) and refused.verdict == "NO-GO"
    assert "outside the allowed file roots" in refused.blockers[0].why
    inputs = _inputs(tmp_path, artifact.as_uri(), (root, outside, tmp_path / "source"))
    assert isinstance(inputs, LocalInputs)
    assert [path.read_bytes() for path in artifact_paths(inputs.artifact)] == [b"GGUF shard one", b"outside bytes"]
    assert sha256_file(inputs.artifact) == hashlib.sha256(b"GGUF shard one").hexdigest()
