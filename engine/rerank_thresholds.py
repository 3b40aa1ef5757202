"""Gate-2 correctness thresholds for rerankers per compute class, derived from measured honest conversions.

The compared quantity is a (query, document) pair's relevance score (the classification head's
logit) from llama.cpp against transformers running the artifact's own weights, in logit units. Each
compute class's threshold is the worst absolute score difference measured on honest conversions in that
class times `SCORE_MARGIN`, never below `SCORE_FLOOR`, rounded outward to two significant digits. A class
without a measured reranker conversion takes the nearest measured class's threshold, the finer one
first: tighter than it may need, so an honest coarse quant can be NO-GO (safe). No trained reranker can
be had offline here, so these come from the random-weight fixture: a platform should measure a reranker
of its own catalogue and configure a named policy from it. Re-measure with
the honest fixtures (tests/integration/test_architectures_encoders.py records each run's worst difference
under the report's gate-2 details, `relevance.max_abs_diff`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from engine.quant.compute import COMPUTE_CLASSES, ComputeClass
from engine.thresholds import round_outward

SCORE_MARGIN = 2.0  # 2x the worst honest absolute score difference (as for the cosine deficit)
SCORE_FLOOR = 1e-4  # float summation order alone moves a logit by ~1e-6; never hold a class tighter than this
# Gate 3 re-scores the same bytes with the same runtime, so its scores should equal gate 2's; only thread
# scheduling can reorder a float sum (~1e-6). A released file that is not the measured one moves them by far
# more (the honest Q8_0 of the fixture reranker differs from its F16 by ~0.1).
RELEASE_SCORE_TOLERANCE = SCORE_FLOOR


class RerankThresholds(BaseModel):
    """Reranker thresholds for one compute class; finite (an infinite bound holds nothing, a NaN passes all)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_score_abs_diff: float = Field(gt=0, description="max |llama.cpp score - reference score| per pair (logits)")


@dataclass(frozen=True, slots=True)
class HonestScores:
    fixture: str
    compute: ComputeClass
    max_abs_diff: float


# Measured on 2026-11-30 (llama-cpp-python 0.3.36, transformers 4.57, torch 2.13, CPU) over the built-in
# RERANK_SET (3 queries x 4 documents) with the arch-bge-reranker fixture (scripts/fixtures_encoders.py):
# a random-weight XLMRobertaForSequenceClassification (initializer_range 0.2) whose scores spread over
# -0.92..-0.03 logits. Worst pair: F16 0.00259, Q8_0 0.111 -> thresholds 0.0052 (float) and 0.23 (8bit, and
# every coarser class). The random model's Q8_0 error is large next to its spread; a trained reranker's
# scores spread over several logits, so measure one of your catalogue and configure a named policy from it.
MEASURED: tuple[HonestScores, ...] = (
    HonestScores("bge-reranker-F16", "f16", 0.00259),
    HonestScores("bge-reranker-Q8_0", "q8_0", 0.111),
)


def _measured(name: ComputeClass) -> float | None:
    worst = [m.max_abs_diff for m in MEASURED if m.compute == name]
    return round_outward(max(max(worst) * SCORE_MARGIN, SCORE_FLOOR), up=True) if worst else None


def default_rerank_thresholds() -> dict[ComputeClass, RerankThresholds]:
    measured = {name: value for name in COMPUTE_CLASSES if (value := _measured(name)) is not None}
    if not measured:
        raise ValueError("no honest reranker measured")
    out: dict[ComputeClass, RerankThresholds] = {}
    previous: float | None = None
    for name in COMPUTE_CLASSES:
        value = measured.get(name, previous if previous is not None else next(iter(measured.values())))
        if previous is not None:
            value = max(value, previous)  # a coarser class is never held tighter than a finer one
        out[name] = RerankThresholds(max_score_abs_diff=value)
        previous = value
    return out


DEFAULT_RERANK_THRESHOLDS = default_rerank_thresholds()
