"""How the streamed reference batches a verification's sequences (`length_groups`): every batch is one more
read of the model's weights, and every padded position costs a position's compute through every layer. A
long text beside a short one doubled the reference's compute for that text: the near-context-limit text
(2,031 tokens) shared its batch with a 75-token text padded to 2,031, which at 7B on 2 cores is ~150 s of
float32 compute to save one ~50 s read of the weights."""

from __future__ import annotations

from engine.runtime.hf_reference import PADDING_POSITIONS, length_groups, packed_rows

DEFAULT_TEXTS = [75, 74, 51, 41, 41, 35, 33, 24, 22, 19, 14, 13, 12, 9, 8, 6, 4, 2]  # a llama's default texts


def _lengths(groups: list[list[list[int]]]) -> list[list[int]]:
    return [[len(sequence) for sequence in group] for group in groups]


def _sequences(lengths: list[int]) -> list[list[int]]:
    return [[7] * length for length in lengths]


def test_the_text_near_the_context_limit_is_batched_alone_not_with_a_short_text_padded_to_its_length():
    groups = _lengths(length_groups(_sequences([*DEFAULT_TEXTS, 2031])))
    assert groups == [[2031], DEFAULT_TEXTS]


def test_texts_of_similar_lengths_share_one_batch_so_the_weights_are_read_once():
    assert _lengths(length_groups(_sequences(DEFAULT_TEXTS))) == [DEFAULT_TEXTS]
    assert _lengths(length_groups(_sequences([900, 880, 850]))) == [[900, 880, 850]]


def test_no_sequence_is_padded_past_the_bound_and_short_texts_share_one_read():
    lengths = [8192, 4000, 2031, 1500, 700, 600, 520, 250, 75, 40, 2, 1]
    groups = _lengths(length_groups(_sequences(lengths)))
    assert sorted(length for group in groups for length in group) == sorted(lengths)
    for group in groups:
        assert all(group[0] - length <= PADDING_POSITIONS for length in group)
        assert group == sorted(group, reverse=True)
    assert groups[-1] == [250, 75, 40, 2, 1]  # padded to twice their tokens, yet one read, not two


def test_a_causal_groups_sequences_are_packed_into_rows_as_wide_as_its_longest():
    """`packed_rows`: a causal reference computes the texts' tokens plus the rows' slack, not every text padded
    to the longest (483 tokens: 525 positions packed, 1,350 padded)."""
    group = _sequences(DEFAULT_TEXTS)
    rows = packed_rows(group)
    assert sorted(len(sequence) for row in rows for sequence in row) == sorted(DEFAULT_TEXTS)
    assert all(sum(len(sequence) for sequence in row) <= max(DEFAULT_TEXTS) for row in rows)
    assert len(rows) * max(DEFAULT_TEXTS) == 525 and len(group) * max(DEFAULT_TEXTS) == 1350
    assert packed_rows([[7] * 9]) == [[[7] * 9]] and packed_rows([]) == []
