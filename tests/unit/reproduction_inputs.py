"""Sources and stored chunks for the unit tests of gate 1's reproduction."""

from __future__ import annotations

import numpy as np

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.gates.storage.reproduction import round_input
from engine.quant import reference

Q8_0 = GGML_TYPES_BY_NAME["Q8_0"]
TIE_CODE = 34 + 2 + 1  # in row 1: block 1 (34 bytes a block), past its fp16 scale, the second value's code


def bf16_source(rows: int, cols: int, seed: int, scale: float = 0.02) -> np.ndarray:
    """Weights as a BF16 checkpoint holds them, widened to float32: normal, of standard deviation `scale`; at
    a trained-like scale some fall below 2^-14, where float16 rounding moves them."""
    values = (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)
    return round_input(values, "bf16")


def q8_chunk(seed: int, tie: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """4 rows of 256 values and their Q8_0 bytes (32 blocks). With `tie`, block 1 of row 1 holds 127 and 2.5
    (d = 1, so 2.5 sits exactly on a rounding tie) and stores the 2.5 rounded the other way: 2, not 3."""
    rows = np.random.default_rng(seed).uniform(-100, 100, (4, 256)).astype(np.float32)
    if tie:
        rows[1, 32:64] = 0.0
        rows[1, 32], rows[1, 33] = 127.0, 2.5
    raw = reference.quantize(rows, Q8_0).reshape(4, -1).copy()
    if tie:
        assert raw[1].view(np.int8)[TIE_CODE] == 3
        raw[1].view(np.int8)[TIE_CODE] = 2
    return rows, raw
