"""Gate 2's causal-LM comparison in bounded memory: logits asked for, compared and dropped a block of
positions at a time.

Why: a text's logits are positions x vocabulary floats per side. With Gemma's 262,144-token vocabulary, the
reference's, the candidate's and their softmaxes held whole for the default texts peaked at 5.2 GiB for a
270M-parameter model, and a long text multiplies that. Here each side keeps only what grows with positions
alone: the reference its last hidden states (positions x hidden, from one pass of its base model over every
text), the comparison its per-position figures. Logits exist for one block at a time: at most
`rows_per_block(vocabulary)` positions (LOGITS_BLOCK_BYTES of float32 per side), taken from one or several
consecutive texts, so a short text set costs one application of the head and a long text several.

The two sides overlap: llama.cpp (its own process) computes a block while this process runs the
reference's base model over every text, or applies the head to the block before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.blockers import Blocker
from engine.gates.runtime.logit_math import compare_rows, compared
from engine.gates.runtime.logits_parity import LogitsResult, PastMark, TextFigures, conclude, not_finite
from engine.gates.runtime.quality import PositionStats, SourceGap, joined, stats_of
from engine.runtime.hf_reference import HFModel
from engine.runtime.llama_process import LlamaProcess, Pending
from engine.texts import Text
from engine.thresholds import RuntimeThresholds

LOGITS_BLOCK_BYTES = 64 << 20  # float32 logits of one block, per side
KEPT_ROWS = 16  # positions of the first text kept for the negative control (x vocabulary x 4 bytes, per side)


@dataclass(frozen=True, slots=True)
class Segment:
    """Positions [start, stop) of text number `text`."""

    text: int
    start: int
    stop: int


def rows_per_block(vocabulary: int) -> int:
    return max(1, LOGITS_BLOCK_BYTES // (4 * max(vocabulary, 1)))


def plan_blocks(spans: Sequence[Sequence[tuple[int, int]]], rows: int, batch: int) -> list[list[Segment]]:
    """Every compared position of every text (its [start, stop) spans, each starting at a multiple of
    `batch`), in order, cut into blocks of at most max(rows, batch) positions. A span is cut only at a
    multiple of `batch` (llama.cpp's decode batch: each request then continues the text from a batch
    boundary, so it is decoded once and batched as every other run batches it); a block may hold the end of
    one span and the start of the next, of the same text or another."""
    rows = max(rows, batch)
    blocks: list[list[Segment]] = [[]]
    room = rows
    for text, text_spans in enumerate(spans):
        for first, stop in text_spans:
            start = first
            while start < stop:
                take = stop - start if stop - start <= room else room // batch * batch
                if not take:
                    blocks.append([])
                    room = rows
                    continue
                blocks[-1].append(Segment(text, start, start + take))
                room -= take
                start += take
    return [block for block in blocks if block]


@dataclass(frozen=True)
class KeptBlock:
    """The first text's first block, both sides' logits: what the negative control plants a defect in."""

    text: Text
    ids: tuple[int, ...]
    reference: np.ndarray
    candidate: np.ndarray


@dataclass
class _Text:
    """One text's figures while its blocks arrive: merged into the result only once all were finite."""

    figures: TextFigures
    gap: list[PositionStats]
    finite: bool = True


