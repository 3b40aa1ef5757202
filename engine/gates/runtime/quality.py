"""Gate 2's second question: how far is what a user gets from the source model? Measured, then budgeted.

Correctness (does llama.cpp run this file as transformers runs the same weights?) is held to the compute
path's own noise, elsewhere in gate 2. This module measures the *quantization cost*: llama.cpp on the
artifact against transformers on the source's own weights, the figures llama-perplexity's
`--kl-divergence` prints (KL divergence and its percentiles, the probability of the text's next token
moved, Δp, with its percentiles and RMS, how often the top token stays the same, the perplexity ratio),
per slice of the text set. A policy budget may then refuse a file whose cost is too high for its use
(`quality.*` blockers): a budget is a choice about usefulness, never a claim that the file is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.blockers import Blocker
from engine.gates.runtime.logit_math import ComparedRows, compared
from engine.quality_budgets import QualityBudget
from engine.texts import PROBE_PREFIX, Text

# The percentiles llama-perplexity prints for KL and for Δp.
KL_PERCENTILES = (99.9, 99.0, 95.0, 90.0, 50.0, 10.0, 5.0, 1.0)
DELTA_P_PERCENTILES = (99.9, 99.0, 95.0, 90.0, 75.0, 50.0, 25.0, 10.0, 5.0, 1.0, 0.1)


@dataclass(frozen=True, slots=True)
class PositionStats:
    """Per-position figures of one text: KL, top-1 agreement, and (where a next token exists) Δp and the
    log-probabilities of that token on both sides."""

    kl: np.ndarray
    same_top: np.ndarray
    delta_p: np.ndarray
    log_p_reference: np.ndarray
    log_p_candidate: np.ndarray


def position_stats(reference: np.ndarray, candidate: np.ndarray, ids: Sequence[int], start: int = 0) -> PositionStats:
    """`reference` and `candidate` are [rows, vocab] logits of positions start, start + 1, ... of `ids`
    (a block of a text: the next token is known for every position but the text's last)."""
    return joined([stats_of(rows, ids, start + offset) for offset, rows in compared(reference, candidate)])


def stats_of(rows: ComparedRows, ids: Sequence[int], start: int) -> PositionStats:
    """The figures of rows already compared, which are positions start, start + 1, ... of `ids`."""
    every = np.asarray(ids, dtype=np.int64)
    positions = np.arange(start, start + len(rows.kl))
    local = np.flatnonzero(positions + 1 < len(every))
    following = every[positions[local] + 1]
    ref_next, cand_next = rows.log_p[local, following], rows.log_q[local, following]
    same = rows.reference.argmax(-1) == rows.candidate.argmax(-1)
    return PositionStats(rows.kl, same, np.exp(cand_next) - np.exp(ref_next), ref_next, cand_next)


def joined(parts: Sequence[PositionStats]) -> PositionStats:
    """Consecutive positions' figures as one."""
    return PositionStats(*(np.concatenate([getattr(part, name) for part in parts]) for name in
                           ("kl", "same_top", "delta_p", "log_p_reference", "log_p_candidate")))


def _percentiles(values: np.ndarray, which: Sequence[float]) -> dict[str, float]:
    if not values.size:
        return {}
    return {f"p{q:g}": float(np.percentile(values, q)) for q in which}


def summarize(stats: Sequence[PositionStats]) -> dict[str, object]:
    """llama-perplexity's KL-divergence summary over every position of `stats`."""
    kl = np.concatenate([s.kl for s in stats]) if stats else np.zeros(0)
    same = np.concatenate([s.same_top for s in stats]) if stats else np.zeros(0, dtype=bool)
    delta = np.concatenate([s.delta_p for s in stats]) if stats else np.zeros(0)
    log_p = np.concatenate([s.log_p_reference for s in stats]) if stats else np.zeros(0)
    log_q = np.concatenate([s.log_p_candidate for s in stats]) if stats else np.zeros(0)
    if not kl.size:
        return {"positions": 0}
    out: dict[str, object] = {
        "positions": int(kl.size), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
        "kl_min": float(kl.min()), "kl_percentiles": _percentiles(kl, KL_PERCENTILES),
        "same_top": float(same.mean()),
    }
    if delta.size:
        out.update(delta_p_mean=float(delta.mean()), delta_p_rms=float(np.sqrt((delta**2).mean())),
                   delta_p_max=float(delta.max()), delta_p_min=float(delta.min()),
                   delta_p_percentiles=_percentiles(delta, DELTA_P_PERCENTILES),
                   ppl_reference=float(np.exp(-log_p.mean())), ppl_candidate=float(np.exp(-log_q.mean())),
                   ppl_ratio=float(np.exp(log_p.mean() - log_q.mean())))
    return out


def _over(value: object, limit: float | None, bound: str) -> bool:
    if limit is None or not isinstance(value, int | float):
        return False
    return not (value <= limit if bound == "max" else value >= limit)


def judge_causal(summary: Mapping[str, object], budget: QualityBudget, where: str) -> list[Blocker]:
    """The causal-LM budget's limits against one summary (`where` names the slice)."""
    percentiles = summary.get("kl_percentiles")
    p99 = percentiles.get("p99") if isinstance(percentiles, dict) else None
    found = []
    for code, value, limit, bound, label in (
        ("quality.kl_above_budget", summary.get("kl_mean"), budget.max_kl_mean, "max", "KL mean"),
        ("quality.kl_above_budget", p99, budget.max_kl_p99, "max", "KL p99"),
        ("quality.same_top_below_budget", summary.get("same_top"), budget.min_same_top, "min", "same top token"),
        ("quality.ppl_above_budget", summary.get("ppl_ratio"), budget.max_ppl_ratio, "max", "perplexity ratio"),
    ):
        if _over(value, limit, bound):
            found.append(Blocker(code=code, gate="runtime", why=f"{where}: {label} {value:.4g} against the source, "
                                 f"budget {bound} {limit}"))
    return found


def judge_embedding(min_cosine: float, top1_equal: bool | None, budget: QualityBudget, where: str) -> list[Blocker]:
    """The embedding budget: the floor on cosine to the source, and retrieval top-1 equal to the source's."""
    found = []
    if _over(min_cosine, budget.min_cosine, "min"):
        found.append(Blocker(code="quality.cosine_below_budget", gate="runtime",
                             why=f"{where}: minimum cosine to the source {min_cosine:.4f}, budget min "
                                 f"{budget.min_cosine}"))
    if budget.retrieval_top1_equal and top1_equal is False:
        found.append(Blocker(code="quality.top1_differs_from_source", gate="runtime",
                             why=f"{where}: retrieval top-1 differs from the source model's"))
    return found


OVERALL = "overall"  # every measured text but the probe: what the class budget applies to


class SourceGap:
    """The gap between llama.cpp and the source model, gathered per text as gate 2 measures, then summarised
    per slice and overall (the probe's slices are reported, and budgeted only where a policy names them)."""

    def __init__(self) -> None:
        self.logits: dict[str, list[PositionStats]] = {}
        self.cosines: dict[str, list[tuple[str, float]]] = {}
        self.retrieval_top1_equal: bool | None = None
        self.rerank_top1_differs: list[str] = []  # a reranker's queries whose best document is not the source's
        # an embedding model's labelled retrieval set per served width: (where, truncated, min cosine to the
        # source, how far nDCG@10 fell below the source's)
        self.widths: list[tuple[str, bool, float, float]] = []

    def add_width(self, where: str, truncated: bool, min_cosine: float, ndcg_drop: float) -> None:
        self.widths.append((where, truncated, min_cosine, ndcg_drop))

    def add_logits(self, text: Text, stats: PositionStats) -> None:
        self.logits.setdefault(text.slice, []).append(stats)

    def add_cosine(self, text: Text, cosine: float) -> None:
        self.cosines.setdefault(text.slice, []).append((text.label, cosine))

    def _slices(self) -> list[str]:
        return sorted(set(self.logits) | set(self.cosines))

    def summary(self) -> dict[str, dict[str, object]]:
        """Slice name (and OVERALL) -> its figures."""
        out: dict[str, dict[str, object]] = {}
        overall_logits = [s for name, rows in self.logits.items() if not name.startswith(PROBE_PREFIX) for s in rows]
        overall_cos = [c for name, rows in self.cosines.items() if not name.startswith(PROBE_PREFIX) for _, c in rows]
        for name in [OVERALL, *self._slices()]:
            logits = overall_logits if name == OVERALL else self.logits.get(name, [])
            cosines = overall_cos if name == OVERALL else [c for _, c in self.cosines.get(name, [])]
            figures: dict[str, object] = {}
            if logits:
                figures.update(summarize(logits))
            if cosines:
                figures.update(texts=len(cosines), min_cosine=float(min(cosines)),
                               mean_cosine=float(np.mean(cosines)))
            out[name] = figures
        return out

    def judge(self, summary: Mapping[str, Mapping[str, object]], budget: QualityBudget,
              slice_budgets: Mapping[str, QualityBudget]) -> list[Blocker]:
        """The class budget on OVERALL (and on retrieval), each named slice budget on its slice."""
        found: list[Blocker] = []
        for name, limits in [(OVERALL, budget), *((n, b) for n, b in slice_budgets.items() if n in summary)]:
            figures = summary.get(name) or {}
            where = "all measured texts" if name == OVERALL else f"slice {name!r}"
            found += judge_causal(figures, limits, where)
            if isinstance(figures.get("min_cosine"), float):
                top1 = self.retrieval_top1_equal if name == OVERALL else None
                found += judge_embedding(float(figures["min_cosine"]), top1, limits, where)  # type: ignore[arg-type]
        found += self._judge_widths(budget)
        if budget.rerank_top1_equal and self.rerank_top1_differs:
            found.append(Blocker(code="quality.top1_differs_from_source", gate="runtime",
                                 why="the best document is not the one the source model ranks first for "
                                     f"{', '.join(self.rerank_top1_differs)}"))
        return found

    def _judge_widths(self, budget: QualityBudget) -> list[Blocker]:
        """The labelled set at every served width: the cosine floor (the full width's is the texts' own check)
        and the nDCG@10 drop."""
        found = []
        for where, truncated, cosine, drop in self.widths:
            if truncated and _over(cosine, budget.min_cosine_truncated, "min"):
                found.append(Blocker(code="quality.cosine_below_budget", gate="runtime",
                                     why=f"at {where}: minimum cosine to the source {cosine:.4f} on the labelled "
                                         f"retrieval set, budget min {budget.min_cosine_truncated}"))
            if _over(drop, budget.max_ndcg10_drop, "max"):
                found.append(Blocker(code="quality.retrieval_below_budget", gate="runtime",
                                     why=f"at {where}: nDCG@10 on the labelled retrieval set {drop:.4f} below the "
                                         f"source's, budget max {budget.max_ndcg10_drop}"))
        return found
