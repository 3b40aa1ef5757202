"""Per-type bounds on |w - w_hat|, each derived from how that type's reference quantizer picks codes.

Two families, both read from the stored block (scales, min) with gguf-py, never from the writer:

* `BOUND_RULES` (legacy block-32 types): a closed form in the block's fp16 scale `d` (and min `m`).
* `NEAREST_CODE` (K-quants, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4): the quantizer gives every element
  the code whose value is nearest to it under the block's scales, so |w - w_hat| is at most the
  distance from w to the nearest value the block can represent, plus the part of that distance
  that the scale's rounding can move. The representable values are read by dequantizing copies of
  the stored block with every element's code set to each possible code (`_fill_codes`).

The vector-codebook types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) pick 4- or
8-element grid points with an importance-weighted fit, so the nearest-code argument does not apply;
their bound (signs and a magnitude cap, `grid_bounds`) follows from the fit's construction instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.formats.ggml_types import GGMLType
from engine.quant.grid_bounds import GRID_RULES, grid_bounds, grid_description

HALF_ULP_F16 = 2.0**-11  # relative rounding error of an fp16 scale
F16_SUBNORMAL_HALF_ULP = 2.0**-25
FLOAT_SLACK = 2.0**-20  # float32 arithmetic in the quantizer's own division and the reader's product

# Per-type bound on |w - w_hat| for one element, derived from each type's reference quantizer:
# (coefficient of |d|, max |code offset| multiplying the fp16 rounding of d, has a min term).
# Q8_0: q = round(x/d), d = amax/127, so |err| <= d/2 plus 127 fp16 half-ulps of d (~0.562 d).
# Q4_0/Q5_0: d = max/-8 (or -16) and the largest positive value is clamped to 7 (15): up to 1 d.
# Q4_1/Q5_1: d = (max-min)/15 (31), rounding to nearest: d/2, plus rounding of d and of min.
BOUND_RULES: dict[str, tuple[float, int, bool]] = {
    "Q8_0": (0.5, 127, False),
    "Q4_0": (1.0, 8, False),
    "Q5_0": (1.0, 16, False),
    "Q4_1": (0.5, 15, True),
    "Q5_1": (0.5, 31, True),
}


@dataclass(frozen=True)
class CodeLayout:
    """Where a block's per-element codes live: `fields` are (byte offset, length, code -> byte value)."""

    codes: tuple[int, ...]
    fields: tuple[tuple[int, int, tuple[int, ...]], ...]
    scale_rounded: bool  # codes chosen with the unrounded scale, then the scale stored as fp16


def _spread(bits: int, code_values: range, shift: int = 0) -> tuple[int, ...]:
    """Byte value that gives every `bits`-wide code in a byte the code's bits at `shift`."""
    per_byte = 8 // bits
    return tuple(sum((((code >> shift) & ((1 << bits) - 1)) << (bits * i)) for i in range(per_byte))
                 for code in code_values)


def _mask(bit: int, code_values: range) -> tuple[int, ...]:
    return tuple(0xFF if (code >> bit) & 1 else 0 for code in code_values)


