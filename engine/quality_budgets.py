"""How much a conversion may cost against its source: the policy's quality budgets, per precision class.

Correctness is gate 2's tight comparison with the artifact's own weights (`engine/thresholds.py`). A
budget is a different kind of rule: not "is this file what it claims" but "is it close enough to the
source model for its use". It is what a platform sets per type (a 4-bit causal LM may move the next-token
distribution further than an 8-bit one), per slice of its text set (a language, a domain), and its
blockers have their own family (`quality.*`), so a NO-GO says plainly which kind of rule refused the file.

Default budgets:
- embedding models keep the floor this project was founded on in every class: every text's embedding at
  cosine >= 0.99 to the source's, and every retrieval top-1 equal to the source's.
- causal LMs: per precision class, `COST_MARGIN` times what llama.cpp's recommended recipe of that class
  costs a trained model (SmolLM2-135M-Instruct from a BF16 source: Q8_0, Q6_K, Q5_K_M, Q4_K_M; every float
  type for the float class): the KL mean, the share of positions whose top token changed, and the
  perplexity ratio's excess over 1 (never budgeted below `PPL_EXCESS_FLOOR`). So an honest Q4_K_M of a
  model like it passes and says what it cost, while a lossier recipe of the same class (Q4_0, IQ4_NL:
  several times the KL) is refused by the budget, not by correctness. The class below 4 bits has no
  recommended recipe measured and takes the 4-bit budget. The 99th KL percentile is reported, not
  budgeted: over a few hundred positions it is a handful of tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from engine.quant.precision import PRECISION_CLASSES, PrecisionClass
from engine.thresholds import round_outward

EMBEDDING_MIN_COSINE = 0.99
COST_MARGIN = 2.0  # KL mean, the changed-top share and the perplexity excess: 2x the recommended recipe's cost
PPL_EXCESS_FLOOR = 0.01  # a budget never asks the perplexity to be closer than 1% (a quant may even lower it)


class QualityBudget(BaseModel):
    """Limits on the gap to the source model; a field left None is not budgeted, a budgeted one is finite
    (None, not infinity, says "no limit")."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    min_cosine: float | None = Field(None, ge=-1, le=1, description="embeddings: min cosine to the source")
    retrieval_top1_equal: bool = Field(False, description="embeddings: retrieval top-1 equal to the source's")
    rerank_top1_equal: bool = Field(False, description="rerankers: each query's best document the source's; off by "
                                    "default, as no trained reranker was measured (a random-weight one's near-tied "
                                    "scores flip under an honest Q8_0)")
    max_kl_mean: float | None = Field(None, ge=0, description="causal LMs: mean KL(source || llama.cpp)")
    max_kl_p99: float | None = Field(None, ge=0, description="causal LMs: 99th percentile of the KL")
    min_same_top: float | None = Field(None, ge=0, le=1, description="causal LMs: share of positions whose top "
                                       "token equals the source's")
    max_ppl_ratio: float | None = Field(None, ge=1, description="causal LMs: perplexity of the texts under "
                                        "llama.cpp over the source's")
    max_ndcg10_drop: float | None = Field(None, ge=0, le=1, description="embeddings: how far nDCG@10 on the "
                                          "labelled retrieval set may fall below the source's, at every served "
                                          "width")
    min_cosine_truncated: float | None = Field(None, ge=-1, le=1, description="embeddings: min cosine to the "
                                               "source of a labelled-set text at a served width below the full one")


@dataclass(frozen=True, slots=True)
class MeasuredCost:
    """What one recommended recipe of a precision class cost a trained model against its source."""

    fixture: str
    precision: PrecisionClass
    kl_mean: float
    kl_p99: float
    same_top: float
    ppl_ratio: float


# Measured with `python scripts/measure_thresholds.py` (see engine/thresholds.py for the versions and texts).
# SmolLM2's BF16 source was dequantized from a Q4_1 GGUF, so its own Q4_1 costs almost nothing (0.0078 KL):
# that is why the budgets are anchored on the recommended recipes, not on the cheapest file of a class.
MEASURED_COST: tuple[MeasuredCost, ...] = (
    MeasuredCost('smollm2-BF16', 'float', kl_mean=0.000198, kl_p99=0.00131, same_top=0.987, ppl_ratio=1.003),
    MeasuredCost('smollm2-F16', 'float', kl_mean=5.01e-06, kl_p99=3.83e-05, same_top=1, ppl_ratio=0.9998),
    MeasuredCost('smollm2-F32', 'float', kl_mean=1.55e-06, kl_p99=1.63e-05, same_top=0.996, ppl_ratio=1),
    MeasuredCost('smollm2-Q8_0', '8bit', kl_mean=0.00933, kl_p99=0.0682, same_top=0.952, ppl_ratio=1.005),
    MeasuredCost('smollm2-Q6_K', '6bit', kl_mean=0.0337, kl_p99=0.158, same_top=0.895, ppl_ratio=0.9888),
    MeasuredCost('smollm2-Q5_K_M', '5bit', kl_mean=0.136, kl_p99=1.13, same_top=0.79, ppl_ratio=1.147),
    MeasuredCost('smollm2-Q4_K_M', '4bit', kl_mean=0.108, kl_p99=0.475, same_top=0.843, ppl_ratio=1.118),
)


