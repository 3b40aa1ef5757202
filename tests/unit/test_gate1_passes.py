"""Gate 1 does each chunk's work once: no quantization a previous chunk showed useless, no bound where the
bytes reproduce.

Why (issue 32, cost): a writer quantizes a whole tensor from one input precision, so once a chunk reproduced
under it, trying f32 first on every later chunk re-quantizes the blocks where float16 rounding moved a value,
for nothing; and a chunk whose bytes *are* the reference quantizer's output from the source cannot exceed a
bound on that quantizer's error, yet the per-type bound (three rounded inputs, a float64 comparison each) cost
10x the reproduction on a Q8_0 chunk. A sampled chunk compared only some blocks, so the bound still reads the
rest; a chunk that does not reproduce is still bounded."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.gates.storage import reproduction, tensor_values
from engine.gates.storage.reproduction import round_input
from engine.policy import Policy
from engine.quant import bounds, reference


def _bf16_source(rows: int, cols: int, seed: int, scale: float) -> np.ndarray:
    values = (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)
    return round_input(values, "bf16")


@pytest.fixture
def quantized_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of blocks each call of the quantizer was given."""
    calls: list[int] = []
    quantize = reference.quantize

    def counting(values: np.ndarray, ggml_type, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(values.size // ggml_type.block_size)
        return quantize(values, ggml_type, **kwargs)

    monkeypatch.setattr(reproduction.reference, "quantize", counting)
    return calls


@pytest.fixture
def bound_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The type of every chunk a bound was computed for."""
    calls: list[str] = []
    error_bounds = bounds.error_bounds

    def counting(raw, ggml_type, inputs):  # type: ignore[no-untyped-def]
        calls.append(ggml_type.name)
        return error_bounds(raw, ggml_type, inputs)

    monkeypatch.setattr(tensor_values.bounds, "error_bounds", counting)
    return calls


Chunk = tuple[np.ndarray, np.ndarray]  # source rows, their stored bytes


def _chunks(type_name: str, made_from: str, scale: float = 0.002) -> tuple[TensorInfo, list[Chunk]]:
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    info = TensorInfo("blk.0.ffn_up.weight", (4096, 64), ggml_type, 0, 0)
    chunks = []
    for seed in (1, 2):
        x = _bf16_source(32, 4096, seed, scale)
        raw = reference.quantize(round_input(x, made_from), ggml_type).reshape(32, -1).copy()
        chunks.append((x, raw))
    return info, chunks


def test_after_a_chunk_reproduced_under_f16_the_next_is_quantized_once(quantized_blocks: list[int]) -> None:
    info, chunks = _chunks("Q4_K", "f16")
    acc = tensor_values._Accumulator()
    per_chunk = []
    for x, raw in chunks:
        quantized_blocks.clear()
        tensor_values._quantized_chunk(acc, x, raw, info, Policy(), None)
        per_chunk.append(sum(quantized_blocks))
    blocks = chunks[0][0].size // 256
    moved = int((round_input(chunks[0][0], "f16") != chunks[0][0]).reshape(-1, 256).any(axis=1).sum())
    assert 0 < moved < blocks
    assert per_chunk == [blocks + moved, blocks], per_chunk  # f32 first, then the precision that reproduced
    assert (acc.mismatched, acc.precisions) == (0, {"f16"})


def test_a_changed_block_after_the_preference_is_still_a_mismatch() -> None:
    info, chunks = _chunks("Q4_K", "f16")
    chunks[1][1][7, 3] ^= 0x10
    acc = tensor_values._Accumulator()
    for x, raw in chunks:
        tensor_values._quantized_chunk(acc, x, raw, info, Policy(), None)
    assert acc.mismatched == 1


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_a_chunk_that_reproduces_is_not_bounded(type_name: str, bound_calls: list[str]) -> None:
    info, chunks = _chunks(type_name, "f32", scale=0.02)
    acc = tensor_values._Accumulator()
    tensor_values._quantized_chunk(acc, *chunks[0], info, Policy(), None)
    assert acc.mismatched == 0 and bound_calls == []


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0"])
def test_a_chunk_that_does_not_reproduce_or_was_sampled_is_bounded(type_name: str, bound_calls: list[str]) -> None:
    info, chunks = _chunks(type_name, "f32", scale=0.02)
    (x, raw), (x2, raw2) = chunks
    raw[0, 2] ^= 0x01
    acc = tensor_values._Accumulator()
    tensor_values._quantized_chunk(acc, x, raw, info, Policy(), None)
    assert acc.mismatched == 1 and bound_calls == [type_name]
    sample = np.zeros(raw2.size // info.ggml_type.type_size, dtype=bool)
    sample[::7] = True
    tensor_values._quantized_chunk(tensor_values._Accumulator(), x2, raw2, info, Policy(), None, sample)
    assert bound_calls == [type_name, type_name]
