"""A streamed causal reference computes its texts' tokens, not their padding (`HFModel.prefetch`).

Why: gate 2 runs every text through a streamed reference in one batch per length group, so each weight is read
once for all of them. Padded to the longest, the default texts of a llama (18 texts, 483 tokens, the longest
75) cost 1,350 positions through every layer: on the half-7B benchmark 54% of gate 2's float32 compute was
padding. Packed end to end in rows as wide as the longest text, each with its own positions, a causal model
computes the tokens and at most one row's slack, and transformers' packed-sequence mask keeps each text from
seeing the others (tested below on every decoder architecture the project maps, sliding windows included)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.runtime.hf_reference import HFModel

pytestmark = pytest.mark.slow

DEFAULT_TEXTS = (75, 74, 51, 41, 41, 35, 33, 24, 22, 19, 14, 13, 12, 9, 8, 6, 4, 2)  # a llama's default texts
# past the gemma fixtures' 64-position windows, and short texts packed behind longer ones in the same row
MIXED = (80, 66, 50, 30, 13, 9, 3, 1)


def _ids(source: Path, lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(seed)
    return [[int(i) for i in rng.integers(3, vocab, size=n)] for n in lengths]


def _positions_computed(model: HFModel) -> list[int]:
    """Every batch's positions (rows x width) the base model is run on, as a forward pre-hook sees them."""
    seen: list[int] = []

    def count(_module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append(int(ids.numel()))

    model.model.base_model.register_forward_pre_hook(count, with_kwargs=True)
    return seen


def test_a_causal_batch_computes_its_tokens_and_at_most_one_rows_slack(stream_everything: None,
                                                                       tiny_llama: Path) -> None:
    source = tiny_llama / "source"
    model = HFModel(source, causal=True)
    seen = _positions_computed(model)
    sequences = _ids(source, DEFAULT_TEXTS, seed=3)
    model.prefetch(sequences)
    assert len(seen) == 1  # one batch: each weight read once
    assert seen[0] <= sum(DEFAULT_TEXTS) + max(DEFAULT_TEXTS), (seen, sum(DEFAULT_TEXTS))


def test_packed_texts_get_the_hidden_states_each_gets_alone(stream_everything: None, decoders: dict[str, Path],
                                                            tiny_llama: Path) -> None:
    """Each text's last hidden states from the packed batch, against the same text run alone: equal to float32
    rounding (a text that saw another's tokens, or positions not restarted, would be off by far more)."""
    for source in [folder / "source" for folder in decoders.values()] + [tiny_llama / "source"]:
        sequences = _ids(source, MIXED, seed=5)
        alone = HFModel(source, causal=True, streamed=False)
        expected = [alone.hidden(ids) for ids in sequences]
        packed = HFModel(source, causal=True)
        packed.prefetch(sequences)
        for ids, want in zip(sequences, expected, strict=True):
            got = packed.hidden(ids)
            scale = float(np.abs(want).max())
            assert got.shape == want.shape
            assert float(np.abs(got - want).max()) <= 1e-5 * scale, (source.parent.name, len(ids))
