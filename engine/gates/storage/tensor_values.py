"""Gate 1, one tensor: compare stored GGUF data against its (transformed) source, chunk by chunk.

Floats are compared as bit patterns: F32 against the source, F16/BF16 against our own cast of the
source. Quantized tensors are re-quantized from the source (with the tensor's importance-matrix
row when one is given) and compared byte for byte (`reproduction`). Dequantized values (gguf-py)
give max-abs / relative-L2 / finiteness statistics and the per-type bound, checked against the
input precision (f32/f16/bf16) the writer's quantizer saw. A type that cannot be re-quantized
without an importance matrix is reported as not reproduced, never as a mismatch.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from engine.blockers import Blocker
from engine.errors import UnsupportedTypeError
from engine.formats.artifact_files import ArtifactBytes
from engine.formats.ggml_types import UNCHECKED_TYPES
from engine.formats.gguf_structure import TensorInfo
from engine.gates.architectures import RowTransform, TensorSource
from engine.gates.storage.reproduction import INPUT_PRECISIONS, f32_to_bf16_bits, reproduce_chunk, round_input
from engine.policy import Policy
from engine.quant import bounds, libggml, reference
from engine.quant.sampling import block_sample, sampled
from engine.report import TensorRow

__all__ = ["check_kind", "check_tensor", "f32_to_bf16_bits", "readers_agree"]

CHUNK_ELEMENTS = 1 << 22
DENSE_CHANGES = 8  # past 1/8 of a chunk's values changed, its diff is computed whole, not at the changed ones


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
    blocks: int = 0  # blocks compared: every block, or only the sampled ones when reproduction samples
    blocks_total: int = 0
    precisions: set[str] = field(default_factory=set)
    preferred: str | None = None  # the input precision that reproduced the previous chunk, tried first
    violations_by_precision: dict[str, int] = field(default_factory=dict)

    def add_values(self, expected: np.ndarray, stored: np.ndarray) -> None:
        """The chunk's statistics. A float32 chunk whose values are all finite takes `_finite_figures`: the
        same figures, bit for bit, in a few passes instead of a dozen masked float64 copies (those were 53 of
        the 60 CPU seconds of the half-7B F16's gate 1)."""
        with np.errstate(invalid="ignore", over="ignore"):  # a value that is not finite sends it to the masked path
            found = _finite_figures(expected.reshape(-1), stored.reshape(-1)) if (
                expected.dtype == stored.dtype == np.float32) else None
        if found is not None:
            sum_sq_ref, sum_sq_diff, max_abs, flips = found
            self.sum_sq_ref += sum_sq_ref
            self.sum_sq_diff += sum_sq_diff
            self.max_abs = max(self.max_abs, max_abs)
            self.signed_zero_flips += flips
            return
        finite = np.isfinite(expected) & np.isfinite(stored)
        self.not_finite += int((np.isfinite(expected) & ~np.isfinite(stored)).sum())
        diff = expected[finite].astype(np.float64) - stored[finite].astype(np.float64)
        if diff.size:
            self.max_abs = max(self.max_abs, float(np.abs(diff).max()))
        # einsum, not np.dot: BLAS splits a long dot product by its thread count, so the last bits
        # would depend on the pod's CPUs and gate 1's report would differ between pool and single process.
        self.sum_sq_diff += float(np.einsum("i,i->", diff, diff))
        ref = expected[finite].astype(np.float64)
        self.sum_sq_ref += float(np.einsum("i,i->", ref, ref))
        zeros = (expected == 0) & (stored == 0)
        self.signed_zero_flips += int((np.signbit(expected[zeros]) != np.signbit(stored[zeros])).sum())

    @property
    def rel_l2(self) -> float:
        if self.sum_sq_ref == 0:
            return 0.0 if self.sum_sq_diff == 0 else float("inf")
        return float(np.sqrt(self.sum_sq_diff / self.sum_sq_ref))

    @property
    def bound_precision(self) -> str | None:
        """The input precision under which the fewest values exceed the bound (the quantizer's input)."""
        if not self.violations_by_precision:
            return None
        return min(INPUT_PRECISIONS, key=lambda p: self.violations_by_precision.get(p, 1 << 62))

    @property
    def bound_violations(self) -> int:
        precision = self.bound_precision
        return self.violations_by_precision[precision] if precision else 0


def _finite_figures(expected: np.ndarray, stored: np.ndarray) -> tuple[float, float, float, int] | None:
    """(sum of squares of expected, of the diff, max |diff|, signed-zero flips) of two flat float32 chunks, or
    None when a value is not finite (the masked path then counts it). The sums run over the same full-length
    float64 arrays as the masked path (the diff is zero where the bits agree), so rel_l2's last bits do not
    depend on the path. The sums tell finiteness: float32 squares cannot overflow a float64 sum of a chunk,
    so a sum that is not finite holds a value that is not. Equal values whose bits differ are +0 and -0."""
    ref = expected.astype(np.float64)
    sum_sq_ref = float(np.einsum("i,i->", ref, ref))
    if not math.isfinite(sum_sq_ref):
        return None
    differ = expected.view(np.uint32) != stored.view(np.uint32)
    count = int(np.count_nonzero(differ))
    if not count:
        return sum_sq_ref, 0.0, 0.0, 0
    if count > expected.size // DENSE_CHANGES:  # a quantized chunk: nearly every value moved
        diff = ref - stored.astype(np.float64)
        moved = diff
    else:
        changed = np.flatnonzero(differ)
        diff = np.zeros(expected.size, dtype=np.float64)
        diff[changed] = ref[changed] - stored[changed].astype(np.float64)
        moved = diff[changed]
    sum_sq_diff = float(np.einsum("i,i->", diff, diff))  # einsum: see the masked path
    if not math.isfinite(sum_sq_diff):
        return None
    return sum_sq_ref, sum_sq_diff, float(np.abs(moved).max()), count - int(np.count_nonzero(moved))


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


def _bound_chunk(acc: _Accumulator, x: np.ndarray, raw: np.ndarray, stored: np.ndarray, info: TensorInfo) -> None:
    """Count bound violations under every input precision the writer may have quantized from."""
    inputs = [round_input(x, precision) for precision in INPUT_PRECISIONS]
    found = bounds.error_bounds(raw, info.ggml_type, inputs)
    if found is None:
        return
    for precision, quantizer_input, bound in zip(INPUT_PRECISIONS, inputs, found, strict=True):
        slack = bound * (1 + 1e-6) + 1e-30
        over = int((np.abs(quantizer_input.astype(np.float64) - stored) > slack).sum())
        acc.violations_by_precision[precision] = acc.violations_by_precision.get(precision, 0) + over


def _quantized_chunk(acc: _Accumulator, x: np.ndarray, raw: np.ndarray, info: TensorInfo, policy: Policy,
                     weights: np.ndarray | None, sample: np.ndarray | None = None) -> None:
    """Reproduce first; the bound is checked wherever the bytes are not the reference quantizer's own. A
    chunk reproduced whole *is* that quantizer's output from the source, so no bound on its error can tell
    anything more (the cheap bounds cost 10x the reproduction of a Q8_0 chunk). A sampled chunk compared
    only some blocks: there the cheap bound still reads every value, the costly nearest-code one (every
    representable value of every block) does not."""
    ggml_type = info.ggml_type
    stored = reference.dequantize(raw, ggml_type)
    acc.add_values(x, stored)
    acc.blocks_total += raw.size // ggml_type.type_size
    reproduced = False
    if check_kind(info, policy, weights is not None) != "reproduced":
        acc.blocks += raw.size // ggml_type.type_size
    else:
        outcome = reproduce_chunk(x, raw, info, policy.tie_ulps, weights, sample, acc.preferred)
        acc.blocks += outcome.compared
        acc.precisions.add(outcome.precision)
        acc.preferred = outcome.precision
        acc.mismatched += outcome.mismatched
        acc.ties += outcome.ties
        reproduced = outcome.mismatched == 0 and outcome.ties == 0
    if not (reproduced and (sample is None or bounds.expensive(ggml_type))):
        _bound_chunk(acc, x, raw, stored, info)


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


def check_kind(info: TensorInfo, policy: Policy, weighted: bool = False) -> str:
    """bit-exact (floats), reproduced (re-quantized byte for byte) or bounded (per-type bound only)."""
    ggml_type = info.ggml_type
    if not ggml_type.quantized:
        return "bit-exact"
    if not policy.reproduce_quantized or reference.reproducer_name(ggml_type, weighted) is None:
        return "bounded"
    return "reproduced" if weighted or ggml_type.name not in reference.REQUIRES_IMATRIX else "bounded"


def not_reproduced_reason(info: TensorInfo, policy: Policy, weighted: bool) -> str | None:
    """Why a tensor the policy wants reproduced could not be: its type needs an importance matrix."""
    if policy.reproduce_quantized and not weighted and info.ggml_type.name in reference.REQUIRES_IMATRIX:
        return (f"{info.ggml_type.name} is only written with an importance matrix; supply the imatrix "
                "(--imatrix) to reproduce it")
    return None


def _matrix_weights(quant_weights: np.ndarray | None, info: TensorInfo, n_rows: int) -> tuple[int, np.ndarray | None]:
    """(rows per matrix, [matrix, column] weights): one weight row per leading matrix (MoE experts)."""
    rows_per_matrix = info.shape[1] if len(info.shape) > 2 else max(n_rows, 1)
    if quant_weights is None:
        return rows_per_matrix, None
    weights = np.asarray(quant_weights, dtype=np.float32)
    n_matrices = max(n_rows // rows_per_matrix, 1)
    if weights.ndim == 1:
        weights = np.broadcast_to(weights, (n_matrices, weights.shape[0]))
    if weights.shape != (n_matrices, info.shape[0]):
        raise ValueError(f"quant_weights for {info.name} have shape {np.shape(quant_weights)}, expected "
                         f"({info.shape[0]},) or ({n_matrices}, {info.shape[0]})")
    return rows_per_matrix, weights


def _compare(raw_rows: np.ndarray, info: TensorInfo, source: TensorSource, transform: RowTransform | None,
             policy: Policy, quant_weights: np.ndarray | None = None, sample: np.ndarray | None = None) -> _Accumulator:
    """Stream the tensor in row chunks (source rows reordered by the transform) into one accumulator.

    Chunks never cross a matrix boundary, so each is quantized with its own matrix's weights.
    """
    acc = _Accumulator()
    source_rows = source.as_rows()
    n_rows = raw_rows.shape[0]
    rows_per_matrix, weights = _matrix_weights(quant_weights, info, n_rows)
    step = max(1, CHUNK_ELEMENTS // max(info.shape[0], 1))
    blocks_per_row = info.shape[0] // info.ggml_type.block_size if info.ggml_type.quantized else 0
    for matrix_start in range(0, n_rows, rows_per_matrix):
        matrix_stop = min(matrix_start + rows_per_matrix, n_rows)
        matrix_weights = None if weights is None else weights[matrix_start // rows_per_matrix]
        for start in range(matrix_start, matrix_stop, step):
            stop = min(start + step, matrix_stop)
            selection = transform.order[start:stop] if transform else slice(start, stop)
            x = source.widen(source_rows[selection])
            chunk = np.ascontiguousarray(raw_rows[start:stop])
            if info.ggml_type.quantized:
                chunk_sample = None if sample is None else sample[start * blocks_per_row:stop * blocks_per_row]
                _quantized_chunk(acc, x, chunk, info, policy, matrix_weights, chunk_sample)
            else:
                _float_chunk(acc, x, chunk, info.ggml_type.name)
    return acc


def _judge(acc: _Accumulator, info: TensorInfo, check: str, crosscheck: str | None,
           unreproduced: str | None) -> list[Blocker]:
    """The blockers one tensor's measurements call for."""
    name = info.ggml_type.name
    found: list[tuple[str, str]] = []
    if crosscheck == "disagree":
        found.append(("verifier.reader_disagreement", f"gguf-py and libggml dequantize {info.name} differently"))
    if acc.not_finite:
        found.append(("tensor.not_finite", f"{acc.not_finite} stored values are NaN/inf where the source is finite"))
    if check == "reproduced" and acc.mismatched:
        found.append(("tensor.reproduction_mismatch",
                      f"{acc.mismatched} of {acc.blocks} {name} blocks differ from the reference re-quantization "
                      f"({acc.ties} rounding ties forgiven); max-abs {acc.max_abs:.3g}"))
    elif check == "bit-exact" and acc.mismatched:
        found.append(("tensor.value_mismatch", f"{acc.mismatched} values differ bitwise; max-abs {acc.max_abs:.3g}"))
    if check != "bit-exact" and acc.bound_violations:
        found.append(("tensor.value_mismatch", f"{acc.bound_violations} values exceed the {name} bound "
                                               f"(input precision {acc.bound_precision})"))
    elif check == "bounded" and not bounds.has_bound(info.ggml_type):
        found.append(("tensor.type_unsupported", f"no reproducer or derived bound for {name}"))
    if unreproduced:
        found.append(("tensor.not_reproduced", unreproduced))
    return [Blocker(code=code, gate="storage", why=why, tensor=info.name) for code, why in found]


def check_tensor(
    file_bytes: ArtifactBytes,
    info: TensorInfo,
    source: TensorSource,
    transform: RowTransform | None,
    policy: Policy,
    *,
    quant_weights: np.ndarray | None = None,
    sample_seed: str | None = None,
) -> tuple[TensorRow, list[Blocker]]:
    """Compare one GGUF tensor with its source; returns its report row and any blockers.

    `quant_weights` is the tensor's importance-matrix data: one weight per column, either 1-D (every
    row) or 2-D with one row per leading matrix of a >2-D tensor (MoE experts [n_expert, rows, cols]).
    """
    ggml_type = info.ggml_type
    if ggml_type.name in UNCHECKED_TYPES:
        raise UnsupportedTypeError(f"{info.name} is stored as {ggml_type.name}; no check exists for that type")
    row_len = info.shape[0]
    n_rows = info.n_elements // row_len if row_len else 0
    raw_rows = file_bytes[info.offset : info.offset + info.nbytes].reshape(n_rows, ggml_type.row_bytes(row_len))
    weighted = quant_weights is not None and ggml_type.quantized
    check = check_kind(info, policy, weighted)
    sample = None
    if check == "reproduced" and sample_seed is not None and sampled(ggml_type.name, policy.reproduce_sample):
        sample = block_sample(sample_seed, info.name, n_rows * (row_len // ggml_type.block_size),
                              policy.reproduce_sample)
    acc = _compare(raw_rows, info, source, transform, policy, quant_weights if weighted else None, sample)
    crosscheck = None
    if ggml_type.quantized:
        agree = readers_agree(raw_rows, info, n_rows, policy.reader_crosscheck_rows)
        crosscheck = "agree" if agree else "disagree"
    unreproduced = not_reproduced_reason(info, policy, weighted) if ggml_type.quantized else None
    blockers = _judge(acc, info, check, crosscheck, unreproduced)
    bound = bounds.bound_description(ggml_type) if ggml_type.quantized else None
    row = TensorRow(
        gguf_name=info.name, source_names=[source.name], transform=transform.name if transform else None,
        gguf_type=ggml_type.name, source_dtype=source.dtype, shape=list(info.numpy_shape), check=check,
        reproducer=reference.reproducer_name(ggml_type, weighted) if check == "reproduced" else None,
        input_precision=",".join(sorted(acc.precisions)) or acc.bound_precision, max_abs=acc.max_abs,
        rel_l2=acc.rel_l2, mismatched=acc.mismatched, ties_forgiven=acc.ties, not_finite=acc.not_finite,
        signed_zero_flips=acc.signed_zero_flips, bound=bound,
        bound_violations=acc.bound_violations if bound else None, reader_crosscheck=crosscheck,
        blocks=acc.blocks if ggml_type.quantized else None, not_reproduced=unreproduced,
        sampled_from=acc.blocks_total if sample is not None else None,
        data_sha256=hashlib.sha256(raw_rows.data).hexdigest(),  # one pass over bytes the checks just paged in
        result="fail" if blockers else "ok",
    )
    return row, blockers
