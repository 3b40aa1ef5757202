"""Reference quantizers and dequantizers, by ggml type (the derived bounds are in `bounds`).

Reproduction: the simple block-32 types are re-quantized with gguf-py's numpy quantizers; every
other type, and every type given an importance matrix, with libggml's `ggml_quantize_chunk`.
Dequantization for value statistics uses gguf-py, an implementation independent of the writer
(libggml), and is cross-checked against libggml.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.errors import UnsupportedTypeError
from engine.formats.ggml_types import GGMLType
from engine.quant import libggml

GGUF_PY_REPRODUCED = frozenset({"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"})
LIBGGML_REPRODUCED = frozenset({
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
    "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4",
})
REPRODUCIBLE = GGUF_PY_REPRODUCED | LIBGGML_REPRODUCED
# ggml_quantize_requires_imatrix: libggml refuses to quantize these without quant_weights.
REQUIRES_IMATRIX = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S"})
# quantize_q8_0 / _tq1_0 / _tq2_0 / _mxfp4 ignore quant_weights: an imatrix cannot change their bytes.
WEIGHT_BLIND = frozenset({"Q8_0", "TQ1_0", "TQ2_0", "MXFP4"})


def reproducer_name(ggml_type: GGMLType, weighted: bool = False) -> str | None:
    """Who re-quantizes this type: gguf-py's numpy quantizers, or libggml (always, with quant_weights)."""
    if ggml_type.name in GGUF_PY_REPRODUCED and not weighted:
        return "gguf-py"
    if ggml_type.name in REPRODUCIBLE:
        return "libggml"
    return None


def quantize(values: np.ndarray, ggml_type: GGMLType, *, quant_weights: np.ndarray | None = None) -> np.ndarray:
    """Re-quantize float32 rows the way the writer's quantizer does; uint8 rows out.

    With `quant_weights` (the tensor's importance-matrix row) every type goes through libggml's
    `ggml_quantize_chunk`, as llama-quantize does: the legacy types then take their `_impl` path
    (weighted scale search), which gguf-py's numpy quantizer does not implement.
    """
    rows = np.ascontiguousarray(values, dtype=np.float32)
    if quant_weights is None and ggml_type.name in GGUF_PY_REPRODUCED:
        return gguf_quants.quantize(rows, GGMLQuantizationType(ggml_type.id))
    return libggml.quantize_rows(rows, ggml_type.id, ggml_type.row_bytes(rows.shape[1]),
                                 quant_weights=quant_weights)


def dequantize(raw_rows: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """gguf-py's numpy dequantizer: float32 rows."""
    try:
        qtype = GGMLQuantizationType(ggml_type.id)
        return gguf_quants.dequantize(np.asarray(raw_rows), qtype)
    except (ValueError, NotImplementedError) as exc:
        raise UnsupportedTypeError(f"gguf-py cannot dequantize {ggml_type.name}: {exc}") from exc
