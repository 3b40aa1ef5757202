"""Gate 2, embeddings as applications use them: a labelled retrieval set, at every width a platform serves.

Why: cosine per text and the top-1 of a few queries say the two runtimes compute the same vectors; they do
not say what a user of the model loses. Applications rank passages for a query, often at a truncated
Matryoshka width (truncate, then normalise), and a conversion can reorder neighbours at 64 dimensions while
the full vector's cosine hardly moves. So gate 2 embeds a labelled set (`engine/data/retrieval_set.json`,
written for this project: queries in three languages, each with its relevant passages and at least two hard
negatives, some long documents) with the reference, llama.cpp and the source, and at each served width
reports recall@1, recall@10 and nDCG@10 of each, the order of every decisive pair (a pair whose reference
scores lie further apart than the compute class moves a score gap must keep its order; near-ties are
counted and listed, never a blocker) and the cosine of every text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

TOP = 10  # recall@10 and nDCG@10
LISTED_NEAR_TIES = 20  # the report lists this many near-ties (the count is always whole)


@dataclass(frozen=True, slots=True)
class LabelledQuery:
    id: str
    language: str
    text: str
    kind: str
    relevant: tuple[int, ...]  # indices into LabelledSet.passages
    hard_negatives: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LabelledSet:
    name: str
    passage_ids: tuple[str, ...]
    passages: tuple[str, ...]
    queries: tuple[LabelledQuery, ...]


MAX_PASSAGES, MAX_QUERIES, MAX_CHARS = 2000, 1000, 20_000  # a submitted set: ~2.5x the built-in one's texts


PassageId = Annotated[str, Field(min_length=1, max_length=64)]


class _Passage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str = Field(min_length=1, max_length=64)
    text: str = Field(min_length=1, max_length=MAX_CHARS)
    language: str = Field("", max_length=16)


class _Query(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str = Field(min_length=1, max_length=64)
    text: str = Field(min_length=1, max_length=MAX_CHARS)
    language: str = Field("", max_length=16)
    kind: str = Field("", max_length=32)
    relevant: list[PassageId] = Field(min_length=1, max_length=64)
    hard_negatives: list[PassageId] = Field(default_factory=list, max_length=64)


class LabelledSetDocument(BaseModel):
    """A labelled retrieval set as JSON (the built-in one's format): what a submitter may send instead."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    passages: list[_Passage] = Field(min_length=2, max_length=MAX_PASSAGES)
    queries: list[_Query] = Field(min_length=1, max_length=MAX_QUERIES)


def parse_labelled_set(document: dict[str, Any], name: str) -> LabelledSet:
    """A set in the shipped format; a malformed one, or a query naming a passage that does not exist, is
    refused (ValueError, saying which). The document's schema already demands a query and, for each, a
    relevant passage."""
    try:
        checked = LabelledSetDocument.model_validate(document).model_dump()
    except ValidationError as exc:
        raise ValueError(f"{name}: {exc.error_count()} problem(s), first: {exc.errors()[0]['loc']} "
                         f"{exc.errors()[0]['msg']}") from exc
    document = checked
    ids = tuple(str(p["id"]) for p in document["passages"])
    index = {pid: number for number, pid in enumerate(ids)}
    if len(index) != len(ids):
        raise ValueError(f"{name}: a passage id appears twice")

    def resolve(query: dict[str, Any], key: str) -> tuple[int, ...]:
        missing = [pid for pid in query[key] if pid not in index]
        if missing:
            raise ValueError(f"{name}: query {query['id']} names passages that do not exist: {missing}")
        return tuple(index[pid] for pid in query[key])

    queries = tuple(LabelledQuery(str(q["id"]), str(q["language"]), str(q["text"]), str(q["kind"]),
                                  resolve(q, "relevant"), resolve(q, "hard_negatives"))
                    for q in document["queries"])
    return LabelledSet(name, ids, tuple(str(p["text"]) for p in document["passages"]), queries)


def shipped_set() -> LabelledSet:
    raw = resources.files("engine").joinpath("data/retrieval_set.json").read_text(encoding="utf-8")
    return parse_labelled_set(json.loads(raw), "convgate retrieval set v1")


def at_width(vectors: np.ndarray, width: int) -> np.ndarray:
    """Rows truncated to `width`, then normalised (the order Matryoshka serving uses)."""
    cut = np.asarray(vectors, dtype=np.float64)[:, :width]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return cut / np.where(norms > 0, norms, 1.0)


def ranking(scores: np.ndarray, labelled: LabelledSet) -> dict[str, float]:
    """Recall@1, recall@10 and nDCG@10 (binary relevance) of a [queries, passages] score matrix, averaged
    over the queries."""
    recall1, recall10, ndcg = [], [], []
    for query, row in zip(labelled.queries, scores, strict=True):
        order = np.argsort(-row, kind="stable")[:TOP]
        relevant = set(query.relevant)
        recall1.append(float(int(order[0]) in relevant))
        recall10.append(len(relevant & {int(i) for i in order}) / len(relevant))
        gains = sum(1 / math.log2(rank + 2) for rank, i in enumerate(order) if int(i) in relevant)
        ideal = sum(1 / math.log2(rank + 2) for rank in range(min(len(relevant), TOP)))
        ndcg.append(gains / ideal)
    return {"recall_at_1": float(np.mean(recall1)), "recall_at_10": float(np.mean(recall10)),
            "ndcg_at_10": float(np.mean(ndcg))}


@dataclass(frozen=True, slots=True)
class PairOrder:
    """How llama.cpp ordered the pairs the reference ordered: per query, its relevant passages, its hard
    negatives and the reference's top 10."""

    pairs: int
    decisive: int
    swapped: tuple[dict[str, Any], ...]  # decisive pairs whose order llama.cpp reversed
    near_ties: int
    near_tie_examples: tuple[dict[str, Any], ...]
    gap_moved_p99: float  # how far llama.cpp moved a pair's score gap, 99th percentile over every pair


def pair_order(reference: np.ndarray, candidate: np.ndarray, labelled: LabelledSet, margin: float) -> PairOrder:
    """A pair is decisive when the reference's scores differ by more than `margin` (what the compute class
    moves a score gap, measured on honest files); then llama.cpp must order it the same way."""
    swapped: list[dict[str, Any]] = []
    ties: list[dict[str, Any]] = []
    moved: list[float] = []
    pairs = decisive = 0
    for number, query in enumerate(labelled.queries):
        ref, cand = reference[number], candidate[number]
        chosen = sorted({*query.relevant, *query.hard_negatives, *(int(i) for i in np.argsort(-ref)[:TOP])})
        for a_at, a in enumerate(chosen):
            for b in chosen[a_at + 1:]:
                gap, cand_gap = float(ref[a] - ref[b]), float(cand[a] - cand[b])
                pairs += 1
                moved.append(abs(gap - cand_gap))
                row = {"query": query.id, "passages": [labelled.passage_ids[a], labelled.passage_ids[b]],
                       "reference_gap": round(gap, 6), "candidate_gap": round(cand_gap, 6)}
                if abs(gap) <= margin:
                    ties.append(row)
                    continue
                decisive += 1
                if gap * cand_gap <= 0:
                    swapped.append(row)
    return PairOrder(pairs, decisive, tuple(swapped), len(ties), tuple(ties[:LISTED_NEAR_TIES]),
                     float(np.percentile(moved, 99)) if moved else 0.0)


def served_widths(declared: Sequence[int], requested: Sequence[int] | None, full: int) -> tuple[int, ...]:
    """The widths compared, widest first: the full one, and the policy's (or else the model's declared
    Matryoshka dimensions) below it."""
    chosen = requested if requested is not None else declared
    return (full, *sorted({w for w in chosen if 0 < w < full}, reverse=True))


def min_cosine_at(reference: np.ndarray, candidate: np.ndarray, width: int) -> float:
    """The smallest cosine of paired rows at `width` (each row truncated, then normalised)."""
    return float(np.min(np.sum(at_width(reference, width) * at_width(candidate, width), axis=1)))
