"""Gate 2's distance thresholds widened to what the model's own arithmetic moves: a model-specific bound.

Why: the NMSE and KL thresholds are each compute class's worst honest value on trained SmolLM2, times ten.
How far llama.cpp's rounding of activations moves a model's logits is a property of the model too: a bit-exact
F16 of a 32-layer random model (every position a near-tie, activations amplified through every layer) exceeded
the float16 NMSE threshold, a false NO-GO, and a trained model larger or deeper than SmolLM2 could do the same.

So when a float file (F16, BF16) fails on a distance, the correctness reference runs one more short pass: the
longest text's first positions twice in one batch, once exact and once with every matrix product's input
rounded to the class's type (`engine/runtime/activation_rounding.py`). The distance between the two is what
this model's logits move under its class's rounding. A threshold is then at least NOISE_MARGIN times it:
DISTANCE_MARGIN (as for the class thresholds) times how far llama.cpp's own noise exceeded the emulated one
on the trained models, per distance (LLAMA_OVER_EMULATED, measured by `scripts/measure_thresholds.py
--compute-noise`).
llama.cpp rounds more than the matrix inputs (its float16 KV cache, the attention's operands), hence the ratio.

A defect is still caught: a changed weight moves the logits independently of rounding, and a model whose
rounding alone moves them little (SmolLM2, the one-ulp twins) keeps its class thresholds. Only file types
whose class is a float type are probed; the 8-bit classes' thresholds are a thousand times wider already.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.blockers import Blocker
from engine.gates.runtime.logits_parity import TextFigures
from engine.gates.runtime.logits_stream import rows_per_block
from engine.quant.compute import ComputeClass
from engine.runtime.hf_reference import HFModel
from engine.thresholds import DISTANCE_MARGIN, RuntimeThresholds, round_outward

# llama.cpp's honest distances over the emulated rounding's, per distance, the worst of the trained models' float
# files, rounded up (`python scripts/measure_thresholds.py --compute-noise`: llama.cpp over the default texts, the
# emulation over the longest text's first 128 positions, 64 for Gemma's vocabulary):
#   nmse     SmolLM2 F16 1.01, BF16 0.66; Gemma-3-270M F16 4.08, BF16 2.28
#   kl_mean  SmolLM2 F16 2.14, BF16 1.39; Gemma-3-270M F16 2.54, BF16 1.57
#   kl_p99   SmolLM2 F16 4.04, BF16 3.42; Gemma-3-270M F16 2.70, BF16 2.39
LLAMA_OVER_EMULATED = {"nmse": 4.1, "kl_mean": 2.6, "kl_p99": 4.1}
NOISE_MARGIN = {name: DISTANCE_MARGIN * ratio for name, ratio in LLAMA_OVER_EMULATED.items()}
PROBE_POSITIONS = 128  # of the longest text: the pass costs one read of the weights, not their compute
DISTANCE_CODES = frozenset({"logits.nmse_above_threshold", "logits.kl_above_threshold"})
ROUNDED_TO: dict[ComputeClass, str] = {"f16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True, slots=True)
class ComputeNoise:
    """The distances between the reference's logits and the same logits with the class's rounding."""

    rounded_to: str
    positions: int
    nmse: float
    kl_mean: float
    kl_p99: float

    def widened(self, thresholds: RuntimeThresholds) -> RuntimeThresholds:
        """Each distance threshold, at least NOISE_MARGIN times this model's own figure (never tighter)."""
        def at_least(current: float, name: str, measured: float) -> float:
            if not np.isfinite(measured):
                return current
            return max(current, round_outward(NOISE_MARGIN[name] * measured, up=True))
        return thresholds.model_copy(update={
            "max_logits_nmse": at_least(thresholds.max_logits_nmse, "nmse", self.nmse),
            "max_kl_mean": at_least(thresholds.max_kl_mean, "kl_mean", self.kl_mean),
            "max_kl_p99": at_least(thresholds.max_kl_p99, "kl_p99", self.kl_p99)})

    def details(self, thresholds: RuntimeThresholds) -> dict[str, Any]:
        """The report's account: what was measured and the thresholds it led to."""
        return {"why": "a distance exceeded the class threshold: this model's own sensitivity to its class's rounding "
                       "was measured, and each distance threshold is at least noise_margin times it",
                "rounded_to": self.rounded_to, "positions": self.positions, "nmse": self.nmse,
                "kl_mean": self.kl_mean, "kl_p99": self.kl_p99, "noise_margin": NOISE_MARGIN,
                "thresholds": thresholds.model_dump()}


def rounding_of(classes: Sequence[ComputeClass]) -> str | None:
    """The type a float file's activations are rounded to (the coarser of float16 and bfloat16 when mixed);
    None for a file with a matrix in an 8-bit class, or in float32 only."""
    if any(name not in ("f32", *ROUNDED_TO) for name in classes):
        return None
    rounded = [ROUNDED_TO[name] for name in ("bf16", "f16") if name in classes]
    return rounded[0] if rounded else None


def needs_probe(blockers: Sequence[Blocker], rounded_to: str | None) -> bool:
    return rounded_to is not None and any(blocker.code in DISTANCE_CODES for blocker in blockers)


def measure_noise(model: HFModel, ids: list[int], rounded_to: str, vocabulary: int) -> ComputeNoise:
    """The distances the class's rounding alone moves `model`'s logits over the first positions of `ids`."""
    probe = ids[: max(2, min(PROBE_POSITIONS, rows_per_block(vocabulary)))]
    exact, rounded = model.rounding_pair(probe, rounded_to)
    figures = TextFigures("compute noise", "probe")
    figures.add(model.head(exact), model.head(rounded))
    sq_ref = figures.joined("sq_ref").sum()
    kl = figures.kls()
    return ComputeNoise(rounded_to=rounded_to, positions=figures.positions,
                        nmse=float(figures.joined("sq_diff").sum() / sq_ref) if sq_ref else float("inf"),
                        kl_mean=float(kl.mean()), kl_p99=float(np.percentile(kl, 99)))
