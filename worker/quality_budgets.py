"""How much a conversion may cost against its source: the policy's quality budgets, per precision class.

Correctness is gate 2's tight comparison with the artifact's own weights (`worker/thresholds.py`). A
budget is a different kind of rule: not "is this file what it claims" but "is it close enough to the
source model for its use". It is what a platform sets per type (a 4-bit causal LM may move the next-token
distribution further than an 8-bit one), per slice of its text set (a language, a domain), and its
blockers have their own family (`quality.*`), so a NO-GO says plainly which kind of rule refused the file.

Default budgets:
- embedding models keep the floor this project was founded on in every class: every text's embedding at
  cosine >= 0.99 to the source's, and every retrieval top-1 equal to the source's.
- causal LMs: the cost measured on honest conversions of a trained model (SmolLM2-135M-Instruct, BF16
  source) per precision class, widened by `COST_MARGIN` (KL mean and p99, the perplexity ratio's excess
  over 1) and `SAME_TOP_SLACK`. So an honest Q4_K_M of a model like it passes and says what it measured; a
  model far more sensitive to quantization, or a file from a lossier recipe of the same class, is refused
  by the budget, not by correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from worker.quant.precision import PRECISION_CLASSES, PrecisionClass
from worker.thresholds import round_outward

EMBEDDING_MIN_COSINE = 0.99
COST_MARGIN = 2.0  # KL mean, KL p99 and the perplexity ratio's excess: 2x the trained model's honest cost
SAME_TOP_SLACK = 0.05  # same-top-token rate: the trained model's honest rate minus 5 points


class QualityBudget(BaseModel):
    """Limits on the gap to the source model; a field left None is not budgeted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_cosine: float | None = Field(None, ge=-1, le=1, description="embeddings: min cosine to the source")
    retrieval_top1_equal: bool = Field(False, description="embeddings: retrieval top-1 equal to the source's")
    max_kl_mean: float | None = Field(None, ge=0, description="causal LMs: mean KL(source || llama.cpp)")
    max_kl_p99: float | None = Field(None, ge=0, description="causal LMs: 99th percentile of the KL")
    min_same_top: float | None = Field(None, ge=0, le=1, description="causal LMs: share of positions whose top "
                                       "token equals the source's")
    max_ppl_ratio: float | None = Field(None, ge=1, description="causal LMs: perplexity of the texts under "
                                        "llama.cpp over the source's")


@dataclass(frozen=True, slots=True)
class MeasuredCost:
    """One honest conversion's cost against its trained source, over the default texts."""

    fixture: str
    precision: PrecisionClass
    kl_mean: float
    kl_p99: float
    same_top: float
    ppl_ratio: float


# Measured with `python scripts/measure_thresholds.py` (see worker/thresholds.py for the versions).
MEASURED_COST: tuple[MeasuredCost, ...] = ()


def derive_budget(precision: PrecisionClass) -> QualityBudget:
    """The class's budget from MEASURED_COST; the embedding floor applies in every class."""
    rows = [m for m in MEASURED_COST if m.precision == precision]
    floor = {"min_cosine": EMBEDDING_MIN_COSINE, "retrieval_top1_equal": True}
    if not rows:
        return QualityBudget(**floor)
    return QualityBudget(
        **floor,
        max_kl_mean=round_outward(max(m.kl_mean for m in rows) * COST_MARGIN, up=True),
        max_kl_p99=round_outward(max(m.kl_p99 for m in rows) * COST_MARGIN, up=True),
        min_same_top=round(round_outward(max(min(m.same_top for m in rows) - SAME_TOP_SLACK, 0.0), up=False), 12),
        max_ppl_ratio=round(1 + round_outward((max(m.ppl_ratio for m in rows) - 1) * COST_MARGIN, up=True), 12),
    )


def default_budgets() -> dict[PrecisionClass, QualityBudget]:
    """Every class; a class without a measured conversion is budgeted like the next finer one that has one
    (stricter than it might need: an honest coarse file may be refused by the budget, never let through
    by a guess)."""
    out: dict[PrecisionClass, QualityBudget] = {}
    previous: QualityBudget | None = None
    for name in PRECISION_CLASSES:
        current = derive_budget(name)
        if current.max_kl_mean is None and previous is not None:
            current = previous
        out[name] = previous = current
    return out


DEFAULT_QUALITY_BUDGETS = default_budgets()