class LogitsStream:
    """One comparison of llama.cpp's logits with the reference's (`correct`) and, when it is another model,
    the source's, over `texts` tokenized as `ids`."""

    def __init__(self, texts: Sequence[Text], ids: Sequence[list[int]], spans: Sequence[Sequence[tuple[int, int]]],
                 candidate: LlamaProcess, correct: HFModel, source: HFModel, gap: SourceGap) -> None:
        """`spans`: each text's compared positions (`positions.spans`); a text is read up to its last one."""
        self.texts, self.spans = tuple(texts), [list(found) for found in spans]
        self.ids = [list(sequence[: found[-1][1] if found else 0]) for sequence, found in zip(ids, spans, strict=True)]
        self.candidate, self.correct, self.source, self.gap = candidate, correct, source, gap
        self.kept: KeptBlock | None = None
        self._not_finite: list[Blocker] = []
        self._measured: list[TextFigures] = []
        self._past: PastMark | None = None

    def run(self, thresholds: RuntimeThresholds, past: PastMark | None = None) -> LogitsResult:
        """`past`: the positions past a window or original context, also judged alone (`conclude`)."""
        state = [_Text(TextFigures(t.label, t.slice, spans=found), []) for t, found in zip(self.texts, self.spans,
                                                                                           strict=True)]
        blocks = plan_blocks(self.spans, rows_per_block(self.candidate.n_vocab), self.candidate.decode_batch)
        if blocks:
            self._measure(blocks, state)
        self._not_finite = [not_finite(text) for text, found in zip(self.texts, state, strict=True)
                            if not found.finite]
        self._measured = [found.figures for found in state if found.finite and found.figures.positions]
        self._past = past
        for text, found in zip(self.texts, state, strict=True):
            if found.finite and found.figures.positions:
                for stats in found.gap:
                    self.gap.add_logits(text, stats)
        return self.judge(thresholds)

    def judge(self, thresholds: RuntimeThresholds) -> LogitsResult:
        """What `run` measured, held to `thresholds` (again, when they are widened by the model's own compute
        noise: `compute_noise.py`)."""
        return conclude(LogitsResult(blockers=list(self._not_finite)), self._measured, thresholds, self._past)

    def _measure(self, blocks: list[list[Segment]], state: list[_Text]) -> None:
        """Every block through both sides: llama.cpp is always one block ahead of this process."""
        pending = self._ask(blocks[0])
        measured = [ids for ids in self.ids if ids]
        self.correct.prefetch(measured)  # a streamed reference reads its weights once for every text
        hidden = [self.correct.hidden(ids) for ids in self.ids]
        from_source = hidden
        if self.source is not self.correct:
            self.source.prefetch(measured)
            from_source = [self.source.hidden(ids) for ids in self.ids]
        for number, block in enumerate(blocks):
            reference = self.correct.head(self._rows(hidden, block))
            source = reference if from_source is hidden else self.source.head(self._rows(from_source, block))
            candidate = self.candidate.collect(pending)
            if number + 1 < len(blocks):
                pending = self._ask(blocks[number + 1])
            self._compare(block, reference, source, candidate, state)

    def _ask(self, block: list[Segment]) -> Pending:
        return self.candidate.submit_logits_rows([(self.ids[s.text][:s.stop], s.start, s.stop) for s in block])

    @staticmethod
    def _rows(hidden: list[np.ndarray], block: list[Segment]) -> np.ndarray:
        return np.concatenate([hidden[s.text][s.start:s.stop] for s in block])

    def _compare(self, block: list[Segment], reference: np.ndarray, source: np.ndarray, candidate: np.ndarray,
                 state: list[_Text]) -> None:
        at = 0
        for segment in block:
            rows = slice(at, at + segment.stop - segment.start)
            at = rows.stop
            found = state[segment.text]
            if not found.finite or not np.all(np.isfinite(candidate[rows])):
                found.finite = False
                continue
            parts = []
            for offset, correct in compared(reference[rows], candidate[rows]):
                found.figures.add_compared(correct, segment.start + offset)
                span = slice(rows.start + offset, rows.start + offset + len(correct.kl))
                gap = correct if source is reference else compare_rows(source[span], candidate[span], correct.log_q)
                parts.append(stats_of(gap, self.ids[segment.text], segment.start + offset))
            found.gap.append(joined(parts))
            if self.kept is None and segment.text == 0 and segment.start == 0:
                kept = slice(rows.start, rows.start + min(rows.stop - rows.start, KEPT_ROWS))
                self.kept = KeptBlock(self.texts[0], tuple(self.ids[0][:kept.stop - kept.start]),
                                      reference[kept].copy(), candidate[kept].copy())
