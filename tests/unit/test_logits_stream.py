"""Gate 2's causal-LM figures computed a block of positions at a time equal the whole-matrix figures the
gate computed before it streamed (the oracle below is that code, kept here verbatim in spirit: one
log-softmax over a text's whole [positions, vocabulary] matrix), for any cut of the texts into blocks."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gates.runtime import logit_math
from engine.gates.runtime.layer_divergence import locate_divergence
from engine.gates.runtime.logit_math import compare_rows
from engine.gates.runtime.logits_parity import LogitsResult, PastMark, TextFigures, check_logits, conclude
from engine.gates.runtime.logits_stream import LogitsStream, Segment, plan_blocks, rows_per_block
from engine.gates.runtime.positions import Marks, past_mark
from engine.gates.runtime.quality import SourceGap, position_stats, summarize
from engine.policy import Policy
from engine.runtime.llama_process import Pending
from engine.texts import Text
from engine.thresholds import RuntimeThresholds

VOCABULARY = 300


def whole_log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def whole_figures(reference: np.ndarray, candidate: np.ndarray, ids: list[int]) -> dict[str, object]:
    """The comparison as one matrix per text (correctness and the gap to the source, on the same logits)."""
    log_p, log_q = whole_log_softmax(reference), whole_log_softmax(candidate)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)
    positions = np.arange(len(ids) - 1)
    following = np.asarray(ids[1:])
    return {"kl": kl, "sum_sq_diff": float(((reference - candidate) ** 2).sum()),
            "sum_sq_ref": float((reference**2).sum()), "top1_equal": int((reference.argmax(-1) ==
                                                                           candidate.argmax(-1)).sum()),
            "log_p_next": log_p[positions, following], "log_q_next": log_q[positions, following]}


def logits_of(ids: list[int], seed: int, noise: float = 0.0) -> np.ndarray:
    """Causal, like a model's: row p depends on the position and its token only (a prefix gives the same rows)."""
    rows = [np.random.default_rng([p, token]).standard_normal(VOCABULARY) * 4
            + np.random.default_rng([seed, p]).standard_normal(VOCABULARY) * noise for p, token in enumerate(ids)]
    return np.asarray(rows, dtype=np.float32).reshape(len(ids), VOCABULARY)


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_blocks_cover_every_position_once_in_order_cut_at_batch_boundaries(batch: int):
    lengths = [5, 0, 12, 3, 1]
    for rows in (1, 2, 4, 7, 40):
        blocks = plan_blocks([[(0, n)] if n else [] for n in lengths], rows, batch)
        assert all(0 < sum(s.stop - s.start for s in block) <= max(rows, batch) for block in blocks)
        flat = [(s.text, p) for block in blocks for s in block for p in range(s.start, s.stop)]
        assert flat == [(t, p) for t, n in enumerate(lengths) for p in range(n)]
        assert all(s.start % batch == 0 for block in blocks for s in block)
    assert plan_blocks([[(0, 3)], [(0, 3)]], 4, 1) == [[Segment(0, 0, 3), Segment(1, 0, 1)], [Segment(1, 1, 3)]]
    assert plan_blocks([[(0, 3)], [(0, 3)]], 4, 2) == [[Segment(0, 0, 3)], [Segment(1, 0, 3)]]
    assert plan_blocks([[(0, 9)]], 4, 3) == [[Segment(0, 0, 3)], [Segment(0, 3, 6)], [Segment(0, 6, 9)]]
    assert plan_blocks([[(0, 4), (12, 16), (20, 22)]], 8, 4) == [[Segment(0, 0, 4), Segment(0, 12, 16)],
                                                                 [Segment(0, 20, 22)]]
    assert rows_per_block(262_144) == 64 and rows_per_block(32_000) == 524


