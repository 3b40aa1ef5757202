"""Gate 3 re-measures the exact released bytes; each way the release can differ is caught."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from engine.digests import sha256_file
from engine.formats.gguf_structure import read_layout
from engine.formats.source import open_source
from engine.gates.release.gate import run_release_gate
from engine.gates.runtime.gate import RuntimeMeasurements
from engine.report import FileDigest
from engine.runtime.sentence_config import sentence_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def release_inputs(minilm):
    artifact = minilm / "minilm-F16.gguf"
    layout = read_layout(artifact)
    sentence = sentence_config(open_source(minilm / "source"))
    return artifact, layout, sentence, sha256_file(artifact)


def release(release_inputs, *, sha=None, layout=None, measured=None, package=()):
    artifact, base_layout, sentence, base_sha = release_inputs
    measured_file = FileDigest(uri=artifact.as_uri(), sha256=sha or base_sha, size=artifact.stat().st_size)
    result, blockers, files = run_release_gate(artifact, [measured_file], layout or base_layout,
                                               sentence, measured, "embedding", package)
    return result, {b.code for b in blockers}, files


def test_honest_release_passes_and_digests_the_package(release_inputs, minilm):
    result, found, files = release(release_inputs, package=(minilm / "source" / "config.json",))
    assert found == set() and result.status == "passed"
    assert result.details["dimension"] == [384] and result.details["min_norm"] > 0
    assert [f.uri.rsplit("/", 1)[-1] for f in files] == ["minilm-F16.gguf", "config.json"]
    measured = RuntimeMeasurements("embedding", 512, retrieval_top1=tuple(result.details["top1"]))
    assert release(release_inputs, measured=measured)[1] == set()


def test_file_changed_after_measurement(release_inputs):
    assert release(release_inputs, sha="0" * 64)[1] == {"release.file_changed"}


def test_top1_different_from_gate2(release_inputs):
    measured = RuntimeMeasurements("embedding", 512, retrieval_top1=(6, 6, 6, 6, 6))
    assert release(release_inputs, measured=measured)[1] == {"release.top1_changed"}


def test_dimension_disagreeing_with_metadata(release_inputs):
    layout = release_inputs[1]
    metadata = MappingProxyType({**layout.metadata, "bert.embedding_length": 768})
    wrong = dataclasses.replace(layout, metadata=metadata)
    # the width the metadata states is not the tensors': refused before llama.cpp loads the file
    assert release(release_inputs, layout=wrong)[1] == {"runtime.refused_to_load"}


def test_missing_package_file(release_inputs, tmp_path):
    assert release(release_inputs, package=(tmp_path / "absent.md",))[1] == {"release.missing_file"}


@pytest.fixture(scope="module")
def reranker_gate2(bge_reranker):
    """Gate 2 run on the honest F16 reranker: what gate 3 must find again in the released bytes."""
    from engine.runtime.sentence_config import sentence_config as config_of
    from tests.conftest import run_gates

    source = open_source(bge_reranker / "source")
    return run_gates(bge_reranker / "source", bge_reranker / "F16.gguf", {2}), config_of(source)


def release_reranker(bge_reranker, reranker_gate2, measured, artifact_type="F16", sha=None):
    artifact = bge_reranker / f"{artifact_type}.gguf"
    _, sentence = reranker_gate2
    measured_file = FileDigest(uri=artifact.as_uri(), sha256=sha or sha_of(artifact), size=artifact.stat().st_size)
    result, blockers, _ = run_release_gate(artifact, [measured_file], read_layout(artifact), sentence, measured,
                                           "reranker")
    return result, {b.code for b in blockers}


def sha_of(path):
    return sha256_file(path)


def gate2_measured(reranker_gate2):
    report, _ = reranker_gate2
    relevance = report.gates["runtime"].details["relevance"]
    orders = tuple(tuple(q["candidate_order"]) for q in relevance["per_query"])
    scores = tuple(tuple(p["candidate"] for p in relevance["per_pair"] if p["query"] == q["query"])
                   for q in relevance["per_query"])
    return RuntimeMeasurements("reranker", 512, rerank_orders=orders, rerank_scores=scores)


def test_reranker_release_rescored_like_gate2_passes(bge_reranker, reranker_gate2):
    result, found = release_reranker(bge_reranker, reranker_gate2, gate2_measured(reranker_gate2))
    assert found == set() and result.status == "passed"
    assert result.details["max_abs_diff_from_gate2"] <= result.details["tolerance"]


def test_reranker_release_changed_after_measurement(bge_reranker, reranker_gate2):
    assert release_reranker(bge_reranker, reranker_gate2, gate2_measured(reranker_gate2), sha="0" * 64)[1] == \
        {"release.file_changed"}


def test_reranker_release_of_another_file_than_measured(bge_reranker, reranker_gate2):
    """Gate 2 measured the F16; the Q8_0 (self-consistent digest) is released: its scores are not those measured."""
    result, found = release_reranker(bge_reranker, reranker_gate2, gate2_measured(reranker_gate2), "Q8_0")
    assert "release.score_changed" in found and result.status == "failed"
    assert result.details["max_abs_diff_from_gate2"] > result.details["tolerance"]


def test_reranker_release_order_different_from_gate2(bge_reranker, reranker_gate2):
    measured = gate2_measured(reranker_gate2)
    reversed_orders = tuple(tuple(reversed(order)) for order in measured.rerank_orders)
    found = release_reranker(bge_reranker, reranker_gate2,
                             dataclasses.replace(measured, rerank_orders=reversed_orders, rerank_scores=()))[1]
    assert found == {"release.order_changed"}
