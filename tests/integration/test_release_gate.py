"""Gate 3 re-measures the exact released bytes; each way the release can differ is caught."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from worker.digests import sha256_file
from worker.formats.gguf_structure import read_layout
from worker.formats.source import open_source
from worker.gates.release import run_release_gate
from worker.gates.runtime import RuntimeMeasurements
from worker.runtime.sentence_config import sentence_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def release_inputs(minilm):
    artifact = minilm / "minilm-F16.gguf"
    layout = read_layout(artifact)
    sentence = sentence_config(open_source(minilm / "source"))
    return artifact, layout, sentence, sha256_file(artifact)


def release(release_inputs, *, sha=None, layout=None, measured=None, package=()):
    artifact, base_layout, sentence, base_sha = release_inputs
    result, blockers, files = run_release_gate(artifact, artifact.as_uri(), sha or base_sha, layout or base_layout,
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
    assert release(release_inputs, layout=wrong)[1] == {"release.dimension_mismatch"}


def test_missing_package_file(release_inputs, tmp_path):
    assert release(release_inputs, package=(tmp_path / "absent.md",))[1] == {"release.missing_file"}
