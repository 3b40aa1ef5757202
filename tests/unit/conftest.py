"""Fixtures shared by the unit tests of gate 1's reproduction."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gates.storage import reproduction


@pytest.fixture
def quantized_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of blocks each call of the reference quantizer from gate 1's reproduction was given."""
    calls: list[int] = []
    quantize = reproduction.reference.quantize

    def counting(values: np.ndarray, ggml_type, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(values.size // ggml_type.block_size)
        return quantize(values, ggml_type, **kwargs)

    monkeypatch.setattr(reproduction.reference, "quantize", counting)
    return calls
