"""Gate 2 runs transformers once when gate 1 has proved every tensor the reference reads bit-exact to the
source, and twice otherwise: gate 1's evidence decides, never the file's type name.

On the trained SmolLM2 (a BF16 source) its honest BF16 and F16 hold every weight exactly (one pass, GO) and its
quantized files do not (two passes, GO): test_trained_models.py counts those. Here, a BF16 with one weight
changed, which gate 1 catches (two passes, NO-GO), and gate 2 without gate 1 (two passes: nothing proved the
weights equal). The count is of base-model passes actually run (`passes`, conftest.py), and the report says
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
