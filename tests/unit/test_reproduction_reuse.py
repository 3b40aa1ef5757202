"""A K-quant chunk is re-quantized once per input precision only where that precision's input differs.

Why: a BF16 source converted to F16 and then quantized (how `bench_7b.py`, and many pipelines, make a Q4_K_M)
reproduces under the f16 input, tried after f32: every chunk was quantized twice, and the quantizer was 82% of
gate 1's CPU on the half-7B split. F16 holds every BF16 value in its normal range, so the two inputs differ only
in blocks holding a value below 2^-14, and an unweighted K-quant writes a block from that block's values alone.
The outcome must be the one of quantizing every precision whole: the same precision named, the same counts."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.gates.storage.reproduction import INPUT_PRECISIONS, reproduce_chunk, round_input
from engine.quant import reference
from tests.unit.reproduction_inputs import bf16_source


def _whole(x: np.ndarray, raw: np.ndarray, type_name: str) -> tuple[str, int]:
    """What quantizing every precision's input whole gives: the first precision with the fewest differing
    blocks (stopping at one that reproduces all)."""
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    best: tuple[str, int] | None = None
    for precision in INPUT_PRECISIONS:
        ours = reference.quantize(round_input(x, precision), ggml_type).reshape(-1, ggml_type.type_size)
        differing = int((ours != raw.reshape(-1, ggml_type.type_size)).any(axis=1).sum())
        if best is None or differing < best[1]:
            best = (precision, differing)
        if differing == 0:
            break
    assert best is not None
    return best


def test_an_f16_made_from_a_bf16_source_is_quantized_again_only_where_the_inputs_differ(
        quantized_blocks: list[int]) -> None:
    x = bf16_source(64, 4096, seed=1, scale=0.002)  # 408 of 1,024 blocks hold a value float16 rounds
    ggml_type = GGML_TYPES_BY_NAME["Q4_K"]
    raw = reference.quantize(round_input(x, "f16"), ggml_type).reshape(64, -1)
    blocks = x.size // ggml_type.block_size
    moved = int((round_input(x, "f16") != x).reshape(-1, ggml_type.block_size).any(axis=1).sum())
    assert 0 < moved < blocks
    quantized_blocks.clear()
    info = TensorInfo("w", (4096, 64), ggml_type, 0, raw.size)
    outcome = reproduce_chunk(x, raw, info, 0, None)
    assert (outcome.precision, outcome.mismatched) == ("f16", 0)  # f32's input, tried first, did not reproduce
    assert sum(quantized_blocks) == blocks + moved, (quantized_blocks, blocks, moved)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K"])
@pytest.mark.parametrize("made_from", ["f32", "f16", "bf16", "one block changed"])
def test_the_outcome_is_that_of_quantizing_every_input_whole(type_name: str, made_from: str) -> None:
    x = bf16_source(8, 512, seed=len(type_name) + len(made_from))
    x[0, :3] = np.float32(3e-6)  # below float16's normal range, in the first block
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    precision = "f16" if made_from == "one block changed" else made_from
    raw = reference.quantize(round_input(x, precision), ggml_type).reshape(8, -1).copy()
    if made_from == "one block changed":
        raw[3, 5] ^= 0x10
    info = TensorInfo("w", (512, 8), ggml_type, 0, raw.size)
    outcome = reproduce_chunk(x, raw, info, 0, None)
    assert (outcome.precision, outcome.mismatched + outcome.ties) == _whole(x, raw, type_name)
