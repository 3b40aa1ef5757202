"""Gate 1, one tensor: compare stored GGUF data against its (transformed) source, chunk by chunk.

Floats are compared as bit patterns: F32 against the source, F16/BF16 against our own cast of the
source. Quantized tensors are re-quantized from the source and compared byte for byte; a differing
block is forgiven only when nudging the differing source values by at most `policy.tie_ulps`
ulps reproduces the stored bytes (a rounding tie that FMA contraction can flip). Dequantized
values (gguf-py) give max-abs / relative-L2 / finiteness statistics and the per-type bound.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from worker.blockers import Blocker
from worker.errors import UnsupportedTypeError
from worker.formats.ggml_types import UNCHECKED_TYPES
from worker.formats.gguf_structure import TensorInfo
from worker.gates.architectures import RowTransform, TensorSource
from worker.policy import Policy
from worker.quant import libggml, reference
from worker.report import TensorRow

CHUNK_ELEMENTS = 1 << 22
INPUT_PRECISIONS = ("f32", "f16", "bf16")


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns, NaNs kept quiet."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(is_nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def _round_input(values: np.ndarray, precision: str) -> np.ndarray:
    """The quantizer input a pipeline that converted to `precision` first would have used."""
    if precision == "f16":
        return values.astype(np.float16).astype(np.float32)
    if precision == "bf16":
        return (f32_to_bf16_bits(values).astype(np.uint32) << 16).view(np.float32)
    return values


@dataclass
class _Accumulator:
    """Running statistics over chunks (float64 sums, so long tensors do not lose precision)."""

    sum_sq_diff: float = 0.0
    sum_sq_ref: float = 0.0
    max_abs: float = 0.0
    mismatched: int = 0
    not_finite: int = 0
    signed_zero_flips: int = 0
    ties: int = 0
    bound_violations: int = 0
    precisions: set[str] = field(default_factory=set)

    def add_values(self, expected: np.ndarray, stored: np.ndarray) -> None:
        finite = np.isfinite(expected) & np.isfinite(stored)
        self.not_finite += int((np.isfinite(expected) & ~np.isfinite(stored)).sum())
        diff = expected[finite].astype(np.float64) - stored[finite].astype(np.float64)
        if diff.size:
            self.max_abs = max(self.max_abs, float(np.abs(diff).max()))
        self.sum_sq_diff += float(np.dot(diff, diff))
        ref = expected[finite].astype(np.float64)
        self.sum_sq_ref += float(np.dot(ref, ref))
        zeros = (expected == 0) & (stored == 0)
        self.signed_zero_flips += int((np.signbit(expected[zeros]) != np.signbit(stored[zeros])).sum())

    @property
    def rel_l2(self) -> float:
        if self.sum_sq_ref == 0:
            return 0.0 if self.sum_sq_diff == 0 else float("inf")
        return float(np.sqrt(self.sum_sq_diff / self.sum_sq_ref))


def _float_chunk(acc: _Accumulator, expected: np.ndarray, raw: np.ndarray, type_name: str) -> None:
    if type_name == "F32":
        stored = raw.view("<f4")
        acc.mismatched += int((stored.view(np.uint32) != expected.view(np.uint32)).sum())
    elif type_name == "F16":
        stored_bits = raw.view("<u2")
        acc.mismatched += int((stored_bits != expected.astype(np.float16).view(np.uint16)).sum())
        stored = stored_bits.view(np.float16).astype(np.float32)
    else:  # BF16
        stored_bits = raw.view("<u2")
        acc.mismatched += int((stored_bits != f32_to_bf16_bits(expected)).sum())
        stored = (stored_bits.astype(np.uint32) << 16).view(np.float32)
    acc.add_values(expected, stored)


def _nudge(values: np.ndarray, positions: np.ndarray, toward: np.ndarray, ulps: int) -> np.ndarray:
    nudged = values.copy()
    target = np.where(toward > 0, np.float32(np.inf), np.float32(-np.inf))
    for _ in range(ulps):
        nudged[positions] = np.nextafter(nudged[positions], target)
    return nudged


def _is_rounding_tie(block: np.ndarray, stored: np.ndarray, info: TensorInfo, max_ulps: int) -> bool:
    """True when moving the differing source values <= max_ulps ulps reproduces the stored block."""
    ggml_type = info.ggml_type
    row = block.reshape(1, -1)
    ours = reference.quantize(row, ggml_type)
    theirs_values = reference.dequantize(stored.reshape(1, -1), ggml_type)[0]
    ours_values = reference.dequantize(ours, ggml_type)[0]
    positions = np.nonzero(ours_values != theirs_values)[0]
    if positions.size == 0:
        return False
    toward = np.sign(theirs_values[positions] - ours_values[positions])
    for ulps in range(1, max_ulps + 1):
        candidate = reference.quantize(_nudge(row[0], positions, toward, ulps).reshape(1, -1), ggml_type)
        if np.array_equal(candidate.reshape(-1), stored.reshape(-1)):
            return True
    return False


def _quantized_chunk(acc: _Accumulator, x: np.ndarray, raw: np.ndarray, info: TensorInfo, policy: Policy) -> None:
    ggml_type = info.ggml_type
    stored = reference.dequantize(raw, ggml_type)
    acc.add_values(x, stored)
    bound = reference.error_bound(raw, ggml_type)
    if bound is not None:
        slack = bound * (1 + 1e-6) + 1e-30
        acc.bound_violations += int((np.abs(x.astype(np.float64) - stored) > slack).sum())
    if not policy.reproduce_quantized or reference.reproducer_name(ggml_type) is None:
        return
    raw_blocks = raw.reshape(-1, ggml_type.type_size)
    best: tuple[np.ndarray, np.ndarray] | None = None
    for precision in INPUT_PRECISIONS:
        candidate_input = _round_input(x, precision)
        ours = reference.quantize(candidate_input, ggml_type).reshape(-1, ggml_type.type_size)
        differing = np.nonzero((ours != raw_blocks).any(axis=1))[0]
        if best is None or differing.size < best[1].size:
            best = (candidate_input, differing)
            chosen = precision
        if differing.size == 0:
            break
    assert best is not None
    candidate_input, differing = best
    acc.precisions.add(chosen)
    blocks_in = candidate_input.reshape(-1, ggml_type.block_size)
    for index in differing:
        if _is_rounding_tie(blocks_in[index], raw_blocks[index], info, policy.tie_ulps):
            acc.ties += 1
        else:
            acc.mismatched += 1


def _sample_rows(name: str, n_rows: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    picks = {0, n_rows - 1, *rng.integers(0, n_rows, size=max(count - 2, 0)).tolist()}
    return np.array(sorted(picks))


def readers_agree(raw_rows: np.ndarray, info: TensorInfo, n_rows: int, samples: int) -> bool:
    """gguf-py and libggml must dequantize sampled rows to identical bits."""
    rows = _sample_rows(info.name, n_rows, samples)
    sample = np.ascontiguousarray(raw_rows[rows])
    ours = reference.dequantize(sample, info.ggml_type).reshape(-1)
    theirs = libggml.dequantize(sample.reshape(-1), info.ggml_type.id, ours.size)
    return bool(np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)))


def check_kind(info: TensorInfo, policy: Policy) -> str:
    if not info.ggml_type.quantized:
        return "bit-exact"
    if policy.reproduce_quantized and reference.reproducer_name(info.ggml_type):
        return "reproduced"
    return "bounded"


def _compare(raw_rows: np.ndarray, info: TensorInfo, source: TensorSource, transform: RowTransform | None,
             policy: Policy) -> _Accumulator:
    """Stream the tensor in row chunks (source rows reordered by the transform) into one accumulator."""
    acc = _Accumulator()
    source_rows = source.as_rows()
    n_rows = raw_rows.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(info.shape[0], 1))
    for start in range(0, n_rows, step):
        stop = min(start + step, n_rows)
        selection = transform.order[start:stop] if transform else slice(start, stop)
        x = source.widen(source_rows[selection])
        chunk = np.ascontiguousarray(raw_rows[start:stop])
        if info.ggml_type.quantized:
            _quantized_chunk(acc, x, chunk, info, policy)
        else:
            _float_chunk(acc, x, chunk, info.ggml_type.name)
    return acc


def _judge(acc: _Accumulator, info: TensorInfo, check: str, crosscheck: str | None) -> list[Blocker]:
    """The blockers one tensor's measurements call for."""
    name = info.ggml_type.name
    found: list[tuple[str, str]] = []
    if crosscheck == "disagree":
        found.append(("verifier.reader_disagreement", f"gguf-py and libggml dequantize {info.name} differently"))
    if acc.not_finite:
        found.append(("tensor.not_finite", f"{acc.not_finite} stored values are NaN/inf where the source is finite"))
    if check == "reproduced" and acc.mismatched:
        found.append(("tensor.reproduction_mismatch",
                      f"{acc.mismatched} {name} blocks differ from the reference re-quantization "
                      f"({acc.ties} rounding ties forgiven); max-abs {acc.max_abs:.3g}"))
    elif check == "bit-exact" and acc.mismatched:
        found.append(("tensor.value_mismatch", f"{acc.mismatched} values differ bitwise; max-abs {acc.max_abs:.3g}"))
    elif check == "bounded" and reference.bound_description(info.ggml_type) is None:
        found.append(("tensor.type_unsupported", f"no reproducer or derived bound for {name}"))
    elif check == "bounded" and acc.bound_violations:
        found.append(("tensor.value_mismatch", f"{acc.bound_violations} values exceed the {name} bound"))
    return [Blocker(code=code, gate="storage", why=why, tensor=info.name) for code, why in found]


