"""Weights as a BF16 checkpoint holds them, widened to float32: the source side of gate 1's reproduction tests."""

from __future__ import annotations

import numpy as np

from engine.gates.storage.reproduction import round_input


def bf16_source(rows: int, cols: int, seed: int, scale: float = 0.02) -> np.ndarray:
    """Normal weights of standard deviation `scale` rounded to BF16: at a trained-like scale, some fall below
    2^-14, where float16 rounding moves them."""
    values = (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)
    return round_input(values, "bf16")