@pytest.mark.parametrize("row_bytes", [8 * VOCABULARY, 3 * 8 * VOCABULARY, 1 << 30])
def test_figures_by_rows_equal_the_whole_matrix(monkeypatch: pytest.MonkeyPatch, row_bytes: int):
    monkeypatch.setattr(logit_math, "ROW_BYTES", row_bytes)
    ids = [3, 9, 4, 7, 7, 1, 0, 5]
    reference, candidate = logits_of(ids, 1).astype(np.float64), logits_of(ids, 2, noise=0.3).astype(np.float64)
    oracle = whole_figures(reference, candidate, ids)
    figures = TextFigures("t", "s")
    stats = []
    for start, stop in ((0, 3), (3, 4), (4, 8)):
        figures.add(reference[start:stop], candidate[start:stop])
        stats.append(position_stats(reference[start:stop], candidate[start:stop], ids, start))
    assert np.allclose(figures.kls(), oracle["kl"], rtol=1e-12, atol=1e-15)
    assert figures.joined("sq_diff").sum() == pytest.approx(oracle["sum_sq_diff"], rel=1e-12)
    assert figures.joined("sq_ref").sum() == pytest.approx(oracle["sum_sq_ref"], rel=1e-12)
    assert figures.joined("at").tolist() == list(range(len(ids)))
    assert figures.top1_equal == oracle["top1_equal"] and figures.positions == len(ids)
    gap = summarize(stats)
    assert gap["positions"] == len(ids)
    assert np.allclose(np.concatenate([s.kl for s in stats]), oracle["kl"], rtol=1e-12, atol=1e-15)
    assert np.allclose(np.concatenate([s.log_p_reference for s in stats]), oracle["log_p_next"], rtol=1e-12)
    assert np.allclose(np.concatenate([s.log_p_candidate for s in stats]), oracle["log_q_next"], rtol=1e-12)


class FakeCandidate:
    """llama.cpp's side: answers block requests one at a time, like the child, and records them."""

    def __init__(self, noise: float, broken: str | None = None) -> None:
        self.noise, self.broken = noise, broken
        self.asked: list[list[tuple[int, int]]] = []
        self.in_flight: list[tuple[list[int], int, int]] | None = None
        self.n_vocab = VOCABULARY
        self.decode_batch = 2

    def submit_logits_rows(self, segments: list[tuple[list[int], int, int]]) -> Pending:
        assert self.in_flight is None, "a second question before the first was answered"
        self.in_flight = segments
        self.asked.append([(start, stop) for _, start, stop in segments])
        return Pending("computing logits", None, None)  # type: ignore[arg-type]

    def collect(self, _pending: Pending) -> np.ndarray:
        segments, self.in_flight = self.in_flight, None
        assert segments is not None
        rows = []
        for ids, start, stop in segments:
            found = logits_of(ids, 2, self.noise)[start:stop]
            if self.broken is not None and ids == word_ids(self.broken):
                found[0, 0] = np.nan
            rows.append(found)
        return np.concatenate(rows)


class FakeReference:
    def __init__(self) -> None:
        self.heads = 0

    def prefetch(self, _sequences: list[list[int]]) -> None:
        pass

    def hidden(self, ids: list[int]) -> np.ndarray:
        return logits_of(ids, 1)  # the "head" below is the identity: hidden states are the logits

    def head(self, rows: np.ndarray) -> np.ndarray:
        self.heads += 1
        return rows


def word_ids(text: str) -> list[int]:
    return [(7 * sum(map(ord, word)) + i) % VOCABULARY for i, word in enumerate(text.split())]


TEXTS = (Text("one", "alpha beta gamma delta epsilon"), Text("two", "zeta eta"),
         Text("three", " ".join(f"w{i}" for i in range(30))))


def streamed(monkeypatch: pytest.MonkeyPatch, rows: int, candidate: FakeCandidate):
    monkeypatch.setattr("engine.gates.runtime.logits_stream.LOGITS_BLOCK_BYTES", rows * 4 * VOCABULARY)
    reference, gap = FakeReference(), SourceGap()
    ids = [word_ids(t.text) for t in TEXTS]
    stream = LogitsStream(TEXTS, ids, [[(0, len(found))] for found in ids], candidate, reference,  # type: ignore[arg-type]
                          reference, gap)
    return stream, stream.run(Policy().thresholds(["f32"])), gap, reference


