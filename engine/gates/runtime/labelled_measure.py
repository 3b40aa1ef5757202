"""Gate 2 runs the labelled retrieval set (`labelled_retrieval.py`) through the reference, llama.cpp and the
source, at every served width, and judges what correctness and the quality budget say about it.

Why here and not in `runtime_measures.py`: this is the one embedding measurement that reads three models
over a few hundred texts, and the widths, the passages too long for the context and the budget's figures
all belong to it alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from engine.blockers import Blocker
from engine.formats.source import SourceModel
from engine.gates.runtime.embedding_parity import retrieval_texts
from engine.gates.runtime.labelled_retrieval import (
    LabelledSet,
    at_width,
    min_cosine_at,
    pair_order,
    ranking,
    served_widths,
    shipped_set,
)
from engine.gates.runtime.quality import SourceGap
from engine.runtime.hf_reference import HFModel, HFTokenizer
from engine.runtime.llama_process import LlamaProcess
from engine.runtime.sentence_config import SentenceConfig
from engine.texts import RetrievalSet
from engine.thresholds import RuntimeThresholds

# a sentence-transformers model card records its Matryoshka training as the loss's "matryoshka_dims"
DECLARED_DIMS = re.compile(r'"matryoshka_dims"\s*:\s*\[([0-9,\s]+)\]')


def declared_widths(source: SourceModel) -> tuple[int, ...]:
    """The Matryoshka dimensions a source declares: its model card's `matryoshka_dims`, and the width its
    sentence-transformers config serves (`truncate_dim`); none when it declares neither."""
    found: set[int] = set()
    card = source.read_text("README.md") or ""
    for match in DECLARED_DIMS.finditer(card):
        found |= {int(part) for part in match.group(1).split(",") if part.strip()}
    served = (source.read_json("config_sentence_transformers.json") or {}).get("truncate_dim")
    if isinstance(served, int) and not isinstance(served, bool) and served > 0:
        found.add(served)
    return tuple(sorted(found, reverse=True))


def within(labelled: LabelledSet, keep: list[bool]) -> LabelledSet:
    """The set without the passages `keep` drops (too long for the context on either side), each query's
    labels renumbered; a query left without a relevant passage goes too."""
    number = np.cumsum(keep) - 1
    queries = []
    for query in labelled.queries:
        relevant = tuple(int(number[i]) for i in query.relevant if keep[i])
        if relevant:
            queries.append(replace(query, relevant=relevant,
                                   hard_negatives=tuple(int(number[i]) for i in query.hard_negatives if keep[i])))
    return LabelledSet(labelled.name, tuple(p for p, k in zip(labelled.passage_ids, keep, strict=True) if k),
                       tuple(p for p, k in zip(labelled.passages, keep, strict=True) if k), tuple(queries))


class MeasuredSides(Protocol):
    """What this measurement reads of gate 2's sides (`runtime_measures.Sides`)."""

    @property
    def hf(self) -> HFTokenizer: ...
    @property
    def correct(self) -> HFModel: ...
    @property
    def source(self) -> HFModel: ...
    @property
    def candidate(self) -> LlamaProcess: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def gap(self) -> SourceGap: ...
    @property
    def declared_widths(self) -> tuple[int, ...]: ...
    @property
    def labelled(self) -> LabelledSet | None: ...


def cut_to_fit(text: str, fits: Callable[[str], bool]) -> str | None:
    """The longest prefix of whole words that `fits` the context (both sides' token counts), so a long
    document is compared right at the context limit, as a user's truncating pipeline sends it; None when
    not even its first word fits."""
    words = text.split(" ")
    low, high = 0, len(words)  # words[:low] fits, words[:high + 1] does not
    while low < high:
        middle = (low + high + 1) // 2
        if fits(" ".join(words[:middle])):
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low]) if low else None


@dataclass(frozen=True, slots=True)
class Embedded:
    """Each side's vectors of the set's queries and passages, [texts, width]."""

    queries: dict[str, np.ndarray]
    passages: dict[str, np.ndarray]


