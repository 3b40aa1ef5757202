"""The labelled retrieval set's arithmetic (issue 37): recall and nDCG against hand-worked cases, decisive
pairs and near-ties, truncate-then-normalise, the widths compared, the set shipped with the package."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from engine.formats.source import SourceModel
from engine.gates.runtime.labelled_measure import cut_to_fit, declared_widths, within
from engine.gates.runtime.labelled_retrieval import (
    LabelledSet,
    at_width,
    min_cosine_at,
    pair_order,
    parse_labelled_set,
    ranking,
    served_widths,
    shipped_set,
)


def tiny(passages: int = 4) -> LabelledSet:
    return parse_labelled_set({
        "passages": [{"id": f"p{i}", "text": f"passage {i}"} for i in range(passages)],
        "queries": [{"id": "q0", "language": "en", "text": "a", "relevant": ["p0"], "hard_negatives": ["p1", "p2"]},
                    {"id": "q1", "language": "de", "text": "b", "relevant": ["p1", "p3"], "hard_negatives": ["p0"]}],
    }, "tiny")


def test_recall_and_ndcg_are_the_textbook_figures():
    scores = np.array([[0.9, 0.8, 0.1, 0.0],   # q0: its one relevant first
                       [0.9, 0.5, 0.1, 0.4]])  # q1: relevant p1, p3 at ranks 2 and 3
    figures = ranking(scores, tiny())
    q1_ndcg = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert figures["recall_at_1"] == 0.5 and figures["recall_at_10"] == 1.0
    assert figures["ndcg_at_10"] == pytest.approx((1 + q1_ndcg) / 2)


def test_a_decisive_pair_reversed_is_counted_and_a_near_tie_is_only_listed():
    labelled = tiny()
    reference = np.array([[0.9, 0.5, 0.49, 0.0], [0.2, 0.8, 0.1, 0.7]])
    candidate = np.array([[0.9, 0.49, 0.5, 0.0], [0.2, 0.6, 0.1, 0.7]])  # q0: a near-tie flips; q1: p1/p3 flips
    order = pair_order(reference, candidate, labelled, margin=0.05)
    assert [s["passages"] for s in order.swapped] == [["p1", "p3"]] and order.swapped[0]["query"] == "q1"
    assert order.near_ties == 1 and order.near_tie_examples[0]["passages"] == ["p1", "p2"]
    assert order.pairs == 12 and order.decisive == 11
    assert not pair_order(reference, candidate, labelled, margin=0.5).swapped  # every gap under it is a tie


def test_truncate_then_normalise_is_the_served_vector():
    vectors = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 1.0]])
    assert np.allclose(at_width(vectors, 2), [[0.6, 0.8], [0.0, 0.0]])  # a zero prefix stays zero, not NaN
    flipped = vectors.copy()
    flipped[0, 1] = -4.0
    assert min_cosine_at(vectors[:1], flipped[:1], 3) == pytest.approx(1 - 2 * 16 / 169)
    assert min_cosine_at(vectors[:1], flipped[:1], 2) == pytest.approx(-7 / 25)  # the narrow width shows it


def test_widths_are_the_full_one_and_the_served_ones_below_it():
    assert served_widths((), None, 384) == (384,)
    assert served_widths((768, 256, 64), None, 768) == (768, 256, 64)
    assert served_widths((256,), (128, 64, 64, 0, 1024), 384) == (384, 128, 64)  # the policy's, sane ones


def test_declared_widths_come_from_the_model_card_and_the_served_width(tmp_path: Path):
    (tmp_path / "README.md").write_text('loss: {"matryoshka_dims": [768, 512, 256, 128, 64], "weights": [1]}')
    (tmp_path / "config_sentence_transformers.json").write_text('{"truncate_dim": 32}')
    source = SourceModel(root=tmp_path, config={}, tensors={}, files=())
    assert declared_widths(source) == (768, 512, 256, 128, 64, 32)
    assert declared_widths(SourceModel(root=tmp_path / "none", config={}, tensors={}, files=())) == ()


def test_passages_left_out_renumber_the_labels_and_drop_a_query_without_its_relevant_one():
    kept = within(tiny(), [False, True, True, True])
    assert kept.passage_ids == ("p1", "p2", "p3")
    assert [(q.id, q.relevant, q.hard_negatives) for q in kept.queries] == [("q1", (0, 2), ())]


@pytest.mark.parametrize(("document", "says"), [
    ({"passages": "no"}, "problem"), ({"passages": [{"id": "p0", "text": "x"}] * 2, "queries": []}, "queries"),
    ({"passages": [{"id": "p0", "text": "x"}, {"id": "p1"}], "queries": [{"id": "q", "text": "a", "relevant": ["p0"]}]},
     "text"), ({"passages": [{"id": "p0", "text": "x"}] * 2,
               "queries": [{"id": "q", "text": "a", "relevant": ["p0"]}]}, "a passage id appears twice")])
def test_a_malformed_submitted_set_is_refused_saying_what(document, says):
    with pytest.raises(ValueError, match=says):
        parse_labelled_set(document, "submitted")


def test_a_query_naming_a_missing_passage_is_refused():
    with pytest.raises(ValueError, match="q0 names passages that do not exist: \\['p9'\\]"):
        parse_labelled_set({"passages": [{"id": "p0", "text": "x"}, {"id": "p1", "text": "y"}],
                            "queries": [{"id": "q0", "language": "en", "text": "a", "relevant": ["p9"],
                                         "hard_negatives": []}]}, "bad")


def test_the_shipped_set_is_what_the_issue_asks_for():
    labelled = shipped_set()
    languages = {q.language for q in labelled.queries}
    assert len(labelled.queries) >= 60 and {"en", "de", "es"} <= languages
    assert all(len(q.hard_negatives) >= 2 for q in labelled.queries)
    assert sum(len(p.split()) > 300 for p in labelled.passages) >= 5  # long documents


def test_a_long_document_is_cut_at_the_last_whole_word_that_fits():
    assert cut_to_fit("one two three four five", lambda text: len(text.split()) <= 3) == "one two three"
    assert cut_to_fit("one two", lambda text: len(text) <= 2) is None  # not even the first word


def test_a_parsed_set_keeps_every_field_of_its_queries():
    labelled = parse_labelled_set({
        "passages": [{"id": "p0", "text": "first"}, {"id": "p1", "text": "second"}],
        "queries": [{"id": "q0", "language": "es", "text": "¿dónde?", "kind": "short", "relevant": ["p1"]},
                    {"id": "q1", "text": "bare", "relevant": ["p0"]}]}, "mine")
    assert labelled.name == "mine" and labelled.passages == ("first", "second")
    assert [(q.id, q.language, q.text, q.kind, q.relevant, q.hard_negatives) for q in labelled.queries] == [
        ("q0", "es", "¿dónde?", "short", (1,), ()), ("q1", "", "bare", "", (0,), ())]
    assert shipped_set().name == "convgate retrieval set v1"
    with pytest.raises(ValueError, match="relevant"):  # the schema demands a relevant passage per query
        parse_labelled_set({"passages": [{"id": "p0", "text": "x"}, {"id": "p1", "text": "y"}],
                            "queries": [{"id": "q", "text": "a", "relevant": []}]}, "none")


def test_recall_at_1_reads_the_first_ranked_passage_and_ties_keep_the_set_order():
    labelled = tiny()
    scores = np.array([[0.1, 0.9, 0.2, 0.0],   # q0: p0 relevant, ranked third
                       [0.1, 0.9, 0.2, 0.0]])  # q1: p1 relevant, ranked first
    assert ranking(scores, labelled)["recall_at_1"] == 0.5
    assert ranking(np.array([[0.1, 0.9, 0.2, 0.0], [0.2, 0.1, 0.9, 0.0]]), labelled)["recall_at_1"] == 0.0
    with pytest.raises(ValueError):  # a score row per query, no more
        ranking(np.zeros((3, 4)), labelled)
    many = parse_labelled_set({"passages": [{"id": f"p{i}", "text": "x"} for i in range(200)],
                               "queries": [{"id": "q", "text": "a", "relevant": ["p0"]}]}, "ties")
    assert ranking(np.zeros((1, 200)), many)["recall_at_1"] == 1.0  # equal scores: the first passage first


def test_a_pairs_row_and_the_gap_moved_are_exact():
    labelled = tiny()
    reference = np.array([[1.0, 0.5, 0.25, 0.0], [0.0, 1.0, 0.0, 0.5]])
    candidate = np.array([[1.0, 0.25, 0.25, 0.0], [0.0, 0.5, 0.0, 0.75]])
    order = pair_order(reference, candidate, labelled, margin=0.25)
    # q0 p1/p2: reference gap 0.25 is the margin itself, a near-tie; q1 p1/p3: reversed
    assert order.near_tie_examples[0] == {"query": "q0", "passages": ["p1", "p2"], "reference_gap": 0.25,
                                          "candidate_gap": 0.0}
    assert {"query": "q1", "passages": ["p1", "p3"], "reference_gap": 0.5, "candidate_gap": -0.25} in order.swapped
    moved = sorted(abs((reference[q, a] - reference[q, b]) - (candidate[q, a] - candidate[q, b]))
                   for q in range(2) for a in range(4) for b in range(a + 1, 4))
    assert order.gap_moved_p99 == pytest.approx(float(np.percentile(moved, 99)))
    assert order.gap_moved_p99 < max(moved)


def test_a_decisive_pair_the_candidate_scores_equal_is_swapped():
    labelled = tiny()
    reference = np.array([[1.0, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.5]])
    candidate = np.array([[1.0, 0.5, 0.0, 0.0], [0.0, 0.5, 0.0, 0.5]])  # q1: p1 and p3 now tie
    swapped = pair_order(reference, candidate, labelled, margin=0.1).swapped
    assert [(s["query"], s["passages"]) for s in swapped] == [("q1", ["p1", "p3"])]


def test_pairs_take_the_references_top_ten_beyond_the_labels():
    labelled = parse_labelled_set({"passages": [{"id": f"p{i}", "text": "x"} for i in range(30)],
                                   "queries": [{"id": "q", "text": "a", "relevant": ["p0"]}]}, "wide")
    reference = np.arange(30, dtype=np.float64)[None, :]  # the top ten are p20..p29
    order = pair_order(reference, reference, labelled, margin=0.0)
    assert order.pairs == 55  # p0 and the top ten: 11 passages
    rows = pair_order(reference, reference[:, ::-1].copy(), labelled, margin=0.0).swapped
    assert {tuple(row["passages"]) for row in rows} >= {("p20", "p29"), ("p0", "p29")}


def test_no_queries_left_is_no_pair_and_no_gap_moved():
    empty = LabelledSet("empty", ("p0", "p1"), ("x", "y"), ())
    order = pair_order(np.zeros((0, 2)), np.zeros((0, 2)), empty, margin=0.1)
    assert (order.pairs, order.decisive, order.gap_moved_p99) == (0, 0, 0.0)


def test_served_vectors_are_float64_unit_rows_whatever_their_scale():
    small = np.array([[0.03, 0.04, 5.0], [0.3, 0.4, 0.0]], dtype=np.float32)
    served = at_width(small, 2)
    assert served.dtype == np.float64
    assert np.allclose(served, [[0.6, 0.8], [0.6, 0.8]], atol=0, rtol=1e-6)
    assert np.allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-12)
    assert served_widths((), (1,), 384) == (384, 1)  # one dimension is a width too


def test_the_smallest_cosine_is_the_worst_row_not_a_sum():
    reference = np.array([[1.0, 0.0], [0.0, 1.0]])
    candidate = np.array([[1.0, 0.0], [0.6, 0.8]])
    assert min_cosine_at(reference, candidate, 2) == pytest.approx(0.8)
