"""A gguf-split artifact submitted through the API: its first shard's URI and every shard's digest.

End to end (real worker, SQLite and Postgres): the trained SmolLM2's Q4_K_M as 3 shards is GO on all three
gates, the stored report digests every shard, and the attestation names each shard as a subject. A tampered
shard is NO-GO naming it. Submissions that do not pin a split whole are refused with a 422 saying why.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine.digests import sha256_file
from service.api.app import create_app, no_loops
from service.auth import Role
from service.job import run_verification
from service.persistence import repository
from service.persistence.db import transaction
from tests.conftest import fixtures_root
from tests.gguf_split_writer import resplit
from tests.service.conftest import add_token, settings_for

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Platform teams gate every model before it ships."]


@pytest.fixture(scope="module")
def smollm2_split(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("split")
    return resplit(fixtures_root() / "smollm2" / "smollm2-Q4_K_M.gguf", folder / "smollm2-Q4_K_M.gguf", 3)


def body(shards: list[Path], **changes: object) -> dict:
    digests = [sha256_file(shard) for shard in shards]
    return {"source_uri": (fixtures_root() / "smollm2" / "source").as_uri(), "artifact_uri": shards[0].as_uri(),
            "artifact_sha256": digests[0], "artifact_shard_sha256": digests, "texts": TEXTS,
            "policy": {"long_context_tokens": 1024}, **changes}  # the suite's long text (tests/conftest.py)


def run(url: str, tmp_path: Path, shards: list[Path], **changes: object) -> tuple[dict, dict, dict]:
    """Submit, run the worker once, and return (the report, the attestation's statement, the VSA's)."""
    roots = (fixtures_root(), shards[0].parent)
    settings = settings_for(url, tmp_path, dispatcher="none", file_roots=roots)
    app = create_app(settings, loops=no_loops)
    # an inline policy (the suite's long text) is a policy author's to send
    submitter, auditor = add_token(url, Role.POLICY_AUTHOR, "pipeline"), add_token(url, Role.AUDITOR, "auditor")
    with TestClient(app) as api:
        created = api.post("/v1/verifications", headers={"Authorization": f"Bearer {submitter}"},
                           json=body(shards, **changes))
        assert created.status_code == 202, created.text
        verification_id = created.json()["id"]
        with transaction(app.state.session_factory) as session:
            attempt = repository.claim(session, verification_id, "test-dispatcher").attempt
        assert run_verification(settings, verification_id, "worker-1", attempt) == 0
        read = {"Authorization": f"Bearer {auditor}"}
        report = api.get(f"/v1/verifications/{verification_id}/report", headers=read).json()
        envelope = api.get(f"/v1/verifications/{verification_id}/attestation", headers=read).json()
        vsa = api.get(f"/v1/verifications/{verification_id}/attestation", params={"predicate": "vsa"},
                      headers=read).json()
    return report, *(json.loads(base64.b64decode(signed["payload"])) for signed in (envelope, vsa))


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_three_shard_split_of_a_trained_model_is_go_through_the_api(database: str, smollm2_split: list[Path],
                                                                     tmp_path: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg")
    report, statement, vsa = run(url, tmp_path, smollm2_split)
    assert report["verdict"] == "GO", report["blockers"]
    assert set(report["gates"]) == {"storage", "runtime", "release"}
    digests = [sha256_file(shard) for shard in smollm2_split]
    assert [f["sha256"] for f in report["files"][:3]] == digests
    subjects = {s["name"].rsplit("/", 1)[-1]: s["digest"]["sha256"] for s in statement["subject"]}
    assert {shard.name: subjects[shard.name] for shard in smollm2_split} == dict(
        zip([shard.name for shard in smollm2_split], digests, strict=True))
    assert [(s["name"].rsplit("/", 1)[-1], s["digest"]["sha256"]) for s in vsa["subject"]] == list(
        zip([shard.name for shard in smollm2_split], digests, strict=True))  # the artifact alone: every shard
    assert vsa["predicate"]["verificationResult"] == "PASSED"


@pytest.mark.slow
def test_a_tampered_shard_is_no_go_naming_it(sqlite_url: str, smollm2_split: list[Path], tmp_path: Path) -> None:
    folder = tmp_path / "tampered"
    folder.mkdir()
    shards = [folder / shard.name for shard in smollm2_split]
    for original, copy in zip(smollm2_split, shards, strict=True):
        copy.write_bytes(original.read_bytes())
    pinned = body(shards)["artifact_shard_sha256"]
    raw = bytearray(shards[1].read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shards[1].write_bytes(bytes(raw))
    report, statement, _ = run(sqlite_url, tmp_path, shards, artifact_shard_sha256=pinned)
    assert report["verdict"] == "NO-GO"
    assert [(b["code"], b["why"].split(" sha256")[0]) for b in report["blockers"]] == [
        ("artifact.sha256_mismatch", "shard 2")]
    assert statement["predicate"]["blocker_codes"] == ["artifact.sha256_mismatch"]


@pytest.mark.parametrize(("change", "why"), [
    ({"artifact_shard_sha256": None}, "names shard 1 of a 3-shard split"),
    ({"artifact_shard_sha256": ["a" * 64, "b" * 64]}, "names the first shard: ...-00001-of-00002.gguf"),
    ({"artifact_sha256": "f" * 64}, "starts with the first shard's sha256"),
], ids=["no-shard-digests", "too-few", "first-differs"])
def test_a_split_not_pinned_whole_is_a_422(api_for_validation: TestClient, change: dict, why: str) -> None:
    client, token = api_for_validation
    shards = [Path(f"/models/m-0000{k}-of-00003.gguf") for k in (1, 2, 3)]
    submitted = {"source_uri": "file:///models/source", "artifact_uri": shards[0].as_uri(),
                 "artifact_sha256": "a" * 64, "artifact_shard_sha256": ["a" * 64, "b" * 64, "c" * 64], **change}
    if submitted["artifact_shard_sha256"] is None:
        del submitted["artifact_shard_sha256"]
    answer = client.post("/v1/verifications", headers={"Authorization": f"Bearer {token}"}, json=submitted)
    assert answer.status_code == 422 and why in answer.text, answer.text


@pytest.fixture
def api_for_validation(sqlite_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = settings_for(sqlite_url, tmp_path, dispatcher="none")
    with TestClient(create_app(settings, loops=no_loops)) as client:
        yield client, add_token(sqlite_url, Role.SUBMITTER, "pipeline")
