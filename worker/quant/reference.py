"""Reference quantizers, dequantizers and derived error bounds, by ggml type.

Reproduction: the simple block-32 types are re-quantized with gguf-py's numpy quantizers; the
K-quants with libggml's reference quantizer. Dequantization for value statistics uses gguf-py,
an implementation independent of the writer (libggml), and is cross-checked against libggml.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from worker.errors import UnsupportedTypeError
from worker.formats.ggml_types import GGMLType
from worker.quant import libggml

GGUF_PY_REPRODUCED = frozenset({"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"})
LIBGGML_REPRODUCED = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
REPRODUCIBLE = GGUF_PY_REPRODUCED | LIBGGML_REPRODUCED

HALF_ULP_F16 = 2.0**-11  # relative rounding error of an fp16 scale
F16_SUBNORMAL_HALF_ULP = 2.0**-25


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


def reproducer_name(ggml_type: GGMLType) -> str | None:
    if ggml_type.name in GGUF_PY_REPRODUCED:
        return "gguf-py"
    if ggml_type.name in LIBGGML_REPRODUCED:
        return "libggml"
    return None


def quantize(values: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """Re-quantize float32 rows the way the writer's reference quantizer does; uint8 rows out."""
    rows = np.ascontiguousarray(values, dtype=np.float32)
    if ggml_type.name in GGUF_PY_REPRODUCED:
        return gguf_quants.quantize(rows, GGMLQuantizationType(ggml_type.id))
    return libggml.quantize_rows(rows, ggml_type.id, ggml_type.row_bytes(rows.shape[1]))


def dequantize(raw_rows: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """gguf-py's numpy dequantizer: float32 rows."""
    try:
        qtype = GGMLQuantizationType(ggml_type.id)
        return gguf_quants.dequantize(np.asarray(raw_rows), qtype)
    except (ValueError, NotImplementedError) as exc:
        raise UnsupportedTypeError(f"gguf-py cannot dequantize {ggml_type.name}: {exc}") from exc


def error_bound(raw_rows: np.ndarray, ggml_type: GGMLType) -> np.ndarray | None:
    """Per-element |w - w_hat| bound from each block's stored scale (and min), or None if no rule."""
    rule = BOUND_RULES.get(ggml_type.name)
    if rule is None:
        return None
    coeff, max_code, has_min = rule
    blocks = np.asarray(raw_rows).reshape(-1, ggml_type.type_size)
    d = np.abs(blocks[:, 0:2].copy().view("<f2").astype(np.float64)[:, 0])
    bound = d * (coeff * (1 + HALF_ULP_F16) + max_code * HALF_ULP_F16) + max_code * F16_SUBNORMAL_HALF_ULP
    if has_min:
        m = np.abs(blocks[:, 2:4].copy().view("<f2").astype(np.float64)[:, 0])
        bound += m * HALF_ULP_F16 + F16_SUBNORMAL_HALF_ULP
    rows = np.asarray(raw_rows).shape[0]
    per_block = np.repeat(bound, ggml_type.block_size)
    return per_block.reshape(rows, -1)


def bound_description(ggml_type: GGMLType) -> str | None:
    rule = BOUND_RULES.get(ggml_type.name)
    if rule is None:
        return None
    coeff, max_code, has_min = rule
    text = f"|w - w_hat| <= {coeff}*|d|*(1+2^-11) + {max_code}*2^-11*|d|"
    return text + " + 2^-11*|m|" if has_min else text
