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
from tests.unit.reproduction_inputs import bf16_source, q8_chunk


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
        x = bf16_source(32, 4096, seed, scale)
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


def _source_with_small_values(rows: int, cols: int, seed: int) -> np.ndarray:
    """A BF16 source with a value below float16's normal range in most blocks, so the f16 input differs."""
    x = bf16_source(rows, cols, seed, 0.02)
    x[:, ::64] = round_input(np.full((rows, cols // 64), 3e-6, dtype=np.float32), "bf16")
    x[0] = bf16_source(1, cols, seed + 100, 2e-5)[0]  # a row of tiny weights: float16's rounding moves codes
    return x


def test_a_preferred_precision_orders_the_tries_and_never_drops_one() -> None:
    """A chunk the preferred precision does not reproduce is still reproduced by the one that does."""
    ggml_type = GGML_TYPES_BY_NAME["Q4_K"]
    x = _source_with_small_values(8, 1024, seed=3)
    info = TensorInfo("w", (1024, 8), ggml_type, 0, 0)
    for made_from, prefer in (("f32", "f16"), ("f16", "bf16"), ("bf16", "f16")):
        raw = reference.quantize(round_input(x, made_from), ggml_type).reshape(8, -1)
        outcome = reproduction.reproduce_chunk(x, raw, info, 0, None, prefer=prefer)
        assert outcome.mismatched == 0, (made_from, prefer, outcome)
    assert reproduction.precision_order("f16") == ("f16", "f32", "bf16")
    assert reproduction.precision_order(None) == reproduction.INPUT_PRECISIONS


@pytest.mark.parametrize("made_from", ["f32", "f16"])
def test_an_importance_weighted_k_quant_reproduces_under_its_input_precision(made_from: str) -> None:
    """With importance weights every precision quantizes whole and weighted: the unweighted reuse of the first
    precision's blocks is for unweighted K-quants only."""
    ggml_type = GGML_TYPES_BY_NAME["Q4_K"]
    x = _source_with_small_values(8, 1024, seed=4)
    weights = np.random.default_rng(5).lognormal(0, 2, 1024).astype(np.float32)
    raw = reference.quantize(round_input(x, made_from), ggml_type, quant_weights=weights).reshape(8, -1)
    info = TensorInfo("w", (1024, 8), ggml_type, 0, 0)
    outcome = reproduction.reproduce_chunk(x, raw, info, 0, weights)
    assert (outcome.precision, outcome.mismatched) == (made_from, 0)
    unweighted = reproduction.reproduce_chunk(x, raw, info, 0, None)
    assert unweighted.mismatched > 0  # the weights matter here: a test that would notice them dropped


def test_a_tensors_chunks_add_up_mismatches_ties_and_blocks() -> None:
    """Each chunk's outcome is added to the tensor's, never put in place of it: a mismatch in the first
    chunk, a tie in the second and a clean third make one mismatch, one tie and every block counted."""
    info = TensorInfo("blk.0.ffn_up.weight", (256, 12), GGML_TYPES_BY_NAME["Q8_0"], 0, 0)
    changed, tied, clean = q8_chunk(1), q8_chunk(2, tie=True), q8_chunk(3)
    changed[1][2, 40] ^= 0x01
    acc = tensor_values._Accumulator()
    for x, raw in (changed, tied, clean):
        tensor_values._quantized_chunk(acc, x, raw, info, Policy(), None)
    assert (acc.mismatched, acc.ties, acc.blocks, acc.blocks_total) == (1, 1, 96, 96)


def test_a_sampled_tensor_counts_the_blocks_it_compared_apart_from_all_it_holds() -> None:
    info = TensorInfo("blk.0.ffn_up.weight", (256, 8), GGML_TYPES_BY_NAME["Q8_0"], 0, 0)
    acc = tensor_values._Accumulator()
    for seed in (4, 5):
        x, raw = q8_chunk(seed)
        raw[0, 5] ^= 0x01  # block 0: not sampled below, so not compared
        sample = np.zeros(32, dtype=bool)
        sample[8:13] = True
        tensor_values._quantized_chunk(acc, x, raw, info, Policy(), None, sample)
    assert (acc.mismatched, acc.blocks, acc.blocks_total) == (0, 10, 64)
