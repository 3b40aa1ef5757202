"""Gate 2's numbers for each kind of model, against both references at once.

`correct` is transformers running the artifact's own weights (the compute path is all that may differ:
held to `RuntimeThresholds`); `source` is transformers on the source's weights (the quantization cost:
measured into a `SourceGap`, budgeted by the policy). llama.cpp answers each question once; both
comparisons read the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from engine.blockers import Blocker
from engine.gates.runtime.compute_noise import measure_noise, needs_probe
from engine.gates.runtime.embedding_parity import (
    check_embeddings,
    compare_vectors,
    retrieval_texts,
    retrieval_top1,
    top1,
)
from engine.gates.runtime.evidence import EmbeddingEvidence, LogitsEvidence, Recorded, RuntimeEvidence
from engine.gates.runtime.labelled_measure import measure_labelled
from engine.gates.runtime.labelled_retrieval import LabelledSet
from engine.gates.runtime.logits_stream import LogitsStream
from engine.gates.runtime.positions import Marks, coverage, past_mark, spans
from engine.gates.runtime.quality import SourceGap
from engine.gates.runtime.relevance_parity import RERANK_SET, document_order, measure_relevance
from engine.policy import Policy
from engine.rerank_thresholds import RerankThresholds
from engine.runtime.hf_reference import HFModel, HFTokenizer
from engine.runtime.llama_process import LlamaProcess
from engine.runtime.sentence_config import SentenceConfig
from engine.texts import Text
from engine.thresholds import RuntimeThresholds

ModelKind = Literal["embedding", "causal-lm", "reranker"]


@dataclass(frozen=True, slots=True)
class RuntimeMeasurements:
    """What gate 2 measured on the candidate, for gate 3 to re-measure on the released file."""

    kind: ModelKind
    n_ctx: int
    retrieval_top1: tuple[int, ...] = ()
    # the built-in retrieval set's top-1 at each served width below the full one (truncate, then normalise)
    width_top1: tuple[tuple[int, tuple[int, ...]], ...] = ()
    logits_text: str | None = None
    logits_top1: tuple[int, ...] = ()
    rerank_orders: tuple[tuple[int, ...], ...] = ()
    rerank_scores: tuple[tuple[float, ...], ...] = ()
    evidence: RuntimeEvidence | None = None  # what the negative controls replay


@dataclass(frozen=True)
class Sides:
    """What gate 2 compares: llama.cpp, and transformers on the artifact's weights and on the source's."""

    texts: tuple[Text, ...]
    hf: HFTokenizer
    correct: HFModel
    source: HFModel
    candidate: LlamaProcess
    n_ctx: int
    gap: SourceGap = field(default_factory=SourceGap)
    marks: Marks = field(default_factory=lambda: Marks((), None, 0))  # a causal LM's windows and contexts
    declared_widths: tuple[int, ...] = ()  # an embedding model's Matryoshka dimensions (labelled_measure.py)
    labelled: LabelledSet | None = None  # the submitter's labelled retrieval set (None: the built-in one)


def measure_embeddings(sides: Sides, sentence: SentenceConfig, ids_equal: dict[str, bool], policy: Policy,
                       thresholds: RuntimeThresholds) -> tuple[list[Blocker], dict[str, Any], RuntimeMeasurements]:
    pooling = sentence.pooling or "mean"

    def ids(text: str) -> list[int]:
        return sides.hf.encode(text, add_special=True, parse_special=False)

    def embedder(model: HFModel) -> Any:
        return lambda text: model.embed(ids(text), pooling)

    queries, documents = retrieval_texts(sentence.prompts)
    every = [ids(text) for text in (*(t.text for t in sides.texts), *queries, *documents)]
    sides.correct.prefetch(every)  # a streamed reference reads its weights once for all of them

    reference, embed = Recorded(embedder(sides.correct)), Recorded(sides.candidate.embed)
    result = check_embeddings(sides.texts, reference, embed, sentence, ids_equal, policy, thresholds)
    if sides.source is sides.correct:  # one pass: the source's embeddings are the ones just computed
        from_source = reference.again
    else:
        sides.source.prefetch(every)
        from_source = Recorded(embedder(sides.source))
    for text in sides.texts:
        if np.all(np.isfinite(candidate := embed.replay(text.text))):
            sides.gap.add_cosine(text, compare_vectors(from_source(text.text), candidate, sentence.normalize)["cosine"])
    source_top1 = retrieval_top1(from_source, sentence.prompts)
    sides.gap.retrieval_top1_equal = list(source_top1) == list(result.retrieval["candidate_top1"])
    labelled_blockers, labelled = measure_labelled(sides, sentence, thresholds, policy.embedding_widths) \
        if policy.labelled_retrieval else ([], {"skipped": "the policy turns the labelled retrieval set off",
                                                "widths": {}})
    result.blockers.extend(labelled_blockers)
    details = {"min_cosine": result.min_cosine, "per_text": result.per_text, "retrieval": result.retrieval,
               "diagnosis": result.diagnosis, "pooling": pooling, "normalize": sentence.normalize,
               "source_top1": source_top1, "labelled_retrieval": labelled}
    evidence = EmbeddingEvidence(reference=reference, candidate=embed, sentence=sentence, ids_equal=dict(ids_equal),
                                 policy=policy, thresholds=thresholds, per_text=tuple(result.per_text),
                                 blockers=tuple(result.blockers))
    widths = [int(width) for width in labelled["widths"]][1:]  # none when the set was not run
    queries, documents = retrieval_texts(sentence.prompts)
    width_top1 = tuple((width, tuple(top1([embed.replay(q)[:width] for q in queries],
                                          [embed.replay(d)[:width] for d in documents])[0])) for width in widths)
    result.retrieval["candidate_top1_at"] = {str(width): list(found) for width, found in width_top1}
    measured = RuntimeMeasurements("embedding", sides.n_ctx, retrieval_top1=tuple(result.retrieval["candidate_top1"]),
                                   width_top1=width_top1,
                                   evidence=RuntimeEvidence(texts=sides.texts, embeddings=evidence))
    return result.blockers, details, measured


def measure_logits(sides: Sides, policy: Policy, thresholds: RuntimeThresholds,
                   rounded_to: str | None = None) -> tuple[list[Blocker], dict[str, Any], RuntimeMeasurements]:
    """Every text's first `max_logit_positions` positions, and a longer text's batches past each sliding
    window, the original context and its end (`positions.py`), streamed a block at a time. A float file
    (`rounded_to`: its activations' type) that fails on a distance is judged again against thresholds
    widened to the model's own sensitivity to that rounding (`compute_noise.py`)."""
    found = sides.marks
    ids = [sides.candidate.tokenize(t.text, add_special=True, parse_special=False) for t in sides.texts]
    compared = [spans(len(sequence), policy.max_logit_positions, sides.candidate.decode_batch, found)
                for sequence in ids]
    stream = LogitsStream(sides.texts, ids, compared, sides.candidate, sides.correct, sides.source, sides.gap)
    reached = coverage([c for c, row in zip(compared, ids, strict=True) if row], found)
    result = stream.run(thresholds, past_mark(found, reached.longest_position))
    noise: dict[str, Any] = {}
    probe = max(stream.ids, key=len, default=[])  # the compared positions of the longest text, from its start
    if probe and needs_probe(result.blockers, rounded_to):
        measured_noise = measure_noise(sides.correct, probe, str(rounded_to), sides.candidate.n_vocab)
        thresholds = measured_noise.widened(thresholds)
        noise = measured_noise.details(thresholds)
        result = stream.judge(thresholds)
    first = result.per_text[0] if result.per_text else None
    evidence = LogitsEvidence(kept=stream.kept, policy=policy, thresholds=thresholds)
    head = compared[0][0][1] if compared and compared[0] else 0  # gate 3 re-measures the first text's first span
    measured = RuntimeMeasurements(
        "causal-lm", sides.n_ctx,
        logits_text=next((t.text for t in sides.texts if first and t.label == first["label"]), None),
        logits_top1=tuple(first["candidate_top1"][:head]) if first else (),
        evidence=RuntimeEvidence(texts=sides.texts, logits=evidence),
    )
    details = {"summary": result.summary, "per_text": result.per_text,
               "positions": {"first_positions": policy.max_logit_positions,
                             "decode_batch": sides.candidate.decode_batch, "longest_position": reached.longest_position,
                             "windows": list(found.windows), "windows_crossed": list(reached.windows_crossed),
                             "original_context": found.original_context,
                             "original_context_crossed": reached.original_context_crossed,
                             "trained_context": found.trained_context}}
    if result.past_mark:
        details["past_mark"] = result.past_mark
    if noise:
        details["compute_noise"] = noise
    return result.blockers, details, measured


def measure_reranker(sides: Sides,
                     thresholds: RerankThresholds) -> tuple[list[Blocker], dict[str, Any], RuntimeMeasurements]:
    found, details, (orders, scores) = measure_relevance(sides.hf, sides.correct, sides.candidate, thresholds)
    gap = []
    same = {(p["query"], p["document"]): float(p["reference"]) for p in details["per_pair"]}
    for query, order, candidate in zip(RERANK_SET, orders, scores, strict=True):
        source = [same[(query.label, number)] if sides.source is sides.correct else  # one pass: scores just made
                  float(sides.source.logits(sides.hf.encode_pair(query.query, d))[0])
                  for number, d in enumerate(query.documents)]
        gap.append({"query": query.label, "max_abs_diff": float(np.max(np.abs(np.subtract(source, candidate)))),
                    "source_order": document_order(source), "order_equal": document_order(source) == list(order),
                    "top1_equal": document_order(source)[:1] == list(order)[:1]})
    details["source_gap"] = gap
    sides.gap.rerank_top1_differs = [str(row["query"]) for row in gap if not row["top1_equal"]]
    return found, details, RuntimeMeasurements("reranker", sides.n_ctx, rerank_orders=orders, rerank_scores=scores)