# Each derivation (vendor/llama.cpp/ggml/src/ggml-quants.c):
# Q2_K/Q4_K/Q5_K: after storing d, dmin and the 4/6-bit sub-scales, quantize_row_*_K_ref and _impl
#   recompute l = nearest_int((x + dm)/d) with the *stored* d*sc and dmin*m, clamped to the code
#   range, so w_hat is the nearest representable value (clamping included): slack is float error.
# Q3_K/Q6_K: likewise l = nearest_int(x/(d*sc)) with the stored scales, clamped to [-4,3] / [-32,31].
# IQ4_NL: codes are best_index_int8(kvalues, x/d) with the unrounded least-squares d, which is then
#   stored as fp16: nearest under d, so |err| <= dist(x, grid(d_fp16)) + 2*max|v|*|d - d_fp16|.
# IQ4_XS: codes are best_index_int8(kvalues, x/(d*l)) with the unrounded super-scale d and the
#   stored 6-bit l: the same rounding slack, through d.
# TQ1_0/TQ2_0: d = amax, code = lroundf(x/d) in {-1, 0, 1}, d stored as fp16: nearest under d.
# MXFP4: d = 2^(floor(log2 amax) - 2) exactly (e8m0, no rounding); code = argmin |kvalues*d - x|.
_K = range(16)
NEAREST_CODE: dict[str, CodeLayout] = {
    "Q2_K": CodeLayout(tuple(range(4)), ((16, 64, _spread(2, range(4))),), False),
    "Q3_K": CodeLayout(tuple(range(8)), ((32, 64, _spread(2, range(8))), (0, 32, _mask(2, range(8)))), False),
    "Q4_K": CodeLayout(tuple(_K), ((16, 128, _spread(4, _K)),), False),
    "Q5_K": CodeLayout(tuple(range(32)), ((48, 128, _spread(4, range(32))), (16, 32, _mask(4, range(32)))),
                       False),
    "Q6_K": CodeLayout(tuple(range(64)), ((0, 128, _spread(4, range(64))), (128, 64, _spread(2, range(64), 4))),
                       False),
    "IQ4_NL": CodeLayout(tuple(_K), ((2, 16, _spread(4, _K)),), True),
    "IQ4_XS": CodeLayout(tuple(_K), ((8, 128, _spread(4, _K)),), True),
    # ternary codes 0,1,2 (-1,0,+1); 5 trits per qs byte and 4 (+1 padding trit) per qh byte, each
    # stored as ceil(q * 256 / 243): all-equal trits k give q = 121k (qs) and 120k (qh).
    "TQ1_0": CodeLayout((0, 1, 2), ((0, 48, (0, 128, 255)), (48, 4, (0, 127, 253))), True),
    "TQ2_0": CodeLayout((0, 1, 2), ((0, 64, _spread(2, range(3))),), True),
    "MXFP4": CodeLayout(tuple(_K), ((1, 16, _spread(4, _K)),), False),
}


# When the fp16 scale is subnormal (|d| < 2^-14, common for IQ4_XS's super-scale, d = max_scale/32 of
# weights ~0.02), its rounding error is up to 2^-25 absolute, not 2^-11 relative: the value of a code
# then moves by up to 2^-25 times the largest |code value * sub-scale| the type has (127 for IQ4_NL's
# kvalues, 127 * 32 for IQ4_XS's 6-bit signed sub-scales, 1 for the ternary types).
SUBNORMAL_SCALE_MULTIPLIER: dict[str, int] = {"IQ4_NL": 127, "IQ4_XS": 127 * 32, "TQ1_0": 1, "TQ2_0": 1}


