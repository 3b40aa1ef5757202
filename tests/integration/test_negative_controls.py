"""A negative control in every run (issue 13 item 2): before a GO is trusted, each gate that ran fails on
a copy of this artifact's own measurements with one planted defect - and a gate whose comparison cannot
fail (here: replaced by one that always passes) turns the verdict into NO-GO."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.gates.runtime import embedding_parity, logits_parity, tokenizer_parity
from engine.gates.storage import tensor_values
from engine.policy import Policy
from engine.summary import render_summary
from tests.conftest import codes, run_gates

pytestmark = pytest.mark.slow
ENGLISH = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I verify that a converted model matches the original weights?",
    "Platform teams gate every quantized model before it ships.",
)


def by_check(report) -> dict[str, Any]:
    """The runtime and release controls by the comparison they exercised (gate 1 has one per type)."""
    return {control.check: control for control in report.controls if control.gate != "storage"}


def storage_controls(report) -> dict[str, Any]:
    """Gate 1's controls by the GGUF type they planted in."""
    return {control.defect.split()[1]: control for control in report.controls if control.gate == "storage"}


@pytest.mark.coverage(arch="bert", types=("F32", "Q8_0"), imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", ["F32", "Q8_0"])
def test_every_gate_that_ran_detects_its_planted_defect_and_the_honest_file_is_go(minilm, gguf_type):
    report = run_gates(minilm / "source", minilm / f"minilm-{gguf_type}.gguf", {1, 2, 3}, texts=ENGLISH)
    assert report.verdict == "GO", report.blockers
    controls = by_check(report)
    storage = storage_controls(report)
    assert [(c.gate, c.check) for c in report.controls] == [("storage", "tensor values")] * len(storage) + [
        ("runtime", "tokenizer ids"), ("runtime", "embeddings"), ("release", "release digest")]
    assert {c.outcome for c in report.controls} == {"detected"}
    assert set(storage) == {"F32", gguf_type}  # the norms and biases stay F32
    assert storage["F32"].detected_by == ["tensor.value_mismatch"]
    assert "tensor.reproduction_mismatch" in storage[gguf_type].detected_by or gguf_type == "F32"
    assert all(("one ulp" in c.defect or "256 ulps" in c.defect) and c.location for c in storage.values())
    assert controls["tokenizer ids"].detected_by == ["tokenizer.ids_mismatch"]
    assert "embedding.cosine_below_threshold" in controls["embeddings"].detected_by
    assert controls["release digest"].detected_by == ["release.file_changed"]
    timings = report.timings
    assert timings["controls"] == pytest.approx(sum(c.seconds for c in report.controls))
    assert timings["controls_share"] == pytest.approx(timings["controls"] / timings["total"])
    assert 0 < timings["controls_share"] < 0.10, timings
    assert f"controls  {len(report.controls)}/{len(report.controls)} planted defects detected (" in \
        render_summary(report)


def test_every_quantized_type_detects_a_scale_moved_one_ulp(minilm):
    report = run_gates(minilm / "source", minilm / "minilm-Q4_K_M.gguf", {1})
    assert report.verdict == "GO", report.blockers
    storage = storage_controls(report)
    assert set(storage) == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    for type_name in ("Q4_K", "Q5_0", "Q6_K", "Q8_0"):
        assert "tensor.reproduction_mismatch" in storage[type_name].detected_by, storage[type_name]
        assert "scale moved by 256 ulps" in storage[type_name].defect


def test_sampled_reproduction_plants_in_a_sampled_block(minilm):
    policy = Policy(reproduce_sample=0.05)
    report = run_gates(minilm / "source", minilm / "minilm-Q4_K_M.gguf", {1}, policy)
    assert report.verdict == "GO", report.blockers
    assert report.gates["storage"].details["sampling"] is not None
    assert {c.outcome for c in report.controls} == {"detected"}


def test_causal_lm_logits_control_is_detected(tiny_llama):
    report = run_gates(tiny_llama / "source", tiny_llama / "tiny-llama-F32.gguf", {2, 3}, texts=ENGLISH)
    controls = by_check(report)
    assert set(controls) == {"tokenizer ids", "logits", "release digest"}
    assert "logits.nmse_above_threshold" in controls["logits"].detected_by
    assert {c.outcome for c in report.controls} == {"detected"}
    assert "verifier.control_not_detected" not in codes(report)


def test_a_tensor_check_that_cannot_fail_is_caught(minilm, monkeypatch):
    monkeypatch.setattr(tensor_values, "_judge", lambda *args, **kwargs: [])  # tolerance made infinite
    report = run_gates(minilm / "source", minilm / "minilm-F32.gguf", {1})
    assert report.verdict == "NO-GO"
    assert codes(report) == {"verifier.control_not_detected"}
    (control,) = report.controls
    assert (control.gate, control.outcome, control.detected_by) == ("storage", "not_detected", [])
    assert control.location and control.location in report.blockers[0].why
    assert "controls  0/1 planted defects detected, 1 NOT detected" in render_summary(report)
    assert report.gates["storage"].status == "passed"  # the gate alone would have said GO


def test_a_tokenizer_comparison_that_cannot_fail_is_caught(minilm, monkeypatch):
    monkeypatch.setattr(tokenizer_parity, "ids_agree", lambda hf_ids, llama_ids: True)
    report = run_gates(minilm / "source", minilm / "minilm-F32.gguf", {2}, texts=ENGLISH)
    assert report.verdict == "NO-GO"
    # the probe's Hangul, which MiniLM's WordPiece splits unlike llama.cpp's, now counts as agreeing and its
    # embeddings are compared too: a comparison that cannot fail lets worse through than the control alone
    assert codes(report) <= {"verifier.control_not_detected", "embedding.cosine_below_threshold"}
    assert "verifier.control_not_detected" in codes(report)
    controls = by_check(report)
    assert controls["tokenizer ids"].outcome == "not_detected"
    assert controls["embeddings"].outcome == "detected"


def test_an_embedding_comparison_that_cannot_fail_is_caught(minilm, monkeypatch):
    real = embedding_parity.compare_vectors

    def always_close(reference: np.ndarray, candidate: np.ndarray, normalize: bool) -> dict[str, float]:
        return {**real(reference, candidate, normalize), "cosine": 1.0}

    monkeypatch.setattr(embedding_parity, "compare_vectors", always_close)
    report = run_gates(minilm / "source", minilm / "minilm-F32.gguf", {2}, texts=ENGLISH)
    assert report.verdict == "NO-GO"
    assert codes(report) == {"verifier.control_not_detected"}
    controls = by_check(report)
    assert (controls["embeddings"].outcome, controls["tokenizer ids"].outcome) == ("not_detected", "detected")


def test_a_logits_comparison_that_cannot_fail_is_caught(tiny_llama, monkeypatch):
    real = logits_parity.TextFigures.add
    monkeypatch.setattr(logits_parity.TextFigures, "add", lambda self, reference, candidate: real(self, reference,
                                                                                                  reference))
    report = run_gates(tiny_llama / "source", tiny_llama / "tiny-llama-F32.gguf", {2}, texts=ENGLISH)
    assert not [code for code in codes(report) if code.startswith("logits.")]
    assert "verifier.control_not_detected" in codes(report)
    assert [b.why.split(" (planted")[0] for b in report.blockers if b.code == "verifier.control_not_detected"] == [
        by_check(report)["logits"].defect + " at " + by_check(report)["logits"].location]
    assert by_check(report)["logits"].outcome == "not_detected"
