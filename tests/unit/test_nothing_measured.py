"""Item 15: no gate passes having measured nothing; it is `not_run` with a `gate.not_run` blocker and why."""

from __future__ import annotations

import numpy as np

from engine.formats.gguf_structure import read_layout
from engine.formats.source import open_source
from engine.gates.release.gate import _remeasure_logits
from engine.gates.runtime.gate import RuntimeMeasurements, nothing_measured, run_runtime_gate
from engine.gates.storage.gate import run_storage_gate
from engine.policy import Policy
from engine.texts import submitted_texts
from tests.fuzz.hostile import gguf_bytes, honest_kvs, safetensors_bytes, write_honest_pair
from tests.gguf_bytes import GGUFBytes


def test_gate1_with_no_tensor_compared_is_not_run(tmp_path):
    source, artifact = write_honest_pair(tmp_path)
    (source / "model.safetensors").write_bytes(safetensors_bytes({}))
    artifact.write_bytes(GGUFBytes(kvs=list(honest_kvs().values())).build())
    result, blockers = run_storage_gate(artifact, read_layout(artifact), open_source(source), Policy())
    assert result.status == "not_run"
    assert [b.code for b in blockers if b.code == "gate.not_run"] == ["gate.not_run"]
    assert "no GGUF tensor was compared" in result.details["why"]


def test_gate1_that_compared_a_tensor_is_not_flagged(tmp_path):
    source, artifact = write_honest_pair(tmp_path)
    artifact.write_bytes(gguf_bytes(honest_kvs()))
    result, blockers = run_storage_gate(artifact, read_layout(artifact), open_source(source), Policy())
    assert result.status == "passed" and blockers == []


def test_gate2_with_every_text_longer_than_the_context_is_not_run(minilm):
    artifact = minilm / "minilm-F16.gguf"
    long_text = "word " * 4000
    result, blockers, measured = run_runtime_gate(artifact, read_layout(artifact), open_source(minilm / "source"),
                                                  Policy(), submitted=submitted_texts([long_text], None))
    assert result.status == "not_run", result.details
    assert [b.code for b in blockers] == ["gate.not_run"]
    assert "longer than the context" in blockers[0].why and result.details["skipped_texts"] == ["line-1"]
    assert all(label.startswith("probe-") for label in result.details["texts"])  # measured, but not the model's
    assert measured is None


def test_an_empty_comparison_is_named_for_embeddings_and_logits():
    assert nothing_measured({"embeddings": {"per_text": []}}) is not None
    assert nothing_measured({"logits": {"per_text": []}}) is not None
    assert nothing_measured({"embeddings": {"per_text": [{"cosine": 1.0}]}}) is None
    assert nothing_measured({"logits": {"per_text": [{"positions": 3}]}}) is None


class _SilentCandidate:
    """A candidate whose tokenizer returns nothing, so there is no position to compare."""

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return []

    def logits(self, ids: list[int]) -> np.ndarray:
        return np.zeros((len(ids), 8))


def test_gate3_with_no_logits_position_is_not_run():
    details: dict = {}
    blockers = _remeasure_logits(_SilentCandidate(), RuntimeMeasurements("causal-lm", 64), details)  # type: ignore[arg-type]
    assert [b.code for b in blockers] == ["gate.not_run"]