def _dequantize(raw_blocks: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    return gguf_quants.dequantize(raw_blocks, GGMLQuantizationType(ggml_type.id)).reshape(raw_blocks.shape[0], -1)


def representable(raw_blocks: np.ndarray, ggml_type: GGMLType, code_index: int) -> np.ndarray:
    """[block, element]: the value each element reads as with its code set to the `code_index`-th code."""
    filled = raw_blocks.copy()
    for offset, length, byte_for_code in NEAREST_CODE[ggml_type.name].fields:
        filled[:, offset:offset + length] = byte_for_code[code_index]
    return _dequantize(filled, ggml_type).astype(np.float64)


def _nearest_code_bounds(raw_rows: np.ndarray, ggml_type: GGMLType, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """One bound per candidate input: the block's representable values are read once for all of them."""
    layout = NEAREST_CODE[ggml_type.name]
    blocks = np.ascontiguousarray(raw_rows).reshape(-1, ggml_type.type_size)
    values = [x.astype(np.float64).reshape(blocks.shape[0], -1) for x in inputs]
    distances = [np.full(v.shape, np.inf) for v in values]
    reach = np.zeros((blocks.shape[0], 1))  # max |v| * |d| per block
    for index in range(len(layout.codes)):
        table = representable(blocks, ggml_type, index)
        for value, distance in zip(values, distances, strict=True):
            np.minimum(distance, np.abs(table - value), out=distance)
        np.maximum(reach, np.abs(table).max(axis=1, keepdims=True), out=reach)
    rounding = 2 * HALF_ULP_F16 * (1 + HALF_ULP_F16) if layout.scale_rounded else 0.0
    subnormal = 2 * SUBNORMAL_SCALE_MULTIPLIER.get(ggml_type.name, 0) * F16_SUBNORMAL_HALF_ULP
    return [(distance + reach * (rounding + FLOAT_SLACK) + np.abs(value) * FLOAT_SLACK
             + F16_SUBNORMAL_HALF_ULP + subnormal).reshape(x.shape)
            for value, distance, x in zip(values, distances, inputs, strict=True)]


def _closed_form_bound(raw_rows: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    coeff, max_code, has_min = BOUND_RULES[ggml_type.name]
    blocks = np.asarray(raw_rows).reshape(-1, ggml_type.type_size)
    d = np.abs(blocks[:, 0:2].copy().view("<f2").astype(np.float64)[:, 0])
    bound = d * (coeff * (1 + HALF_ULP_F16) + max_code * HALF_ULP_F16) + max_code * F16_SUBNORMAL_HALF_ULP
    if has_min:
        m = np.abs(blocks[:, 2:4].copy().view("<f2").astype(np.float64)[:, 0])
        bound += m * HALF_ULP_F16 + F16_SUBNORMAL_HALF_ULP
    rows = np.asarray(raw_rows).shape[0]
    return np.repeat(bound, ggml_type.block_size).reshape(rows, -1)


def has_bound(ggml_type: GGMLType) -> bool:
    return ggml_type.name in BOUND_RULES or ggml_type.name in NEAREST_CODE or ggml_type.name in GRID_RULES


def error_bounds(raw_rows: np.ndarray, ggml_type: GGMLType, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """Per-element |w - w_hat| bounds for each candidate quantizer input (source rows `x` at one precision)
    stored as `raw_rows`, or None if the type has no rule."""
    if ggml_type.name in BOUND_RULES:
        return [_closed_form_bound(raw_rows, ggml_type)] * len(inputs)
    if ggml_type.name in NEAREST_CODE:
        return _nearest_code_bounds(raw_rows, ggml_type, inputs)
    if ggml_type.name in GRID_RULES:
        return grid_bounds(raw_rows, ggml_type, inputs)
    return None


def error_bound(raw_rows: np.ndarray, ggml_type: GGMLType, x: np.ndarray) -> np.ndarray | None:
    """Per-element |w - w_hat| bound for source rows `x` stored as `raw_rows`, or None if no rule."""
    found = error_bounds(raw_rows, ggml_type, [x])
    return None if found is None else found[0]


def expensive(ggml_type: GGMLType) -> bool:
    """Whether the bound reads every representable value of every block (skipped where bytes reproduce)."""
    return ggml_type.name in NEAREST_CODE


def bound_description(ggml_type: GGMLType) -> str | None:
    if ggml_type.name in NEAREST_CODE:
        slack = " + 2^-10*max|v*d|" if NEAREST_CODE[ggml_type.name].scale_rounded else ""
        return f"|w - w_hat| <= distance from w to the block's nearest representable value{slack}"
    if ggml_type.name in GRID_RULES:
        return grid_description(ggml_type)
    rule = BOUND_RULES.get(ggml_type.name)
    if rule is None:
        return None
    coeff, max_code, has_min = rule
    text = f"|w - w_hat| <= {coeff}*|d|*(1+2^-11) + {max_code}*2^-11*|d|"
    return text + " + 2^-11*|m|" if has_min else text