def _embed(sides: MeasuredSides, sentence: SentenceConfig, labelled: LabelledSet) -> tuple[LabelledSet, Embedded,
                                                                                            int]:
    """Every side's vectors, with the model's query and document prompts; a passage too long for the context on
    either side is cut at the last whole word that fits (and counted), one whose first word does not fit is
    left out."""
    pooling = sentence.pooling or "mean"

    def ids(text: str) -> list[int]:
        return sides.hf.encode(text, add_special=True, parse_special=False)

    def prompted(chosen: LabelledSet) -> tuple[list[str], list[str]]:
        return retrieval_texts(sentence.prompts, RetrievalSet(tuple(q.text for q in chosen.queries),
                                                              chosen.passages))

    document_prompt = retrieval_texts(sentence.prompts, RetrievalSet((), ("",)))[1][0]

    def fits(passage: str) -> bool:
        text = document_prompt + passage
        return max(len(ids(text)), len(sides.candidate.tokenize(text, add_special=True, parse_special=False))) \
            <= sides.n_ctx

    kept = [passage if fits(passage) else cut_to_fit(passage, fits) for passage in labelled.passages]
    cut = sum(text is not None and text != whole for text, whole in zip(kept, labelled.passages, strict=True))
    labelled = within(labelled, [text is not None for text in kept])
    labelled = replace(labelled, passages=tuple(text for text in kept if text is not None))
    queries, passages = prompted(labelled)
    every = [ids(text) for text in (*queries, *passages)]
    sides.correct.prefetch(every)  # a streamed reference reads its weights once for all of them
    vectors = {"reference": np.stack([sides.correct.embed(i, pooling) for i in every])}
    if sides.source is sides.correct:  # one pass: the source's vectors are the ones just computed
        vectors["source"] = vectors["reference"]
    else:
        sides.source.prefetch(every)
        vectors["source"] = np.stack([sides.source.embed(i, pooling) for i in every])
    vectors["candidate"] = np.stack([sides.candidate.embed(text) for text in (*queries, *passages)])
    split = len(queries)
    return labelled, Embedded({k: v[:split] for k, v in vectors.items()},
                              {k: v[split:] for k, v in vectors.items()}), cut


def _scores(embedded: Embedded, side: str, width: int) -> np.ndarray:
    return at_width(embedded.queries[side], width) @ at_width(embedded.passages[side], width).T


def measure_labelled(sides: MeasuredSides, sentence: SentenceConfig, thresholds: RuntimeThresholds,
                     requested_widths: tuple[int, ...] | None) -> tuple[list[Blocker], dict[str, Any]]:
    """Correctness blockers (a decisive pair reversed, a text's cosine at a width below the threshold) and the
    report's figures; the gap to the source per width goes to `sides.gap` for the quality budget."""
    labelled, embedded, cut = _embed(sides, sentence, sides.labelled or shipped_set())
    full = embedded.queries["candidate"].shape[1]
    widths = served_widths(sides.declared_widths, requested_widths, full)
    blockers: list[Blocker] = []
    per_width: dict[str, Any] = {}
    both = {side: np.concatenate([embedded.queries[side], embedded.passages[side]]) for side in embedded.queries}
    for width in widths:
        where = "full width" if width == full else f"{width} dimensions"
        scores = {side: _scores(embedded, side, width) for side in ("reference", "candidate", "source")}
        figures = {side: ranking(found, labelled) for side, found in scores.items()}
        order = pair_order(scores["reference"], scores["candidate"], labelled, thresholds.score_tie_margin)
        cosine = min_cosine_at(both["reference"], both["candidate"], width)
        to_source = min_cosine_at(both["source"], both["candidate"], width)
        per_width[str(width)] = {**figures, "min_cosine": cosine,
                                 "min_cosine_to_source": to_source, "pairs": order.pairs, "decisive": order.decisive,
                                 "swapped": list(order.swapped), "near_ties": order.near_ties,
                                 "near_tie_examples": list(order.near_tie_examples),
                                 "gap_moved_p99": order.gap_moved_p99}
        if order.swapped:
            first = order.swapped[0]
            blockers.append(Blocker(code="embedding.rank_swapped", gate="runtime", why=(
                f"at {where}: llama.cpp reversed {len(order.swapped)} of {order.decisive} decisive passage pairs "
                f"(reference gap > {thresholds.score_tie_margin}), first {first['query']} {first['passages']}")))
        if not cosine >= thresholds.min_cosine:
            blockers.append(Blocker(code="embedding.cosine_below_threshold", gate="runtime", why=(
                f"at {where}: a labelled-set text's cosine {cosine:.6f} < {thresholds.min_cosine}")))
        sides.gap.add_width(where, width < full, to_source,
                            figures["source"]["ndcg_at_10"] - figures["candidate"]["ndcg_at_10"])
    details = {"set": labelled.name, "queries": len(labelled.queries), "passages": len(labelled.passages),
               "passages_cut_to_the_context": cut, "languages": sorted({q.language for q in labelled.queries}),
               "widths": per_width, "tie_margin": thresholds.score_tie_margin,
               "order": "truncate, then normalise"}
    return blockers, details