@dataclass(frozen=True, slots=True)
class MeasuredRetrievalCost:
    """What one recommended recipe of a precision class cost a trained embedding model on the labelled
    retrieval set (`engine/gates/runtime/labelled_measure.py`), at 384, 128 and 64 dimensions."""

    fixture: str
    precision: PrecisionClass
    min_cosine_truncated: float  # the lowest cosine to the source of a labelled text at 128 or 64 dimensions
    ndcg_drop: float  # the largest fall of nDCG@10 below the source's, over the widths


# Measured with `python scripts/measure_thresholds.py --only minilm` (all-MiniLM-L6-v2 from its F32 source;
# the recommended recipes of each class, as MEASURED_COST; Q4_0 is not one, and costs 0.93 truncated).
MEASURED_RETRIEVAL_COST: tuple[MeasuredRetrievalCost, ...] = (
    MeasuredRetrievalCost('minilm-F32', 'float', min_cosine_truncated=0.9999972, ndcg_drop=0.0),
    MeasuredRetrievalCost('minilm-F16', 'float', min_cosine_truncated=0.9999969, ndcg_drop=0.0),
    MeasuredRetrievalCost('minilm-BF16', 'float', min_cosine_truncated=0.9999571, ndcg_drop=0.0),
    MeasuredRetrievalCost('minilm-Q8_0', '8bit', min_cosine_truncated=0.9989339, ndcg_drop=0.0),
    MeasuredRetrievalCost('minilm-Q6_K', '6bit', min_cosine_truncated=0.9974375, ndcg_drop=0.00165),
    MeasuredRetrievalCost('minilm-Q5_K_M', '5bit', min_cosine_truncated=0.9851438, ndcg_drop=0.00094),
    MeasuredRetrievalCost('minilm-Q4_K_M', '4bit', min_cosine_truncated=0.9790697, ndcg_drop=0.0),
)
NDCG_DROP_FLOOR = 0.02  # a budget never asks nDCG@10 to stay closer than this (two queries of ninety moved)


def _retrieval_budget(precision: PrecisionClass) -> dict[str, float]:
    rows = [m for m in MEASURED_RETRIEVAL_COST if m.precision == precision]
    if not rows:
        return {}
    deficit = max(1 - m.min_cosine_truncated for m in rows) * COST_MARGIN
    drop = max(max(m.ndcg_drop for m in rows) * COST_MARGIN, NDCG_DROP_FLOOR)
    return {"min_cosine_truncated": round(1 - round_outward(deficit, up=True), 12),
            "max_ndcg10_drop": round_outward(drop, up=True)}


def derive_budget(precision: PrecisionClass) -> QualityBudget:
    """The class's budget from its recommended recipes in MEASURED_COST and MEASURED_RETRIEVAL_COST; the
    embedding floor in every class."""
    rows = [m for m in MEASURED_COST if m.precision == precision]
    floor = {"min_cosine": EMBEDDING_MIN_COSINE, "retrieval_top1_equal": True, **_retrieval_budget(precision)}
    if not rows:
        return QualityBudget(**floor)
    changed = max(1 - m.same_top for m in rows) * COST_MARGIN
    excess = max(max(m.ppl_ratio for m in rows) - 1, 0.0) * COST_MARGIN
    return QualityBudget(
        **floor,
        max_kl_mean=round_outward(max(m.kl_mean for m in rows) * COST_MARGIN, up=True),
        min_same_top=round(1 - round_outward(changed, up=True), 12),
        max_ppl_ratio=round(1 + round_outward(max(excess, PPL_EXCESS_FLOOR), up=True), 12),
    )


def _no_tighter_than(finer: QualityBudget, current: QualityBudget) -> QualityBudget:
    """A coarser class may cost what a finer one may, field by field (its own anchor may just be lucky)."""
    def loosest(a: float | None, b: float | None, pick: Callable[[float, float], float]) -> float | None:
        return b if a is None else a if b is None else pick(a, b)

    return current.model_copy(update={"max_kl_mean": loosest(finer.max_kl_mean, current.max_kl_mean, max),
                                      "min_same_top": loosest(finer.min_same_top, current.min_same_top, min),
                                      "max_ppl_ratio": loosest(finer.max_ppl_ratio, current.max_ppl_ratio, max),
                                      "max_ndcg10_drop": loosest(finer.max_ndcg10_drop, current.max_ndcg10_drop, max),
                                      "min_cosine_truncated": loosest(finer.min_cosine_truncated,
                                                                      current.min_cosine_truncated, min)})


def default_budgets() -> dict[PrecisionClass, QualityBudget]:
    """Every class, never tighter than a finer one; a class without a measured recipe is budgeted like the
    next finer one (an honest coarse file may be refused by the budget, never let through by a guess)."""
    out: dict[PrecisionClass, QualityBudget] = {}
    previous: QualityBudget | None = None
    for name in PRECISION_CLASSES:
        current = derive_budget(name)
        out[name] = previous = current if previous is None else _no_tighter_than(previous, current)
    return out


DEFAULT_QUALITY_BUDGETS = default_budgets()
