"""Gate 2's negative controls: the gate's own comparisons re-run on what it recorded, one side planted.

Each control calls the function gate 2 called (`check_tokenizer`, `check_embeddings`, `check_logits`)
with the recorded answers of both models (`Recorded.replay`: no model runs again), the llama.cpp side
carrying one defect, and counts the blockers the honest measurement did not have. Each is called through
its module, so the control always exercises whatever the gate itself calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.controls.planted import Planted, newly_raised, not_applicable
from engine.gates.runtime import embedding_parity, logits_parity, tokenizer_parity
from engine.gates.runtime.evidence import EmbeddingEvidence, LogitsEvidence, TokenizerEvidence
from engine.gates.runtime.tokenizer_parity import COMBINATIONS
from engine.texts import Text

TOKENIZER, EMBEDDINGS, LOGITS = "tokenizer ids", "embeddings", "logits"


def other_id(token: int) -> int:
    """A different, still plausible token id."""
    return token - 1 if token > 0 else token + 1


def tokenizer_control(texts: tuple[Text, ...], evidence: TokenizerEvidence) -> Planted:
    """One token id changed in one text whose ids matched: the middle token, in every flag combination
    (the vocabulary maps that piece elsewhere, whatever the flags)."""
    if not evidence.ids_exact:
        return not_applicable(TOKENIZER, "the policy does not hold token ids to exactness")

    def llama_ids(text: Text, combination: tuple[bool, bool]) -> list[int]:
        ids = evidence.llama.replay(text.text, add_special=combination[0], parse_special=combination[1])
        return list(ids)

    chosen = next((text for text in texts if evidence.default_ids_equal.get(text.label)
                   and all(llama_ids(text, combination) for combination in COMBINATIONS)), None)
    if chosen is None:
        return not_applicable(TOKENIZER, "no text's token ids matched: nothing honest to plant in")

    def planted(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        ids = list(evidence.llama.replay(text, add_special=add_special, parse_special=parse_special))
        if text == chosen.text:
            ids[len(ids) // 2] = other_id(ids[len(ids) // 2])
        return ids

    default = llama_ids(chosen, COMBINATIONS[1])
    middle = len(default) // 2
    result = tokenizer_parity.check_tokenizer(texts, evidence.hf.replay, planted, evidence.tokenizer_json,
                                              evidence.metadata, evidence.ids_exact)
    return Planted(check=TOKENIZER, defect=f"one llama.cpp token id changed ({default[middle]} -> "
                   f"{other_id(default[middle])})", location=f"text {chosen.label!r} position {middle}",
                   detected_by=newly_raised(result.blockers, evidence.blockers))


def turned_away(reference: np.ndarray, candidate: np.ndarray, cosine: float) -> np.ndarray:
    """`candidate` turned (norm kept) to `cosine` with `reference`, along its own deviation from it (or a
    fixed axis when it has none): a deterministic vector exactly `cosine` away."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    unit = ref / np.linalg.norm(ref)
    away = cand - (cand @ unit) * unit
    if np.linalg.norm(away) <= 1e-9 * np.linalg.norm(cand):
        away = np.zeros_like(unit)
        away[int(np.argmin(np.abs(unit)))] = 1.0
        away -= (away @ unit) * unit
    away /= np.linalg.norm(away)
    cosine = max(cosine, -1.0)
    return float(np.linalg.norm(cand)) * (cosine * unit + np.sqrt(1.0 - cosine * cosine) * away)


def embedding_control(texts: tuple[Text, ...], evidence: EmbeddingEvidence) -> Planted:
    """One text's llama.cpp embedding turned away from the reference to twice the cosine deficit the
    policy allows (1 - cosine = 2 (1 - min_cosine))."""
    threshold = evidence.thresholds.min_cosine
    chosen = next((row["label"] for row in evidence.per_text if row["cosine"] >= threshold), None)
    if chosen is None:
        return not_applicable(EMBEDDINGS, "no text's embedding passed: nothing honest to plant in")
    text = next(t.text for t in texts if t.label == chosen)
    target = 1.0 - 2.0 * (1.0 - threshold)
    vector = turned_away(evidence.reference.replay(text), evidence.candidate.replay(text), target)

    def planted(asked: str) -> Any:
        return vector if asked == text else evidence.candidate.replay(asked)

    result = embedding_parity.check_embeddings(texts, evidence.reference.replay, planted, evidence.sentence,
                                               evidence.ids_equal, evidence.policy, evidence.thresholds)
    return Planted(check=EMBEDDINGS, defect=f"one llama.cpp embedding turned to cosine {target:.7f} "
                   f"(twice the deficit min_cosine {threshold} allows)", location=f"text {chosen!r}",
                   detected_by=newly_raised(result.blockers, evidence.blockers))


def logits_control(texts: tuple[Text, ...], evidence: LogitsEvidence) -> Planted:
    """The first text's kept llama.cpp logits pushed, orthogonally to their own error, to twice the policy's
    maximum NMSE (gate 2 keeps the first positions of the first text: a vocabulary of floats per position)."""
    kept = evidence.kept
    if kept is None or not texts or kept.text != texts[0]:
        return not_applicable(LOGITS, "the first text's logits were not measured")
    first = (kept.text,)

    def ids(_text: str) -> list[int]:
        return list(kept.ids)

    def reference(_ids: list[int]) -> np.ndarray:
        return kept.reference

    honest = logits_parity.check_logits(first, ids, reference, lambda _ids: kept.candidate, evidence.policy,
                                        evidence.thresholds)
    if honest.blockers:  # a non-finite candidate is one too
        return not_applicable(LOGITS, "the first text's logits already fail")
    threshold = evidence.thresholds.max_logits_nmse
    ref = np.asarray(kept.reference, dtype=np.float64)
    cand = np.asarray(kept.candidate, dtype=np.float64)
    error = (cand - ref).reshape(-1)
    extra = max(2.0 * threshold * float((ref**2).sum()) - float(error @ error), 1e-6 * float((ref**2).sum()))
    push = np.where(np.arange(cand.size) % 2 == 0, 1.0, -1.0)
    if error @ error > 0:
        push -= (push @ error / (error @ error)) * error
    vector = cand + (np.sqrt(extra / float(push @ push)) * push).reshape(cand.shape)
    result = logits_parity.check_logits(first, ids, reference, lambda _ids: vector, evidence.policy,
                                        evidence.thresholds)
    return Planted(check=LOGITS, defect=f"one text's llama.cpp logits pushed to NMSE {2 * threshold:.3g} "
                   f"(twice max_logits_nmse) over its first {len(kept.ids)} positions",
                   location=f"text {kept.text.label!r}", detected_by=newly_raised(result.blockers, honest.blockers))
