"""Gate 2 runs transformers once when gate 1 has proved every tensor the reference reads bit-exact to the
source, and twice otherwise: gate 1's evidence decides, never the file's type name.

On the trained SmolLM2 (a BF16 source) its honest BF16 and F16 hold every weight exactly (one pass, GO) and its
quantized files do not (two passes, GO): test_trained_models.py counts those. Here, a BF16 with one weight
changed, which gate 1 catches (two passes, NO-GO), gate 2 without gate 1 (two passes: nothing proved the
weights equal), and an F16 of a BF16 source with values below F16's normal range, as every real BF16
checkpoint has: rounded by the converter, let through (one pass, GO), and changed by one F16 step (NO-GO,
two passes). The count is of base-model passes actually run (`passes`, conftest.py), and the report says
the same.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import codes, defect_copy, run_gates

pytestmark = pytest.mark.slow

TEXTS = ("The quick brown fox jumps over the lazy dog.", "Paris is the capital and largest city of France.")


def test_a_bf16_with_one_changed_weight_runs_two_passes_and_is_no_go(smollm2: Path, tmp_path: Path,
                                                                     passes: Counter[int]):
    def one_ulp(data: np.ndarray) -> None:
        data[1000:1002].view("<u2")[0] += 1

    artifact = defect_copy(smollm2 / "smollm2-BF16.gguf", tmp_path, "blk.3.ffn_down.weight", one_ulp)
    report = run_gates(smollm2 / "source", artifact, {1, 2}, texts=TEXTS)
    assert report.verdict == "NO-GO" and "tensor.value_mismatch" in codes(report)
    reference = report.gates["runtime"].details["reference"]
    assert reference["passes"] == 2 and "blk.3.ffn_down.weight" in reference["passes_why"]
    assert len(passes) == 2


def test_without_gate_1_gate_2_runs_two_passes(tiny_llama: Path, passes: Counter[int]):
    report = run_gates(tiny_llama / "source", tiny_llama / "tiny-llama-F32.gguf", {2}, texts=TEXTS[:1])
    assert "gate 1 did not check" in report.gates["runtime"].details["reference"]["passes_why"]
    assert report.gates["runtime"].details["reference"]["passes"] == 2
    assert len(passes) == 2


def test_an_f16_rounding_a_bf16_sources_smallest_values_runs_one_pass(bf16_source: Path, passes: Counter[int]):
    report = run_gates(bf16_source / "source", bf16_source / "F16.gguf", {1, 2}, texts=TEXTS)
    assert report.verdict == "GO", report.blockers
    rows = report.gates["storage"].details["tensors"]
    assert any(0 < row["max_abs"] <= 2.0 ** -25 for row in rows)  # the fixture has values F16 rounds
    reference = report.gates["runtime"].details["reference"]
    assert reference["passes"] == len(passes) == 1, reference["passes_why"]
    assert "below its normal range aside" in reference["passes_why"]


def test_an_f16_with_a_value_one_step_off_the_converters_rounding_runs_two_passes(bf16_source: Path, tmp_path: Path,
                                                                                 passes: Counter[int]):
    def one_step(data: np.ndarray) -> None:
        data[0:2].view("<u2")[0] += 1  # one F16 step (2^-24 for a subnormal, more above): never a rounding

    artifact = defect_copy(bf16_source / "F16.gguf", tmp_path, "output.weight", one_step)
    report = run_gates(bf16_source / "source", artifact, {1, 2}, texts=TEXTS)
    assert report.verdict == "NO-GO" and "tensor.value_mismatch" in codes(report)
    reference = report.gates["runtime"].details["reference"]
    assert reference["passes"] == len(passes) == 2 and "output.weight" in reference["passes_why"]
