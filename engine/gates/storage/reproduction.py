"""Re-quantization of one chunk of a tensor: which input precision the writer saw, which blocks differ.

A differing block is forgiven only when nudging the differing source values by at most
`tie_ulps` ulps reproduces the stored bytes (a rounding tie that FMA contraction can flip). The
nudge re-quantizes the whole row, because some quantizers (the imatrix paths) weigh a block by
statistics of its row. When most of a chunk differs, ties cannot explain it and are not searched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.formats.gguf_structure import TensorInfo
from engine.quant import reference

INPUT_PRECISIONS = ("f32", "f16", "bf16")
TIE_SEARCH_MAX_FRACTION = 1 / 8  # above this share of differing blocks, no tie search (it cannot matter)
# Types whose unweighted quantizer writes each block from that block's values alone (ggml's K-quant reference
# quantizers), so a block can be quantized as a row of its own (`_quantize_blocks`, `_requantized`). Not the
# weighted paths: some weigh a block by statistics of its row
BLOCKWISE_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns, NaNs kept quiet."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(is_nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def round_input(values: np.ndarray, precision: str) -> np.ndarray:
    """The quantizer input a pipeline that converted to `precision` first would have used."""
    if precision == "f16":
        return values.astype(np.float16).astype(np.float32)
    if precision == "bf16":
        return (f32_to_bf16_bits(values).astype(np.uint32) << 16).view(np.float32)
    return values


def _nudge(values: np.ndarray, positions: np.ndarray, toward: np.ndarray, ulps: int) -> np.ndarray:
    nudged = values.copy()
    target = np.where(toward > 0, np.float32(np.inf), np.float32(-np.inf))
    for _ in range(ulps):
        nudged[positions] = np.nextafter(nudged[positions], target)
    return nudged


def _is_rounding_tie(row: np.ndarray, stored_row: np.ndarray, info: TensorInfo, max_ulps: int,
                     weights: np.ndarray | None = None, block: int = 0) -> bool:
    """True when moving block `block`'s differing source values <= max_ulps ulps reproduces its stored bytes."""
    ggml_type = info.ggml_type
    span = slice(block * ggml_type.block_size, (block + 1) * ggml_type.block_size)
    stored_block = stored_row.reshape(-1, ggml_type.type_size)[block]
    ours = reference.quantize(row.reshape(1, -1), ggml_type, quant_weights=weights)
    theirs_values = reference.dequantize(stored_block.reshape(1, -1), ggml_type)[0]
    ours_values = reference.dequantize(ours.reshape(-1, ggml_type.type_size)[block].reshape(1, -1), ggml_type)[0]
    positions = np.nonzero(ours_values != theirs_values)[0]
    if positions.size == 0:
        return False
    toward = np.sign(theirs_values[positions] - ours_values[positions])
    positions = positions + span.start
    for ulps in range(1, max_ulps + 1):
        nudged = _nudge(row.reshape(-1), positions, toward, ulps).reshape(1, -1)
        candidate = reference.quantize(nudged, ggml_type, quant_weights=weights)
        if np.array_equal(candidate.reshape(-1, ggml_type.type_size)[block], stored_block):
            return True
    return False


@dataclass(frozen=True)
class ChunkReproduction:
    """One chunk's outcome under the input precision that reproduced most of it."""

    precision: str
    mismatched: int
    ties: int
    compared: int  # blocks re-quantized: all of the chunk's, or its sampled ones


