"""ctypes access to libggml's reference quantizer and dequantizer, as shipped by llama-cpp-python.

Used for two things only: reproducing K-quant bytes (the reference quantizer the writer used)
and cross-checking gguf-py's dequantizer on sampled blocks. The library is located without
importing `llama_cpp` (which would load the whole runtime).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import numpy as np

from engine.errors import ReferenceMissingError


class _TypeTraits(ctypes.Structure):
    # struct ggml_type_traits in ggml.h
    _fields_ = (
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    )


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


def _library_path() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise ReferenceMissingError("llama-cpp-python is not installed, so libggml is unavailable")
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        candidate = Path(spec.origin).parent / "lib" / name
        if candidate.exists():
            return candidate
    raise ReferenceMissingError("llama-cpp-python ships no libggml-base library")


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_library_path()))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = (
        ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_float),
    )
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.ggml_get_type_traits.argtypes = (ctypes.c_int,)
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = (ctypes.c_int,)
    return lib


def available() -> bool:
    try:
        _lib()
    except (ReferenceMissingError, OSError):
        return False
    return True


def requires_imatrix(type_id: int) -> bool:
    """libggml refuses to quantize these types without an importance matrix (`quant_weights`)."""
    return bool(_lib().ggml_quantize_requires_imatrix(type_id))


def quantize_rows(values: np.ndarray, type_id: int, row_bytes: int, *,
                  quant_weights: np.ndarray | None = None) -> np.ndarray:
    """Quantize a 2-D float32 array row by row with `ggml_quantize_chunk`, the call llama-quantize makes.

    `quant_weights` (one importance weight per column, `n_per_row` float32) is the importance
    matrix llama-quantize passes for the tensor; without it the type's reference path runs.
    """
    lib = _lib()
    src = np.ascontiguousarray(values, dtype=np.float32)
    rows, n_per_row = src.shape
    weights_ptr = None
    if quant_weights is not None:
        weights = np.ascontiguousarray(quant_weights, dtype=np.float32)
        if weights.shape != (n_per_row,):
            raise ValueError(f"quant_weights has shape {weights.shape}, expected ({n_per_row},)")
        weights_ptr = weights.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    elif lib.ggml_quantize_requires_imatrix(type_id):
        raise ReferenceMissingError(f"ggml type {type_id} cannot be quantized without an importance matrix")
    out = np.empty((rows, row_bytes), dtype=np.uint8)
    written = lib.ggml_quantize_chunk(
        type_id, src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data_as(ctypes.c_void_p),
        0, rows, n_per_row, weights_ptr,
    )
    if written != out.nbytes:
        raise ReferenceMissingError(f"ggml_quantize_chunk wrote {written} bytes, expected {out.nbytes}")
    return out


def dequantize(raw: np.ndarray, type_id: int, n_elements: int) -> np.ndarray:
    """Dequantize `n_elements` values from `raw` bytes with libggml's own `to_float`."""
    traits = _lib().ggml_get_type_traits(type_id).contents
    if not traits.to_float:
        raise ReferenceMissingError(f"libggml has no dequantizer for type {type_id}")
    src = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(n_elements, dtype=np.float32)
    _TO_FLOAT(traits.to_float)(
        src.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n_elements
    )
    return out
