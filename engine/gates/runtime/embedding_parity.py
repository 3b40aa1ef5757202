"""Gate 2, embeddings: transformers (the model's own pooling and normalisation) vs llama.cpp.

Each side tokenizes for itself, as its users would. Per text: cosine, max-abs, relative L2 and
norms before and after normalisation; then top-1 agreement on a small retrieval set, with the
model's own query/document prompts. Measurements that contradict each other are a blocker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.blockers import Blocker
from engine.policy import Policy
from engine.runtime.sentence_config import SentenceConfig
from engine.texts import RETRIEVAL, RetrievalSet, Text
from engine.thresholds import RuntimeThresholds

Embed = Callable[[str], np.ndarray]


@dataclass
class EmbeddingResult:
    per_text: list[dict[str, Any]] = field(default_factory=list)
    retrieval: dict[str, Any] = field(default_factory=dict)
    diagnosis: str | None = None
    blockers: list[Blocker] = field(default_factory=list)

    @property
    def min_cosine(self) -> float:
        return min((row["cosine"] for row in self.per_text), default=float("nan"))


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def compare_vectors(reference: np.ndarray, candidate: np.ndarray, normalize: bool) -> dict[str, float]:
    ref_norm, cand_norm = float(np.linalg.norm(reference)), float(np.linalg.norm(candidate))
    cosine = float(reference @ candidate / (ref_norm * cand_norm)) if ref_norm and cand_norm else float("nan")
    ref, cand = (_unit(reference), _unit(candidate)) if normalize else (reference, candidate)
    diff = ref - cand
    return {
        "cosine": cosine,
        "max_abs": float(np.abs(diff).max()),
        "rel_l2": float(np.linalg.norm(diff) / (np.linalg.norm(ref) or 1.0)),
        "reference_norm": ref_norm,
        "candidate_norm": cand_norm,
        "reference_norm_after": float(np.linalg.norm(ref)),
        "candidate_norm_after": float(np.linalg.norm(cand)),
    }


def top1(queries: list[np.ndarray], documents: list[np.ndarray]) -> tuple[list[int], list[float]]:
    """Best document per query by cosine, and the margin to the runner-up."""
    docs = np.stack([_unit(d) for d in documents])
    best, margins = [], []
    for query in queries:
        scores = docs @ _unit(query)
        order = np.argsort(-scores)
        best.append(int(order[0]))
        margins.append(float(scores[order[0]] - scores[order[1]]))
    return best, margins


def retrieval_texts(prompts: dict[str, str], retrieval: RetrievalSet = RETRIEVAL) -> tuple[list[str], list[str]]:
    """The retrieval set's queries and documents, each with the model's prompt as sentence-transformers adds it."""
    query_prompt = prompts.get("query", "")
    document_prompt = prompts.get("document", prompts.get("passage", ""))
    return [query_prompt + q for q in retrieval.queries], [document_prompt + d for d in retrieval.documents]


def retrieval_top1(embed: Embed, prompts: dict[str, str], retrieval: RetrievalSet = RETRIEVAL) -> list[int]:
    queries, documents = retrieval_texts(prompts, retrieval)
    return top1([embed(query) for query in queries], [embed(document) for document in documents])[0]


def _diagnose(rows: list[dict[str, Any]], threshold: float) -> str | None:
    low = [row for row in rows if row["cosine"] < threshold]
    if not low:
        return None
    if all(not row["ids_equal"] for row in low):
        return "cosine is low only where token ids differ: the tokenizer, not the weights"
    same_ids_low = [row["cosine"] for row in low if row["ids_equal"]]
    if min(same_ids_low) < 0.9:
        return (f"cosine down to {min(same_ids_low):.3f} with equal token ids: pooling, normalisation or "
                "weights differ, not tokenization")
    return f"cosine {min(same_ids_low):.4f}..{max(same_ids_low):.4f} with equal ids: quantization error"


def check_embeddings(
    texts: tuple[Text, ...],
    reference: Embed,
    candidate: Embed,
    sentence: SentenceConfig,
    ids_equal: dict[str, bool],
    policy: Policy,
    thresholds: RuntimeThresholds,
) -> EmbeddingResult:
    result = EmbeddingResult()

    def block(code: str, why: str, text: str | None = None) -> None:
        result.blockers.append(Blocker(code=code, gate="runtime", why=why, text=text))

    for text in texts:
        cand = candidate(text.text)
        if not np.all(np.isfinite(cand)):
            block("embedding.not_finite", f"llama.cpp's embedding of {text.label!r} is not finite", text.text)
            continue
        row: dict[str, Any] = {"label": text.label, "slice": text.slice, "ids_equal": ids_equal.get(text.label, True),
               **compare_vectors(reference(text.text), cand, sentence.normalize)}
        result.per_text.append(row)
        if not row["cosine"] >= thresholds.min_cosine:
            block("embedding.cosine_below_threshold",
                  f"{text.label!r}: cosine {row['cosine']:.6f} < {thresholds.min_cosine}", text.text)
        if not row["ids_equal"] and row["cosine"] >= policy.contradiction_high_cosine:
            block("measurement.contradiction", f"{text.label!r}: token ids differ yet cosine is "
                  f"{row['cosine']:.6f}: one of the two measurements is wrong", text.text)
        # equal ids yet a cosine below what even this precision class allows: pooling or weights, not rounding
        if row["ids_equal"] and row["cosine"] < min(policy.contradiction_low_cosine, thresholds.min_cosine):
            block("measurement.contradiction", f"{text.label!r}: token ids are equal yet cosine is "
                  f"{row['cosine']:.4f}: check pooling and normalisation before trusting either", text.text)
    result.diagnosis = _diagnose(result.per_text, thresholds.min_cosine)
    ref_top1 = retrieval_top1(reference, sentence.prompts)
    cand_top1 = retrieval_top1(candidate, sentence.prompts)
    agree = sum(a == b for a, b in zip(ref_top1, cand_top1, strict=True))
    result.retrieval = {"reference_top1": ref_top1, "candidate_top1": cand_top1,
                        "agreement": agree / len(ref_top1), "query_prompt": sentence.prompts.get("query", "")}
    if policy.require_top1_equal and agree < len(ref_top1):
        block("embedding.top1_mismatch", f"retrieval top-1 differs on {len(ref_top1) - agree} of "
              f"{len(ref_top1)} queries (reference {ref_top1}, llama.cpp {cand_top1})")
    return result