def _quantize_blocks(candidate_input: np.ndarray, info: TensorInfo, weights: np.ndarray | None,
                     picks: np.ndarray) -> np.ndarray:
    """Re-quantize only the chunk's blocks `picks` (flat indices), each block as a row of its own, with
    its own columns' importance weights: what a K-quant writes for a block depends on nothing else."""
    ggml_type = info.ggml_type
    size = ggml_type.block_size
    blocks = candidate_input.reshape(-1, size)
    if weights is None:
        return reference.quantize(blocks[picks], ggml_type).reshape(-1, ggml_type.type_size)
    out = np.empty((picks.size, ggml_type.type_size), dtype=np.uint8)
    column = picks % (candidate_input.shape[1] // size)
    for block in np.unique(column):
        mine = column == block
        out[mine] = reference.quantize(blocks[picks[mine]], ggml_type,
                                       quant_weights=weights[block * size:(block + 1) * size]
                                       ).reshape(-1, ggml_type.type_size)
    return out


def _requantized(candidate_input: np.ndarray, info: TensorInfo, weights: np.ndarray | None,
                 first: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """The chunk's blocks quantized from `candidate_input`. Given the first precision's (input, blocks) of a
    BLOCKWISE_TYPES chunk, only the blocks whose input bits differ from it are quantized again: the others
    are the same bytes. F16 holds every BF16 value in its normal range, so a BF16 source's f16 input differs
    from its f32 one only in blocks holding a value below 2^-14 (half of them, on random weights): a chunk that
    reproduces under f16 only, as an F16-then-quantized file of a BF16 source does, is not quantized twice."""
    ggml_type = info.ggml_type
    if first is None:
        return reference.quantize(candidate_input, ggml_type, quant_weights=weights).reshape(-1, ggml_type.type_size)
    first_input, first_blocks = first
    size = ggml_type.block_size
    moved = np.nonzero((candidate_input.reshape(-1, size).view(np.uint32) !=
                        first_input.reshape(-1, size).view(np.uint32)).any(axis=1))[0]
    ours = first_blocks.copy()
    if moved.size:
        ours[moved] = _quantize_blocks(candidate_input, info, None, moved)
    return ours


def precision_order(prefer: str | None) -> tuple[str, ...]:
    """The input precisions to try, `prefer` first. A writer quantizes a whole tensor from one input, so the
    precision that reproduced a tensor's previous chunk reproduces the next one with a single quantization;
    f32 first would re-quantize every block float16 rounding moved, for nothing, on each later chunk."""
    if prefer is None:
        return INPUT_PRECISIONS
    return (prefer, *(precision for precision in INPUT_PRECISIONS if precision != prefer))


def reproduce_chunk(x: np.ndarray, raw: np.ndarray, info: TensorInfo, tie_ulps: int,
                    weights: np.ndarray | None, sample: np.ndarray | None = None,
                    prefer: str | None = None) -> ChunkReproduction:
    """Re-quantize source rows `x` (at each input precision, `prefer` first) and count the blocks that differ
    from `raw`; with `sample` ([block] bools over the chunk), only the sampled blocks. Of precisions that
    differ in as few blocks, the first tried is named."""
    ggml_type = info.ggml_type
    raw_blocks = raw.reshape(-1, ggml_type.type_size)
    picks = None if sample is None else np.nonzero(sample)[0]
    compared = raw_blocks.shape[0] if picks is None else int(picks.size)
    best: tuple[str, np.ndarray, np.ndarray] | None = None
    first: tuple[np.ndarray, np.ndarray] | None = None  # the first precision's input and blocks, when reusable
    for precision in precision_order(prefer):
        candidate_input = round_input(x, precision)
        if picks is None:
            ours = _requantized(candidate_input, info, weights, first)
            if first is None and weights is None and ggml_type.name in BLOCKWISE_TYPES:
                first = (candidate_input, ours)
            differing = np.nonzero((ours != raw_blocks).any(axis=1))[0]
        else:
            ours = _quantize_blocks(candidate_input, info, weights, picks)
            differing = picks[(ours != raw_blocks[picks]).any(axis=1)]
        if best is None or differing.size < best[2].size:
            best = (precision, candidate_input, differing)
        if differing.size == 0:
            break
    assert best is not None
    precision, candidate_input, differing = best
    if differing.size > TIE_SEARCH_MAX_FRACTION * compared + 1:
        return ChunkReproduction(precision, int(differing.size), 0, compared)
    blocks_per_row = raw.shape[1] // ggml_type.type_size
    ties = 0
    for index in differing:
        row, block = divmod(int(index), blocks_per_row)
        ties += _is_rounding_tie(candidate_input[row], raw[row], info, tie_ulps, weights, block)
    return ChunkReproduction(precision, int(differing.size) - ties, ties, compared)
