"""Gate 2 for rerankers: does llama.cpp score (query, document) pairs as the Hugging Face model does?

A reranker (a cross-encoder with a one-logit classification head) is judged on what it is used
for: the relevance score of each pair and the order it puts the documents of a query in. The pair
input is compared first (the tokens llama.cpp builds from the GGUF's flags against the HF pair
template): a missing separator changes every score, and the ids say why. Scores are compared per
pair (absolute difference, in logit units); order is compared only between documents whose
reference scores differ by more than twice the allowed score error, since closer ones are a tie
the measurement cannot resolve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.blockers import Blocker
from engine.rerank_thresholds import RerankThresholds


@dataclass(frozen=True, slots=True)
class RerankQuery:
    label: str
    query: str
    documents: tuple[str, ...]


# The built-in set: each query with one relevant document among distractors, in several scripts.
RERANK_SET: tuple[RerankQuery, ...] = (
    RerankQuery("panda", "What is a giant panda?", (
        "The giant panda is a bear native to south central China, known for eating bamboo.",
        "Pandas is a Python library for data analysis.",
        "The stock market closed higher on Friday after a volatile week.",
        "Hello")),
    RerankQuery("paris", "What is the capital of France?", (
        "Paris is the capital and most populous city of France.",
        "Berlin is the capital of Germany.",
        "La tour Eiffel est un monument de Paris.",
        "Tokyo es la capital de Japón.")),
    RerankQuery("verify", "How do I verify a converted model?", (
        "Compare every tensor of the converted file with the source weights, then compare outputs.",
        "Convert the model with llama.cpp's converter.",
        "東京は日本の首都です。",
        "안녕하세요, 오늘 날씨가 정말 좋네요.")),
)

Scorer = Callable[[str, str], tuple[list[int], float]]


@dataclass
class RelevanceResult:
    blockers: list[Blocker] = field(default_factory=list)
    per_pair: list[dict[str, Any]] = field(default_factory=list)
    per_query: list[dict[str, Any]] = field(default_factory=list)

    @property
    def max_abs_diff(self) -> float:
        return max((p["abs_diff"] for p in self.per_pair), default=math.nan)


def _inversions(reference: Sequence[float], candidate: Sequence[float], resolvable: float) -> list[tuple[int, int]]:
    """Document pairs (i, j) the reference orders i above j by more than `resolvable` and the candidate does not."""
    out = []
    for i, ref_i in enumerate(reference):
        for j, ref_j in enumerate(reference):
            if ref_i - ref_j > resolvable and not candidate[i] > candidate[j]:
                out.append((i, j))
    return out


def _pair_blocker(query: RerankQuery, doc: int, ref_ids: list[int], cand_ids: list[int]) -> Blocker:
    at = next((k for k, (a, b) in enumerate(zip(ref_ids, cand_ids, strict=False)) if a != b),
              min(len(ref_ids), len(cand_ids)))
    why = (f"{query.label} document {doc}: the pair llama.cpp builds from the GGUF flags differs from the "
           f"Hugging Face pair template at position {at} (HF {ref_ids[max(at - 2, 0):at + 3]}, "
           f"llama.cpp {cand_ids[max(at - 2, 0):at + 3]}; lengths {len(ref_ids)} and {len(cand_ids)})")
    return Blocker(code="rerank.pair_mismatch", gate="runtime", why=why, text=query.query)


def check_relevance(queries: Sequence[RerankQuery], reference: Scorer, candidate: Scorer,
                    thresholds: RerankThresholds) -> RelevanceResult:
    """Score every (query, document) pair both ways and compare scores, inputs and order."""
    result = RelevanceResult()
    for query in queries:
        ref_scores: list[float] = []
        cand_scores: list[float] = []
        for doc, document in enumerate(query.documents):
            ref_ids, ref = reference(query.query, document)
            cand_ids, cand = candidate(query.query, document)
            if ref_ids != cand_ids:
                result.blockers.append(_pair_blocker(query, doc, ref_ids, cand_ids))
            if not math.isfinite(cand):
                result.blockers.append(Blocker(code="rerank.not_finite", gate="runtime", text=query.query,
                                               why=f"{query.label} document {doc}: llama.cpp scored {cand}"))
                cand = math.nan
            diff = abs(cand - ref)
            result.per_pair.append({"query": query.label, "document": doc, "reference": ref, "candidate": cand,
                                    "abs_diff": diff, "ids_equal": ref_ids == cand_ids})
            if not diff <= thresholds.max_score_abs_diff:
                result.blockers.append(Blocker(
                    code="rerank.score_above_threshold", gate="runtime", text=query.query,
                    why=f"{query.label} document {doc}: score {cand:.6g}, reference {ref:.6g} "
                        f"(|difference| {diff:.3g} > {thresholds.max_score_abs_diff:g})"))
            ref_scores.append(ref)
            cand_scores.append(cand)
        inverted = _inversions(ref_scores, cand_scores, 2 * thresholds.max_score_abs_diff)
        result.per_query.append({"query": query.label, "reference_order": _order(ref_scores),
                                 "candidate_order": _order(cand_scores), "inversions": inverted})
        if inverted:
            result.blockers.append(Blocker(
                code="rerank.order_mismatch", gate="runtime", text=query.query,
                why=f"{query.label}: llama.cpp orders documents {_order(cand_scores)}, the reference "
                    f"{_order(ref_scores)}; inverted pairs {inverted}"))
    return result


def _order(scores: Sequence[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i] if math.isfinite(scores[i]) else math.inf)


class _PairTokenizer(Protocol):
    def encode_pair(self, query: str, document: str) -> list[int]: ...


class _Classifier(Protocol):
    def logits(self, ids: list[int]) -> Any: ...


class _RankCandidate(Protocol):
    def pair_tokens(self, query: str, document: str) -> list[int]: ...

    def rank_scores(self, tokens: list[int]) -> Any: ...


Orders = tuple[tuple[int, ...], ...]
Scores = tuple[tuple[float, ...], ...]


def document_order(scores: Sequence[float]) -> list[int]:
    """A query's documents, most relevant first (non-finite scores last)."""
    return _order(scores)


