"""Gate 2's artifact reference widens F16 and BF16 weights with torch (`_widened`, twice numpy's speed on the
half-7B's weights): every one of the 65,536 stored values decodes to what numpy's widening gives, bit for bit
(a NaN to a NaN), whether the bytes are a mapped file's (read-only) or a copy."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.runtime.artifact_weights import _decoded

EVERY_PATTERN = np.arange(1 << 16, dtype="<u2").view(np.uint8)


def _numpy(raw: np.ndarray, name: str) -> np.ndarray:
    if name == "F16":
        return raw.view("<f2").astype(np.float32)
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_every_stored_value_widens_as_numpy_widens_it(name: str, tmp_path: Path) -> None:
    path = tmp_path / "bytes"
    path.write_bytes(EVERY_PATTERN.tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    info = TensorInfo(name="w", shape=(1 << 16,), ggml_type=GGML_TYPES_BY_NAME[name], offset=0, nbytes=1 << 17)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing leaks a warning about the read-only mapping
        got = _decoded(mapped, info)
    want = _numpy(EVERY_PATTERN, name)
    assert got.dtype == np.float32 and got.shape == want.shape
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    assert np.isnan(got[~finite]).all()
    assert np.array_equal(np.asarray(mapped), EVERY_PATTERN)  # the stored bytes were only read