def check_tensor(
    file_bytes: np.ndarray,
    info: TensorInfo,
    source: TensorSource,
    transform: RowTransform | None,
    policy: Policy,
) -> tuple[TensorRow, list[Blocker]]:
    """Compare one GGUF tensor with its source; returns its report row and any blockers."""
    ggml_type = info.ggml_type
    if ggml_type.name in UNCHECKED_TYPES:
        raise UnsupportedTypeError(f"{info.name} is stored as {ggml_type.name}; no check exists for that type")
    row_len = info.shape[0]
    n_rows = info.n_elements // row_len if row_len else 0
    raw_rows = file_bytes[info.offset : info.offset + info.nbytes].reshape(n_rows, ggml_type.row_bytes(row_len))
    acc = _compare(raw_rows, info, source, transform, policy)
    check = check_kind(info, policy)
    crosscheck = None
    if ggml_type.quantized:
        agree = readers_agree(raw_rows, info, n_rows, policy.reader_crosscheck_rows)
        crosscheck = "agree" if agree else "disagree"
    blockers = _judge(acc, info, check, crosscheck)
    bound = reference.bound_description(ggml_type) if ggml_type.quantized else None
    row = TensorRow(
        gguf_name=info.name, source_names=[source.name], transform=transform.name if transform else None,
        gguf_type=ggml_type.name, source_dtype=source.dtype, shape=list(info.numpy_shape), check=check,
        reproducer=reference.reproducer_name(ggml_type) if check == "reproduced" else None,
        input_precision=",".join(sorted(acc.precisions)) or None, max_abs=acc.max_abs, rel_l2=acc.rel_l2,
        mismatched=acc.mismatched, ties_forgiven=acc.ties, not_finite=acc.not_finite,
        signed_zero_flips=acc.signed_zero_flips, bound=bound,
        bound_violations=acc.bound_violations if bound else None, reader_crosscheck=crosscheck,
        result="fail" if blockers else "ok",
    )
    return row, blockers
