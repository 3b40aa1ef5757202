"""Gate 1 across pods (issue 12 item 4), the service's half: the shard count chosen at submission from
the artifact's size, the shards of one attempt sharing it (a retried pod joins), each part stored once,
and the verdict merged and written exactly once, by whoever stores the last part - on SQLite and on
Postgres, where two last parts filed at the same moment still give one verdict."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.digests import sha256_file
from engine.policy import Policy
from engine.progress import no_progress
from engine.verification import LocalInputs, VerifyRequest, verify, verify_shard
from service.config import KubernetesSettings
from service.job import run_verification
from service.lifecycle import State
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.models import Gate1Shard, Verdict
from service.persistence.shards import ShardRefusedError, record_shard
from service.schemas import SubmitRequest
from service.verifications import admit, gate1_shards, submit
from tests.conftest import defect_copy, fixtures_root
from tests.service.conftest import settings_for

pytestmark = pytest.mark.slow
JOB = "convgate-job-1"


ENGINES: dict[str, object] = {}


@pytest.fixture(params=["sqlite", "postgres"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


@pytest.fixture(autouse=True)
def _dispose_engines():
    """Every engine the test made is closed with it (an open connection is an error under -W error)."""
    yield
    while ENGINES:
        ENGINES.popitem()[1].dispose()


def _factory(url: str):
    if url not in ENGINES:
        ENGINES[url] = make_engine(url)
    return session_factory(ENGINES[url])


def _settings(url: str, tmp_path: Path, shards: int = 2):
    return settings_for(url, tmp_path, dispatcher="none", file_roots=(fixtures_root(), tmp_path),
                        kubernetes=KubernetesSettings(gate1_shard_bytes=1 << 20, max_gate1_shards=shards))


def _body(artifact: Path, **extra) -> SubmitRequest:
    source = fixtures_root() / "minilm" / "source"
    return SubmitRequest(source_uri=source.as_uri(), artifact_uri=artifact.as_uri(),
                         artifact_sha256=sha256_file(artifact), gates=[1], **extra)


def _dispatched(url: str, settings, artifact: Path) -> str:
    """A submitted verification claimed by a dispatcher: attempt 1, waiting for its workers."""
    factory = _factory(url)
    with transaction(factory) as session:
        verification = submit(session, settings, "alice", admit(settings, _body(artifact)), None)[0]
        assert repository.claim(session, verification.id, "dispatcher") is not None
        return verification.id


def _verdict(url: str, verification_id: str) -> tuple[str, dict]:
    with _factory(url)() as session:
        verification = repository.get_verification(session, verification_id)
        verdict = repository.verdict_for(session, verification_id)
        assert verification is not None and verdict is not None, verification and verification.reason
        assert session.query(Verdict).filter_by(verification_id=verification_id).count() == 1
        return verification.state, verdict.report


def test_the_shard_count_follows_the_artifact_size(tmp_path, minilm):
    artifact = minilm / "minilm-Q8_0.gguf"  # ~25 MiB: 25 shards of 1 MiB, capped
    settings = _settings("sqlite:///unused.db", tmp_path, shards=3)
    assert gate1_shards(settings, _body(artifact)) == 3
    assert gate1_shards(settings, _body(artifact, artifact_size=(1 << 20) + 1)) == 2
    assert gate1_shards(settings, _body(artifact, artifact_size=100)) == 1
    assert gate1_shards(settings.model_copy(update={"dispatcher": "local"}), _body(artifact)) == 1
    no_gate1 = _body(artifact).model_copy(update={"gates": [2]})
    assert gate1_shards(settings, no_gate1) == 1


def _comparable(report: dict) -> dict:
    storage = dict(report["gates"]["storage"]["details"])
    storage.pop("shards", None)
    return {"verdict": report["verdict"], "blockers": report["blockers"], "storage": storage}


def test_shards_run_as_one_attempt_and_write_one_verdict(url, tmp_path, minilm):
    artifact = defect_copy(minilm / "minilm-F32.gguf", tmp_path, "blk.3.ffn_up.weight",
                           lambda raw: raw.view("<f4").__setitem__(11, 9.0))
    settings = _settings(url, tmp_path)
    verification_id = _dispatched(url, settings, artifact)
    assert run_verification(settings, verification_id, JOB, 1, shard=1) == 0  # the last index may start first
    with _factory(url)() as session:
        running = repository.get_verification(session, verification_id)
        assert running is not None and (running.state, running.worker) == (State.RUNNING, JOB)
        assert repository.verdict_for(session, verification_id) is None  # one part of two
    assert run_verification(settings, verification_id, JOB, 1, shard=0) == 0
    state, report = _verdict(url, verification_id)
    assert state == State.COMPLETED and report["verdict"] == "NO-GO"
    assert [b["tensor"] for b in report["blockers"]] == ["blk.3.ffn_up.weight"]
    assert report["gates"]["storage"]["details"]["shards"]["count"] == 2
    whole = verify(VerifyRequest(gates=frozenset({1}), expected_sha256=sha256_file(artifact)),
                   LocalInputs(source=minilm / "source", artifact=artifact, artifact_uri=artifact.as_uri()), Policy())
    assert _comparable(report) == _comparable(whole.model_dump(mode="json"))


def test_a_retried_shard_joins_and_refiles_without_effect(url, tmp_path, minilm):
    settings = _settings(url, tmp_path)
    verification_id = _dispatched(url, settings, minilm / "minilm-Q8_0.gguf")
    assert run_verification(settings, verification_id, JOB, 1, shard=0) == 0
    assert run_verification(settings, verification_id, JOB, 1, shard=0) == 0  # the index's pod, retried
    with _factory(url)() as session:
        assert session.query(Gate1Shard).filter_by(verification_id=verification_id).count() == 1
    assert run_verification(settings, verification_id, JOB, 1, shard=1) == 0
    state, report = _verdict(url, verification_id)
    assert (state, report["verdict"]) == (State.COMPLETED, "GO")


def test_another_worker_cannot_join_and_an_unsharded_second_start_is_still_refused(url, tmp_path, minilm):
    settings = _settings(url, tmp_path)
    verification_id = _dispatched(url, settings, minilm / "minilm-Q8_0.gguf")
    factory = _factory(url)
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, JOB, attempt=1) is not None
        assert repository.join_sharded_attempt(session, verification_id, JOB, attempt=1) is not None
        assert repository.join_sharded_attempt(session, verification_id, "other-job", attempt=1) is None
        assert repository.join_sharded_attempt(session, verification_id, JOB, attempt=2) is None
    unsharded = settings.model_copy(update={"kubernetes": KubernetesSettings(max_gate1_shards=1)})
    single = _dispatched(url, unsharded, minilm / "minilm-F16.gguf")
    with transaction(factory) as session:
        assert repository.start_attempt(session, single, "pod-a", attempt=1) is not None
        assert repository.join_sharded_attempt(session, single, "pod-a", attempt=1) is None


def _parts(minilm: Path, artifact: Path, shards: int):
    request = VerifyRequest(gates=frozenset({1}), expected_sha256=sha256_file(artifact))
    inputs = LocalInputs(source=minilm / "source", artifact=artifact, artifact_uri=artifact.as_uri())
    outcomes = [verify_shard(request, inputs, Policy(), no_progress, shard, shards) for shard in range(shards)]
    return [{"part": part.model_dump(mode="json"), "report": report.model_dump(mode="json") if shard == 0 else None}
            for shard, (report, part) in enumerate(outcomes)]


def _running(url: str, settings, artifact: Path) -> str:
    verification_id = _dispatched(url, settings, artifact)
    with transaction(_factory(url)) as session:
        assert repository.start_attempt(session, verification_id, JOB, attempt=1) is not None
    return verification_id


def test_two_last_parts_filed_together_give_one_verdict(pg, tmp_path, minilm):
    artifact = minilm / "minilm-Q8_0.gguf"
    settings = _settings(pg, tmp_path, shards=3)
    payloads = _parts(minilm, artifact, 3)
    verification_id = _running(pg, settings, artifact)
    factory = _factory(pg)
    with transaction(factory) as session:
        assert record_shard(session, verification_id, 1, JOB, 0, 3, payloads[0])
    barrier, results = threading.Barrier(2), []

    def file(shard: int) -> None:
        barrier.wait()
        with transaction(factory) as session:
            results.append(record_shard(session, verification_id, 1, JOB, shard, 3, payloads[shard]))

    threads = [threading.Thread(target=file, args=(shard,)) for shard in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [True, True]
    state, report = _verdict(pg, verification_id)
    assert (state, report["verdict"]) == (State.COMPLETED, "GO")


def test_parts_are_checked_before_they_are_stored(url, tmp_path, minilm):
    artifact = minilm / "minilm-Q8_0.gguf"
    settings = _settings(url, tmp_path)
    payloads = _parts(minilm, artifact, 2)
    verification_id = _running(url, settings, artifact)
    factory = _factory(url)
    refusals = {
        "not the running attempt": (2, JOB, 0, 2, payloads[0]),
        "not this attempt's worker": (1, "other-job", 0, 2, payloads[0]),
        "does not fit": (1, JOB, 0, 3, payloads[0]),
        "not a shard part": (1, JOB, 0, 2, {"part": {"shard": 0}, "report": payloads[0]["report"]}),
        "filed as shard 1": (1, JOB, 1, 2, payloads[0]),
    }
    for why, (attempt, worker, shard, shards, payload) in refusals.items():
        with pytest.raises(ShardRefusedError, match=why), transaction(factory) as session:
            record_shard(session, verification_id, attempt, worker, shard, shards, payload)


def test_parts_from_different_artifacts_end_the_attempt_unjudged(url, tmp_path, minilm):
    from service.persistence.worker_channel import DirectChannel

    artifact = minilm / "minilm-Q8_0.gguf"
    settings = _settings(url, tmp_path)
    verification_id = _running(url, settings, artifact)
    mine, foreign = _parts(minilm, artifact, 2), _parts(minilm, minilm / "minilm-F16.gguf", 2)
    channel = DirectChannel(_factory(url), verification_id, 1, JOB)
    assert channel.record_shard(0, 2, mine[0])
    assert not channel.record_shard(1, 2, foreign[1])
    with _factory(url)() as session:
        ended = repository.get_verification(session, verification_id)
        assert ended is not None and ended.state == State.QUEUED and ended.failed_attempts == 1
        assert "do not merge" in (ended.reason or "")
        assert repository.verdict_for(session, verification_id) is None