def candidate_scores(candidate: _RankCandidate, queries: Sequence[RerankQuery] = RERANK_SET) -> Scores:
    """llama.cpp's score of every (query, document) pair of the set, per query: what gate 3 re-measures."""
    return tuple(tuple(float(candidate.rank_scores(candidate.pair_tokens(q.query, d))[0]) for d in q.documents)
                 for q in queries)


def changed_orders(measured: Orders, measured_scores: Scores, scores: Scores, tie: float) -> list[int]:
    """Queries whose document order differs from the measured one; with the measured scores at hand, only
    pairs the measurement separated by more than `tie` count (closer ones are a tie either way)."""
    out = []
    for index, (order, now) in enumerate(zip(measured, scores, strict=True)):
        if measured_scores:
            if _inversions(measured_scores[index], now, tie):
                out.append(index)
        elif list(order) != _order(now):
            out.append(index)
    return out


def measure_relevance(hf: _PairTokenizer, model: _Classifier, candidate: _RankCandidate,
                      thresholds: RerankThresholds) -> tuple[list[Blocker], dict[str, Any], tuple[Orders, Scores]]:
    """Gate 2's reranker measurement on the built-in set: blockers, report details, and llama.cpp's orders
    and scores (for gate 3 to find again in the released file)."""
    def reference(query: str, document: str) -> tuple[list[int], float]:
        ids = hf.encode_pair(query, document)
        return ids, float(model.logits(ids)[0])

    def scored(query: str, document: str) -> tuple[list[int], float]:
        ids = candidate.pair_tokens(query, document)
        return ids, float(candidate.rank_scores(ids)[0])

    result = check_relevance(RERANK_SET, reference, scored, thresholds)
    details = {"max_abs_diff": result.max_abs_diff, "threshold": thresholds.max_score_abs_diff,
               "per_pair": result.per_pair, "per_query": result.per_query,
               "pair_input": "[BOS] query [EOS] [SEP] document [EOS] from the GGUF flags (llama-server /rerank)"}
    orders = tuple(tuple(q["candidate_order"]) for q in result.per_query)
    scores = tuple(tuple(p["candidate"] for p in result.per_pair if p["query"] == q.label) for q in RERANK_SET)
    return result.blockers, details, (orders, scores)
