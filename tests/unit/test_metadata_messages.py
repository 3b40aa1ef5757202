"""What the metadata check says when a key disagrees (engine/gates/storage/metadata_check.py): the blocker's
`why` is the evidence a converter's author reads to fix the file, so each message is pinned whole, with the
comparison rules behind it (a boolean is not an integer, arrays summarised past 16 items, the first three
differing entries named)."""

from __future__ import annotations

import hashlib

import pytest

from engine.gates.expectation import Expectation
from engine.gates.storage.metadata_check import (
    _agrees,
    _differs_at,
    _disagreement,
    _summary,
    _type_fits,
    _wrong_type,
    value_kind,
)
from tests.unit.test_metadata_check import HONEST_LLAMA, run


def test_arrays_of_16_items_are_shown_and_longer_ones_summarised_by_length_and_digest():
    sixteen, seventeen = list(range(16)), list(range(17))
    assert _summary(sixteen) == sixteen
    digest = hashlib.sha256(repr(seventeen).encode()).hexdigest()[:16]
    assert _summary(seventeen) == f"17 items, sha256:{digest}"
    assert _summary("x" * 40) == "x" * 40  # only arrays


def test_where_arrays_differ_names_the_count_the_lengths_and_the_first_three():
    assert _differs_at([1, 2, 3, 4, 5], [0, 0, 0, 0, 5]) == (
        "4 of 5 entries differ; [0] is 0, expected 1; [1] is 0, expected 2; [2] is 0, expected 3")
    assert _differs_at(["a", "b"], ["a", "c", "d"]) == "1 of 2 entries differ; length 3, expected 2; [1] is 'c', " \
                                                        "expected 'b'"


@pytest.mark.parametrize(("value", "kind"), [
    (True, "a boolean"), (3, "an integer"), (2.5, "a float"), ("x", "a string"), ([1], "an array"),
    (None, "NoneType"), ({"a": 1}, "dict")])
def test_the_kind_of_a_value_as_a_message_names_it(value, kind):
    assert value_kind(value) == kind


def test_a_key_of_no_known_kind_takes_any_value():
    assert _type_fits(Expectation("k", None, "o"), 3)
    assert _type_fits(Expectation("k", {"a": 1}, "o"), "x")


@pytest.mark.parametrize(("expectation", "actual", "message"), [
    (Expectation("a.eps", 1e-5, "config.eps", is_float=True), "1e-5", "a.eps holds a string, llama.cpp reads it as "
                                                                      "a number"),
    (Expectation("a.eps", 1e-5, "config.eps", is_float=True), True, "a.eps holds a boolean, llama.cpp reads it as "
                                                                    "a number"),
    (Expectation("a.causal", False, "config.is_causal"), 0, "a.causal holds an integer, llama.cpp reads it as "
                                                            "a boolean"),
    (Expectation("a.blocks", 2, "config.n"), 2.0, "a.blocks holds a float, llama.cpp reads it as an integer"),
    (Expectation("a.name", "x", "config.n"), ["x"], "a.name holds an array, llama.cpp reads it as a string"),
    (Expectation("tokenizer.ggml.tokens", 6, "rows"), 6, "tokenizer.ggml.tokens holds an integer, llama.cpp reads it "
                                                         "as an array"),
])
def test_a_wrong_kind_is_named_with_the_kind_llama_cpp_reads(expectation, actual, message):
    assert _wrong_type(expectation, True, actual) == message
    assert _wrong_type(expectation, False, actual) is None  # absent: a missing key, not a wrong kind


def test_a_boolean_and_an_integer_never_agree_either_way():
    assert not _agrees(Expectation("k", True, "o"), 1)
    assert not _agrees(Expectation("k", 1, "o"), True)
    assert not _agrees(Expectation("k", False, "o"), True)
    assert _agrees(Expectation("k", False, "o"), False)
    assert _agrees(Expectation("k", 2, "o"), 2)


def test_what_a_disagreement_says():
    assert _disagreement(Expectation("a.n", 2, "config.n"), True, 3) == "a.n is 3, config.n says 2"
    assert _disagreement(Expectation("a.n", 2, "config.n"), False, None) == "a.n is absent; config.n says 2"
    long = list(range(20))
    assert _disagreement(Expectation("a.t", long, "tok"), False, None) == (
        f"a.t is absent; tok says {_summary(long)!r}")
    assert _disagreement(Expectation("a.t", [1, 2], "tok"), True, [1, 3]) == (
        "a.t differs from tok: 1 of 2 entries differ; [1] is 3, expected 2")
    assert _disagreement(Expectation("a.t", "x", "tok"), True, ["x"]) == "a.t is ['x'], tok says 'x'"
    assert _disagreement(Expectation("a.t", ["x"], "tok"), True, "x") == "a.t is 'x', tok says ['x']"
    assert _disagreement(Expectation("tokenizer.ggml.tokens", 2, "rows"), True, ["a", "b"]) is None  # counted


def test_a_failing_check_is_reported_as_failed_and_an_unexpected_key_says_why(tmp_path):
    outcome = run(tmp_path, {**HONEST_LLAMA, "llama.block_count": 3, "some.vendor.key": 1})
    results = {check.key: check.result for check in outcome.checks}
    assert results["llama.block_count"] == "fail"
    assert results["llama.embedding_length"] == "ok"
    why = {str(b.key): b.why for b in outcome.blockers}
    assert why["llama.block_count"] == "llama.block_count is 3, config.num_hidden_layers says 2"
    assert why["some.vendor.key"] == ("some.vendor.key = 1 is present, but nothing in the source says it should be "
                                      "(llama.cpp may read it)")


def test_keys_judged_elsewhere_are_not_listed_as_unverified(tmp_path):
    outcome = run(tmp_path, {**HONEST_LLAMA, "general.alignment": 32})
    assert outcome.blockers == []
    assert not any("general.alignment" in line for line in outcome.not_verified)  # the structural parser's
    assert not any("add_bos_token" in line for line in outcome.not_verified)  # judged by meaning
