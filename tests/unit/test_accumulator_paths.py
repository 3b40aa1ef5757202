"""Gate 1's chunk statistics have two paths (`_Accumulator.add_values`): finite float32 chunks are measured
from their differing bit patterns (four times fewer passes on a bit-exact tensor), anything else through the
masked float64 path. Both must give the same figures to the last bit: rel_l2, max_abs and the flip count are
in the report, and which path a chunk took must not show in it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.gates.storage.tensor_values import DENSE_CHANGES, _Accumulator

FIELDS = ("sum_sq_diff", "sum_sq_ref", "max_abs", "not_finite", "signed_zero_flips")


def _chunk(rng: np.random.Generator, kind: str) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.integers(1, 6000))
    expected = (rng.standard_normal(n) * rng.choice([1e-6, 1.0, 3e4])).astype(np.float32)
    stored = expected.copy()
    picks = rng.integers(0, n, size=int(rng.integers(1, 6)))
    if kind == "ulps":
        stored[picks] = np.nextafter(stored[picks], np.float32(np.inf))
    elif kind == "signed zeros":
        expected[picks], stored[picks] = np.float32(0.0), np.float32(-0.0)
    elif kind == "float16 rounding":
        with np.errstate(over="ignore"):  # past float16's range: infinite, which the masked path counts
            stored = expected.astype(np.float16).astype(np.float32)
    elif kind == "quantized":
        stored = (expected * 4).round() / 4
    elif kind == "not finite":
        stored[picks] = np.where(rng.random(picks.size) < 0.5, np.nan, np.inf).astype(np.float32)
    return expected, stored


@pytest.mark.parametrize("kind", ["identical", "ulps", "signed zeros", "float16 rounding", "quantized",
                                  "not finite"])
def test_the_finite_path_gives_the_masked_paths_figures_bit_for_bit(kind: str) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    for _ in range(120):
        expected, stored = _chunk(rng, kind)
        fast, masked = _Accumulator(), _Accumulator()
        for a, b in ((expected, stored), (stored, expected)):
            fast.add_values(a, b)
            masked.add_values(a.astype(np.float64), b.astype(np.float64))  # float64: always the masked path
        for name in FIELDS:
            got, want = getattr(fast, name), getattr(masked, name)
            assert got == want or (math.isnan(got) and math.isnan(want)), (kind, name, got, want)


def test_a_sparse_and_a_dense_change_give_the_same_figures_either_side_of_the_cut() -> None:
    """A chunk with just over and just under 1/DENSE_CHANGES of its values moved: each path's figures."""
    rng = np.random.default_rng(7)
    expected = rng.standard_normal(4096).astype(np.float32)
    for moved in (4096 // DENSE_CHANGES, 4096 // DENSE_CHANGES + 1):
        stored = expected.copy()
        stored[:moved] = np.nextafter(stored[:moved], np.float32(0))
        fast, masked = _Accumulator(), _Accumulator()
        fast.add_values(expected, stored)
        masked.add_values(expected.astype(np.float64), stored.astype(np.float64))
        assert [getattr(fast, name) for name in FIELDS] == [getattr(masked, name) for name in FIELDS]
        assert fast.max_abs > 0
