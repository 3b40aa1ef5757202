"""Gate 2's distance thresholds widen to the model's own sensitivity to its class's rounding, and no further.

The deep-random fixture (32 random layers at tiny-llama's width, a BF16 source, llama.cpp's F16 of it:
scripts/fixtures_deep_random.py) is an honest F16 that gate 1 proves bit-exact, yet llama.cpp's float16
arithmetic moves its logits about seven times further than the float16 NMSE threshold (measured on trained
SmolLM2) allows: the 7B-shaped random F16's false NO-GO, at a size the suite can run. Gate 2 then measures how
far rounding every matrix input to float16 moves this model's logits (engine/gates/runtime/compute_noise.py)
and holds the file to a multiple of that. A rope base llama.cpp reads 5% off is still NO-GO, with gate 2 alone
and with every gate: it moves the logits by more than any rounding does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.thresholds import DEFAULT_RUNTIME_THRESHOLDS
from tests.conftest import codes, run_gates
from tests.gguf_rewrite import rewrite

pytestmark = pytest.mark.slow

TEXTS = ("The quick brown fox jumps over the lazy dog.",
         "Numbers 7 42 365 2026 3.14159 and 1,000,000; I've, you're, they'll.",
         "How do I verify that a converted model matches the original weights? Compare every tensor, then run it.")
DISTANCES = {"logits.nmse_above_threshold", "logits.kl_above_threshold"}


def test_an_honest_f16_of_a_deep_random_model_is_go_within_its_own_rounding_noise(deep_random: Path):
    report = run_gates(deep_random / "source", deep_random / "F16.gguf", {1, 2}, texts=TEXTS)
    assert report.verdict == "GO", report.blockers
    logits = report.gates["runtime"].details["logits"]
    class_nmse = DEFAULT_RUNTIME_THRESHOLDS["f16"].max_logits_nmse
    assert logits["summary"]["nmse"] > class_nmse  # the class threshold alone refuses this honest file
    noise = logits["compute_noise"]
    assert noise["rounded_to"] == "float16" and noise["positions"] > 16
    assert noise["thresholds"]["max_logits_nmse"] >= logits["summary"]["nmse"]
    assert noise["thresholds"]["min_top1_agreement"] == DEFAULT_RUNTIME_THRESHOLDS["f16"].min_top1_agreement
    assert report.gates["runtime"].details["reference"]["passes"] == 1


def test_a_rope_base_the_runtime_reads_five_percent_off_is_still_no_go(deep_random: Path, tmp_path: Path):
    """What llama.cpp computes differently on the same weights (a key it reads at run time) is what the
    correctness comparison exists for: 5% off the rope base moves the logits past the widened thresholds."""
    twin = rewrite(deep_random / "F16.gguf", tmp_path / "twin.gguf", set_keys={"llama.rope.freq_base": 10500.0})
    alone = run_gates(deep_random / "source", twin, {2}, texts=TEXTS)
    assert alone.verdict == "NO-GO" and codes(alone) & DISTANCES, alone.blockers
    assert "compute_noise" in alone.gates["runtime"].details["logits"]  # judged on the widened thresholds
    every = run_gates(deep_random / "source", twin, {1, 2}, texts=TEXTS)
    assert every.verdict == "NO-GO" and codes(alone) & codes(every) & DISTANCES, every.blockers
