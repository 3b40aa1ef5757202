"""The ruler itself: tie forgiveness is narrow, bf16 rounding is right, readers are cross-checked."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.gates.storage import tensor_values
from engine.gates.storage.reproduction import _is_rounding_tie, reproduce_chunk
from engine.gates.storage.tensor_values import f32_to_bf16_bits, readers_agree
from engine.quant import bounds, libggml, reference
from tests.unit.reproduction_inputs import q8_chunk

Q8_0 = GGML_TYPES_BY_NAME["Q8_0"]
INFO = TensorInfo("t", (32,), Q8_0, 0, 34)


def q8_block(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros(32, np.float32)
    x[: len(values)] = values
    return x, reference.quantize(x.reshape(1, -1), Q8_0).reshape(-1).copy()


def test_code_flipped_across_an_exact_tie_is_forgiven():
    x, stored = q8_block([127.0, 2.5])  # d = 1, and 2.5 sits exactly on a rounding tie
    assert stored.view(np.int8)[2 + 1] == 3
    stored.view(np.int8)[2 + 1] = 2
    assert _is_rounding_tie(x, stored, INFO, max_ulps=4)


def test_code_flipped_away_from_a_tie_is_not_forgiven():
    x, stored = q8_block([127.0, 2.3])
    stored.view(np.int8)[2 + 1] += 1
    assert not _is_rounding_tie(x, stored, INFO, max_ulps=4)
    assert not _is_rounding_tie(x, stored, INFO, max_ulps=16)


def test_scale_change_is_not_a_tie():
    x, stored = q8_block([127.0, 2.3])
    stored[0] ^= 0x01  # one bit of the fp16 scale
    assert not _is_rounding_tie(x, stored, INFO, max_ulps=4)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1.0, 0x3F80), (1.00390625, 0x3F80), (1.01171875, 0x3F82), (-2.0, 0xC000), (np.inf, 0x7F80)],
    ids=["exact", "tie to even (down)", "tie to even (up)", "negative", "inf"],
)
def test_bf16_round_to_nearest_even(value, expected):
    assert int(f32_to_bf16_bits(np.array([value], np.float32))[0]) == expected


def test_bf16_nan_stays_nan():
    nan = np.array([0x7F800001], np.uint32).view(np.float32)  # signalling NaN with only low bits set
    bits = int(f32_to_bf16_bits(nan)[0])
    assert bits & 0x7F80 == 0x7F80 and bits & 0x7F


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "Q2_K"])
def test_readers_agree_and_a_corrupted_reader_is_caught(monkeypatch, type_name):
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    raw = reference.quantize(x, ggml_type)
    info = TensorInfo("w", (256, 8), ggml_type, 0, raw.nbytes)
    assert readers_agree(raw, info, 8, 4)
    real = libggml.dequantize

    def off_by_one_bit(*args):
        out = real(*args)
        out.view(np.uint32)[3] ^= 1
        return out

    monkeypatch.setattr(tensor_values.libggml, "dequantize", off_by_one_bit)
    assert not readers_agree(raw, info, 8, 4)


@pytest.mark.parametrize("type_name", sorted(bounds.BOUND_RULES))
def test_derived_bound_holds_for_the_reference_quantizer_and_is_not_loose(type_name):
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 256)) * rng.uniform(1e-3, 10, (64, 1))).astype(np.float32)
    raw = reference.quantize(x, ggml_type)
    error = np.abs(x.astype(np.float64) - reference.dequantize(raw, ggml_type))
    bound = bounds.error_bound(raw, ggml_type, x)
    assert np.all(error <= bound)
    assert error.max() / bound.max() > 0.3 or (error / bound).max() > 0.8  # tight enough to mean something


@pytest.mark.parametrize("type_name", ["Q8_1", "Q1_0"])
def test_types_gguf_py_cannot_read_raise_our_error(type_name):
    from engine.errors import UnsupportedTypeError

    ggml_type = GGML_TYPES_BY_NAME[type_name]
    with pytest.raises(UnsupportedTypeError, match=type_name):
        reference.dequantize(np.zeros((1, ggml_type.type_size), np.uint8), ggml_type)


def test_tie_forgiveness_stops_exactly_at_max_ulps():
    """2.5 + k ulps rounds to 3; a stored 2 is reproduced by moving it k + 1 ulps down, no fewer."""
    for k in (0, 1, 3):
        value = np.float32(2.5)
        for _ in range(k):
            value = np.nextafter(value, np.float32(np.inf))
        x, stored = q8_block([127.0, float(value)])
        assert stored.view(np.int8)[2 + 1] == 3
        stored.view(np.int8)[2 + 1] = 2
        assert _is_rounding_tie(x, stored, INFO, max_ulps=k + 1)
        assert not _is_rounding_tie(x, stored, INFO, max_ulps=k)


def test_a_tie_in_a_later_block_of_a_chunk_is_counted_as_a_tie_and_nothing_else():
    """reproduce_chunk finds the one differing block among 4 rows x 8 blocks, forgives it as a tie in its own
    block (not the row's first), and counts it once: a tie, not a mismatch."""
    rows, raw = q8_chunk(7, tie=True)  # block 1 of row 1: 2.5 on an exact tie, stored rounded down
    info = TensorInfo("t", (256, 4), Q8_0, 0, raw.size)
    outcome = reproduce_chunk(rows, raw, info, 4, None)
    assert (outcome.mismatched, outcome.ties, outcome.compared) == (0, 1, 32)
    assert reproduce_chunk(rows, raw, info, 0, None).mismatched == 1  # no ulps allowed: a mismatch
