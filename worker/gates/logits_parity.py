"""Gate 2, causal LMs: per-position logits of transformers vs llama.cpp on the same token ids.

Both sides get llama.cpp's token ids, so the comparison isolates the numbers (tokenizer parity
is checked separately). NMSE, KL(reference || candidate) per position (mean, p99, max) and top-1
agreement are each held to a policy threshold fixed before measuring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.blockers import Blocker
from worker.policy import Policy
from worker.texts import Text
from worker.thresholds import RuntimeThresholds

Logits = Callable[[list[int]], np.ndarray]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def compare_logits(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    log_p, log_q = _log_softmax(reference), _log_softmax(candidate)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)
    return {
        "positions": int(reference.shape[0]),
        "sum_sq_diff": float(((reference - candidate) ** 2).sum()),
        "sum_sq_ref": float((reference**2).sum()),
        "kl": kl.tolist(),
        "top1_equal": int((reference.argmax(-1) == candidate.argmax(-1)).sum()),
        "candidate_top1": candidate.argmax(-1).tolist(),
    }


@dataclass
class LogitsResult:
    summary: dict[str, float] = field(default_factory=dict)
    per_text: list[dict[str, Any]] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)


Observer = Callable[[Text, list[int], np.ndarray], None]


def check_logits(
    texts: tuple[Text, ...], tokenize: Callable[[str], list[int]], reference: Logits, candidate: Logits,
    policy: Policy, thresholds: RuntimeThresholds, observe: Observer | None = None,
) -> LogitsResult:
    """`observe(text, ids, candidate logits)` sees each text's finite candidate logits once (gate 2 measures
    the gap to the source model on them without asking llama.cpp twice)."""
    result = LogitsResult()
    kls: list[float] = []
    sum_sq_diff = sum_sq_ref = 0.0
    top1_equal = positions = 0
    for text in texts:
        ids = tokenize(text.text)[: policy.max_logit_positions]
        cand = candidate(ids)
        if not np.all(np.isfinite(cand)):
            result.blockers.append(Blocker(code="logits.not_finite", gate="runtime",
                                           why=f"llama.cpp logits for {text.label!r} are not finite", text=text.text))
            continue
        if observe is not None:
            observe(text, ids, cand)
        row = compare_logits(reference(ids), cand)
        kls.extend(row["kl"])
        sum_sq_diff += row["sum_sq_diff"]
        sum_sq_ref += row["sum_sq_ref"]
        top1_equal += row["top1_equal"]
        positions += row["positions"]
        result.per_text.append({"label": text.label, "slice": text.slice, "positions": row["positions"],
                                "kl_mean": float(np.mean(row["kl"])), "top1_equal": row["top1_equal"],
                                "candidate_top1": row["candidate_top1"]})
    if not positions:
        return result
    kl = np.array(kls)
    result.summary = {
        "nmse": sum_sq_diff / sum_sq_ref if sum_sq_ref else float("inf"),
        "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
        "top1_agreement": top1_equal / positions, "positions": positions,
    }
    limits = (
        ("logits.nmse_above_threshold", "nmse", thresholds.max_logits_nmse, "max"),
        ("logits.kl_above_threshold", "kl_mean", thresholds.max_kl_mean, "max"),
        ("logits.kl_above_threshold", "kl_p99", thresholds.max_kl_p99, "max"),
        ("logits.top1_below_threshold", "top1_agreement", thresholds.min_top1_agreement, "min"),
    )
    for code, key, threshold, bound in limits:
        value = result.summary[key]
        if not (value <= threshold if bound == "max" else value >= threshold):
            result.blockers.append(Blocker(code=code, gate="runtime", why=f"{key} {value:.6g} vs {bound} {threshold}"))
    return result