@pytest.mark.parametrize("rows", [2, 4, 7, 64])
def test_a_stream_in_any_blocks_gives_the_whole_text_figures(monkeypatch: pytest.MonkeyPatch, rows: int):
    whole = check_logits(TEXTS, word_ids, lambda ids: logits_of(ids, 1),
                         lambda ids: logits_of(ids, 2, 0.3), Policy(), Policy().thresholds(["f32"]))
    stream, result, gap, reference = streamed(monkeypatch, rows, FakeCandidate(0.3))
    assert {b.code for b in result.blockers} == {b.code for b in whole.blockers}
    for key, value in whole.summary.items():
        assert result.summary[key] == pytest.approx(value, rel=1e-9), key
    assert [r["candidate_top1"] for r in result.per_text] == [r["candidate_top1"] for r in whole.per_text]
    total = sum(len(word_ids(t.text)) for t in TEXTS)
    assert reference.heads == len(plan_blocks([[(0, len(word_ids(t.text)))] for t in TEXTS], rows, 2))
    assert reference.heads <= -(-total // rows) + len(TEXTS)  # one head application per block, texts packed
    assert gap.summary()["overall"]["positions"] == total
    assert stream.kept is not None and len(stream.kept.ids) == min(rows, len(word_ids(TEXTS[0].text)), 16)


def test_a_non_finite_block_drops_the_whole_text(monkeypatch: pytest.MonkeyPatch):
    _, result, gap, _ = streamed(monkeypatch, 4, FakeCandidate(0.0, broken=TEXTS[2].text))
    assert {b.code for b in result.blockers} == {"logits.not_finite"}
    assert [row["label"] for row in result.per_text] == ["one", "two"]
    assert result.summary["positions"] == gap.summary()["overall"]["positions"] == 7


def _window_defect(past: PastMark | None) -> LogitsResult:
    """A long text whose llama.cpp logits are exact for its first 768 positions and off past 768: a window
    defect. Over the whole text the KL mean is a quarter of what the positions past the window show."""
    rng = np.random.default_rng(7)
    reference = rng.normal(size=(1024, 40)) * 4
    candidate = reference.copy()
    candidate[768:] += rng.normal(size=(256, 40)) * 0.6
    figures = TextFigures("long-context", "english")
    figures.add(reference[:512], candidate[:512])
    figures.add(reference[512:], candidate[512:])
    past_only = float(np.mean(compare_rows(reference[768:], candidate[768:]).kl))
    thresholds = RuntimeThresholds(min_cosine=0.9, max_logits_nmse=1.0, max_kl_mean=past_only / 2, max_kl_p99=1e9,
                                   min_top1_agreement=0.0)
    return conclude(LogitsResult(), [figures], thresholds, past)


def test_a_defect_past_the_window_alone_is_judged_there_not_averaged_away():
    """Helper's finding on issue 33: a window defect showed in a quarter of the long text's positions, and the
    whole text's mean stayed under the threshold. Judged alone, the positions past the window fail it."""
    assert not _window_defect(None).blockers  # the average of the whole text hides it
    found = _window_defect(PastMark(768, "the sliding window of 768 tokens"))
    assert [b.code for b in found.blockers] == ["logits.kl_above_threshold"]
    assert found.blockers[0].why.startswith("positions past the sliding window of 768 tokens: kl_mean ")
    assert found.past_mark["from_position"] == 768 and found.past_mark["positions"] == 256
    assert found.summary["positions"] == 1024 and "past_mark" not in found.summary


def test_past_mark_is_the_first_window_or_original_context_reached():
    found = Marks((512, 4096), 2048, 32768)
    assert past_mark(found, 511) is None
    assert past_mark(found, 600) == PastMark(512, "the sliding window of 512 tokens")
    assert past_mark(Marks((), 2048, 8192), 3000) == PastMark(2048, "the original context of 2048 tokens")
    assert past_mark(Marks((), None, 8192), 8191) is None


def test_a_defect_only_past_the_window_is_not_traced_at_a_texts_first_positions():
    """Helper's finding on issue 33: the layer trace reads a text's first 64 positions, where a window defect
    does not show, and named 'after the last layer or before the first'. It now says why it did not run."""
    found = _window_defect(PastMark(768, "the sliding window of 768 tokens"))
    details = {"logits": {"past_mark": found.past_mark, "per_text": found.per_text}}
    traced = locate_divergence(found.blockers, details, texts=(), model=None, candidate=None, architecture="llama",
                               classes=("f16",))
    assert traced[0].why.endswith("; layer trace not run: it reads a text's first 64 positions, before the "
                                  "difference")
    assert details["layer_divergence"] == {"skipped": "the difference lies past position 768; the trace reads a "
                                           "text's first 64 positions"}
