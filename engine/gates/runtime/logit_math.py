"""The arithmetic gate 2 does on logits, a few rows at a time.

Why rows: a vocabulary of 262,144 tokens makes one position's logits 2 MiB in float64, and every
comparison needs several such temporaries (two log-softmaxes, their exponentials, a difference). Done on
a text's whole [positions, vocabulary] matrix that was gigabytes; done ROW_BYTES at a time it is a few
MiB whatever the vocabulary or the text's length.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

ROW_BYTES = 8 << 20  # float64 bytes of one temporary: rows x vocabulary x 8


def row_slices(rows: int, vocabulary: int) -> Iterator[slice]:
    """Consecutive slices of `rows` whose float64 temporaries fit ROW_BYTES (at least one row each)."""
    step = max(1, ROW_BYTES // (8 * max(vocabulary, 1)))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (the input is widened first: float32 sums lose the tail)."""
    return softmaxes(logits)[0]


def softmaxes(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise (log-softmax, softmax) in float64, sharing the one exponential both need."""
    shifted = logits.astype(np.float64)
    shifted -= shifted.max(axis=-1, keepdims=True)
    exponentials = np.exp(shifted)
    sums = exponentials.sum(axis=-1, keepdims=True)
    shifted -= np.log(sums)
    exponentials /= sums
    return shifted, exponentials


def kl_rows(log_p: np.ndarray, log_q: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
    """KL(p || q) per row, from log-probabilities (and p itself, when at hand)."""
    return ((np.exp(log_p) if p is None else p) * (log_p - log_q)).sum(axis=-1)


@dataclass(frozen=True, slots=True)
class ComparedRows:
    """A few positions' logits of both sides (float64) and what every comparison of them derives: computed
    once, read by the correctness figures and, when the source is the reference itself, the quality ones."""

    reference: np.ndarray
    candidate: np.ndarray
    log_p: np.ndarray
    log_q: np.ndarray
    kl: np.ndarray


def compare_rows(reference: np.ndarray, candidate: np.ndarray, log_q: np.ndarray | None = None) -> ComparedRows:
    """`log_q`: the candidate's log-softmax when already computed (the same rows against another reference)."""
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    log_p, p = softmaxes(ref)
    log_q = log_softmax(cand) if log_q is None else log_q
    return ComparedRows(ref, cand, log_p, log_q, kl_rows(log_p, log_q, p))


def compared(reference: np.ndarray, candidate: np.ndarray) -> Iterator[tuple[int, ComparedRows]]:
    """Both sides' rows compared a few at a time: (offset of the first row, its comparison)."""
    for rows in row_slices(len(reference), reference.shape[-1]):
        yield rows.start, compare_rows(reference[rows], candidate[rows])
