"""Gate 2, causal LMs: per-position logits of transformers vs llama.cpp on the same token ids.

Both sides get llama.cpp's token ids, so the comparison isolates the numbers (tokenizer parity is checked
separately). NMSE, KL(reference || candidate) per position (mean, p99, max) and top-1 agreement are each
held to a policy threshold fixed before measuring. Figures are gathered a block of positions at a time
(`TextFigures.add`) and only per-position scalars are kept, so a text's [positions, vocabulary] logits never
need to exist at once (`engine/gates/runtime/logits_stream.py` asks for them block by block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.blockers import Blocker
from engine.gates.runtime.logit_math import ComparedRows, compared
from engine.policy import Policy
from engine.texts import Text
from engine.thresholds import RuntimeThresholds

Logits = Callable[[list[int]], np.ndarray]


@dataclass
class TextFigures:
    """One text's correctness figures, added to block by block (positions in order)."""

    label: str
    slice: str
    spans: list[tuple[int, int]] = field(default_factory=list)  # the positions compared, [start, stop) spans
    kl: list[np.ndarray] = field(default_factory=list)
    sq_diff: list[np.ndarray] = field(default_factory=list)  # per position: sum of squared logit differences
    sq_ref: list[np.ndarray] = field(default_factory=list)  # per position: sum of squared reference logits
    at: list[np.ndarray] = field(default_factory=list)  # per position: its index in the text
    top1_equal: int = 0
    positions: int = 0
    candidate_top1: list[np.ndarray] = field(default_factory=list)
    same_top: list[np.ndarray] = field(default_factory=list)  # per position: both sides' top-1 is one token
    margin: list[np.ndarray] = field(default_factory=list)  # per position: the reference's top-1 minus top-2 logit
    moved: list[np.ndarray] = field(default_factory=list)  # per position: how far llama.cpp moved that gap

    def add(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        """Rows of both sides' logits for the text's next positions, [rows, vocabulary]."""
        start = self.positions
        for offset, rows in compared(reference, candidate):
            self.add_compared(rows, start + offset)

    def add_compared(self, rows: ComparedRows, start: int) -> None:
        """`rows` are positions start, start + 1, ... of the text."""
        self.kl.append(rows.kl)
        self.sq_diff.append(((rows.reference - rows.candidate) ** 2).sum(-1))
        self.sq_ref.append((rows.reference**2).sum(-1))
        self.at.append(np.arange(start, start + len(rows.kl)))
        top = rows.candidate.argmax(-1)
        same = rows.reference.argmax(-1) == top
        self.top1_equal += int(same.sum())
        self.same_top.append(same)
        self.candidate_top1.append(top)
        self.positions += len(rows.reference)
        margin, moved = top_two_gap(rows.reference, rows.candidate)
        self.margin.append(margin)
        self.moved.append(moved)

    def kls(self) -> np.ndarray:
        return np.concatenate(self.kl) if self.kl else np.zeros(0)

    def joined(self, name: str) -> np.ndarray:
        parts = getattr(self, name)
        return np.concatenate(parts) if parts else np.zeros(0)

    def row(self) -> dict[str, Any]:
        """The report's per-text entry."""
        top1 = np.concatenate(self.candidate_top1).tolist() if self.candidate_top1 else []
        row = {"label": self.label, "slice": self.slice, "positions": self.positions,
               "kl_mean": float(self.kls().mean()), "top1_equal": self.top1_equal, "candidate_top1": top1}
        if self.spans and self.spans != [(0, self.positions)]:  # only a text compared past its first positions
            row["spans"] = [list(span) for span in self.spans]
        return row


@dataclass
class LogitsResult:
    summary: dict[str, float] = field(default_factory=dict)
    per_text: list[dict[str, Any]] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    past_mark: dict[str, Any] = field(default_factory=dict)  # the positions past a window or original context


def not_finite(text: Text) -> Blocker:
    return Blocker(code="logits.not_finite", gate="runtime", why=f"llama.cpp logits for {text.label!r} are not finite",
                   text=text.text)


def top_two_gap(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the reference's margin between its two most likely tokens (logits), and how far the
    candidate moved that margin (the same two tokens' difference on its side)."""
    two = np.argpartition(reference, -2, axis=-1)[:, -2:]
    values = np.take_along_axis(reference, two, axis=-1)
    order = np.argsort(values, axis=-1)  # ascending: [second, first]
    second, first = (np.take_along_axis(two, order, axis=-1)[:, i] for i in (0, 1))
    rows = np.arange(len(reference))
    margin = reference[rows, first] - reference[rows, second]
    return margin, np.abs(margin - (candidate[rows, first] - candidate[rows, second]))


PAST_MARK = "positions past "  # how a blocker earned by the positions past a mark alone begins


@dataclass(frozen=True, slots=True)
class PastMark:
    """The position from which a text reaches past a sliding window or rope scaling's original context, and
    which: what those positions alone are judged on, so a defect only they show is not averaged away by the
    first positions of every text."""

    position: int
    what: str  # e.g. "the sliding window of 512 tokens"


def _summary(measured: list[TextFigures], thresholds: RuntimeThresholds, keep: Callable[[np.ndarray], np.ndarray],
             ) -> dict[str, float]:
    """The figures of the positions `keep` selects (from each text's position indices), or {} when none."""
    chosen = [keep(text.joined("at")) for text in measured]

    def pooled(name: str) -> np.ndarray:
        parts = [text.joined(name)[mask] for text, mask in zip(measured, chosen, strict=True)]
        return np.concatenate(parts) if parts else np.zeros(0)

    kl = pooled("kl")
    if not len(kl):
        return {}
    sq_ref, same, margin, moved = pooled("sq_ref").sum(), pooled("same_top"), pooled("margin"), pooled("moved")
    decisive = margin > thresholds.tie_margin
    summary = {
        "nmse": float(pooled("sq_diff").sum() / sq_ref) if sq_ref else float("inf"),
        "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
        "top1_agreement_raw": float(same.mean()), "positions": len(kl),
        "decisive_positions": int(decisive.sum()), "near_ties": int(len(kl) - decisive.sum()),
        "tie_margin": thresholds.tie_margin, "margin_moved_max": float(moved.max()),
        "margin_moved_p99": float(np.percentile(moved, 99)),
    }
    if decisive.any():
        summary["top1_agreement"] = float(same[decisive].mean())
    return summary


def _judged(summary: dict[str, float], thresholds: RuntimeThresholds, where: str) -> list[Blocker]:
    limits = (
        ("logits.nmse_above_threshold", "nmse", thresholds.max_logits_nmse, "max"),
        ("logits.kl_above_threshold", "kl_mean", thresholds.max_kl_mean, "max"),
        ("logits.kl_above_threshold", "kl_p99", thresholds.max_kl_p99, "max"),
        ("logits.top1_below_threshold", "top1_agreement", thresholds.min_top1_agreement, "min"),
    )
    found = []
    for code, key, threshold, bound in limits:
        if key not in summary:  # no decisive position: top-1 agreement measured nothing
            continue
        value = summary[key]
        if not (value <= threshold if bound == "max" else value >= threshold):
            counted = f" over {summary['decisive_positions']} decisive positions" if key == "top1_agreement" else ""
            found.append(Blocker(code=code, gate="runtime",
                                 why=f"{where}{key} {value:.6g}{counted} vs {bound} {threshold}"))
    return found


def conclude(result: LogitsResult, measured: list[TextFigures], thresholds: RuntimeThresholds,
             past: PastMark | None = None) -> LogitsResult:
    """The summary over every measured text and the blockers its figures earn; nothing when none was measured.
    With `past`, the positions at or past it are also judged alone, on the same thresholds (`past_mark`).

    Top-1 agreement counts only decisive positions: those where the reference's top-1/top-2 margin exceeds
    `tie_margin`, what the file's compute class was measured to move such a margin (thresholds.py). At a
    near-tie (the start of a text, a list, a nearly flat distribution) the top token flips on rounding
    alone, and a rule that counts those refuses honest files of models nobody calibrated on; the raw
    figure over every position is reported beside it."""
    if not sum(text.positions for text in measured):
        return result
    result.per_text.extend(text.row() for text in measured)
    result.summary = _summary(measured, thresholds, lambda at: np.ones(len(at), dtype=bool))
    result.blockers.extend(_judged(result.summary, thresholds, ""))
    if past is not None:
        beyond = _summary(measured, thresholds, lambda at: at >= past.position)
        if beyond:
            result.past_mark = {"from_position": past.position, "what": past.what, **beyond}
            result.blockers.extend(_judged(beyond, thresholds, f"{PAST_MARK}{past.what}: "))
    return result


def check_logits(
    texts: tuple[Text, ...], tokenize: Callable[[str], list[int]], reference: Logits, candidate: Logits,
    policy: Policy, thresholds: RuntimeThresholds,
) -> LogitsResult:
    """The comparison on whole per-text logits given by functions: what the negative controls replay on the
    block gate 2 kept, and what the unit tests drive. Gate 2 itself streams (`logits_stream.py`)."""
    result = LogitsResult()
    measured = []
    for text in texts:
        ids = tokenize(text.text)[: policy.max_logit_positions]
        cand = candidate(ids)
        if not np.all(np.isfinite(cand)):
            result.blockers.append(not_finite(text))
            continue
        figures = TextFigures(text.label, text.slice)
        figures.add(np.asarray(reference(ids)), np.asarray(cand))
        measured.append(figures)
    return conclude(result, measured, thresholds)
