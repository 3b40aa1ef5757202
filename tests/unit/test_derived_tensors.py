"""Derived tensors (engine/gates/architectures/derived.py): rows of stacked parts read across part
boundaries exactly as one concatenated array would give them, a derivation's construction checked
before it is used, and row slices and value maps applied where they are stated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from engine.gates.architectures.derived import DerivedTensor, StackedRows, row_slice, stacked, value_map

RNG = np.random.default_rng(11)
PARTS = [RNG.standard_normal((rows, 5)).astype(np.float32) for rows in (4, 1, 3, 4)]
WHOLE = np.concatenate(PARTS)


@dataclass(frozen=True)
class _Part:
    """A stand-in source tensor: its rows, and widening that records it ran (F16 -> F32)."""

    name: str
    values: np.ndarray

    @property
    def dtype(self) -> str:
        return {np.float16: "F16", np.float32: "F32"}[self.values.dtype.type]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def as_rows(self) -> np.ndarray:
        return self.values.reshape(-1, self.values.shape[-1])

    def widen(self, chunk: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(chunk, dtype=np.float32)


def _parts(*arrays: np.ndarray) -> tuple[_Part, ...]:
    return tuple(_Part(f"p{i}", a) for i, a in enumerate(arrays))


@pytest.mark.parametrize("selection", [
    slice(None), slice(2, 7), slice(3, 5), slice(4, 5), slice(0, 12, 3), slice(-3, None), slice(5, 2),
    slice(None, None, -1), np.array([7, 0, 5, 4, 11]), np.array([4]), np.array([], dtype=np.int64),
    np.array([-1, 3, 3]),
], ids=["all", "across-two", "across-three", "single-row-part", "step", "negative", "empty", "reversed",
        "unsorted-index", "one-index", "no-index", "negative-and-repeated-index"])
def test_stacked_rows_read_like_the_concatenation(selection) -> None:
    rows = StackedRows(PARTS)
    got = rows[selection]
    assert rows.shape == WHOLE.shape
    assert got.dtype == WHOLE.dtype
    np.testing.assert_array_equal(got, WHOLE[selection])


def test_stacked_rows_read_only_the_parts_they_need() -> None:
    class Guarded(np.ndarray):
        def __getitem__(self, key):  # type: ignore[no-untyped-def]
            raise AssertionError("an unselected part was read")

    guarded = [PARTS[0], PARTS[1], PARTS[2].view(Guarded), PARTS[3]]
    np.testing.assert_array_equal(StackedRows(guarded)[np.array([9, 0, 4])], WHOLE[[9, 0, 4]])


def test_parts_must_agree_on_dtype_and_row_length() -> None:
    with pytest.raises(ValueError, match="differ in dtype or row length"):
        DerivedTensor("x", _parts(PARTS[0], PARTS[1].astype(np.float16)), (2, 4, 5))
    with pytest.raises(ValueError, match="differ in dtype or row length"):
        DerivedTensor("x", _parts(PARTS[0], RNG.standard_normal((4, 6)).astype(np.float32)), (2, 4, 5))


def test_a_row_slice_applies_to_one_part_only() -> None:
    with pytest.raises(ValueError, match="one source tensor"):
        DerivedTensor("x", _parts(PARTS[0], PARTS[3]), (2, 4, 5), rows=slice(1, None))


def test_stacked_builds_the_outer_axis_in_the_order_given() -> None:
    derivation = stacked("blk.0.ffn_up_exps.weight", ["e0", "e1", "e2"], "3 experts stacked")
    assert derivation.source_names == ("e0", "e1", "e2")
    tensor = derivation.build(_parts(PARTS[0], PARTS[3], PARTS[0]))
    assert tensor.shape == (3, 4, 5)
    assert tensor.name == "3 stacked: p0 .. p2"
    assert tensor.dtype == "F32"
    np.testing.assert_array_equal(tensor.as_rows()[:], np.concatenate([PARTS[0], PARTS[3], PARTS[0]]))


@pytest.mark.parametrize(("rows", "kept", "label"), [
    (slice(2, None), 10, "p0[2:]"), (slice(1, 4), 3, "p0[1:4]"), (slice(None, 5), 5, "p0[0:5]"),
])
def test_row_slice_keeps_the_stated_rows(rows: slice, kept: int, label: str) -> None:
    tensor = row_slice("position_embd.weight", "pos", rows, "padding offset dropped").build(_parts(WHOLE))
    assert tensor.shape == (kept, 5)
    assert tensor.name == label
    np.testing.assert_array_equal(tensor.as_rows(), WHOLE[rows])


def test_value_map_changes_values_after_widening() -> None:
    half = PARTS[0].astype(np.float16)
    tensor = value_map("blk.0.attn_norm.weight", "norm", "stored as 1 + w", lambda w: w + 1,
                       lambda v: v - 1).build(_parts(half))
    assert tensor.shape == half.shape and tensor.dtype == "F16" and tensor.name == "p0"
    widened = tensor.widen(tensor.as_rows())
    assert widened.dtype == np.float32 and widened.flags.c_contiguous
    np.testing.assert_array_equal(widened, half.astype(np.float32) + 1)


def test_without_a_value_map_widening_is_the_parts_own() -> None:
    tensor = DerivedTensor("x", _parts(PARTS[1]), PARTS[1].shape)
    np.testing.assert_array_equal(tensor.widen(tensor.as_rows()), PARTS[1])
    assert tensor.as_rows() is not None and tensor.as_rows().shape == PARTS[1].shape


def test_each_derivation_keeps_its_stated_description_and_sources() -> None:
    made = [stacked("t.s", ["e0", "e1"], "experts stacked"), row_slice("t.r", "pos", slice(2, None), "offset dropped"),
            value_map("t.v", "norm", "stored as 1 + w", lambda w: w + 1, lambda v: v - 1)]
    assert [(d.gguf_name, d.source_names, d.description) for d in made] == [
        ("t.s", ("e0", "e1"), "experts stacked"), ("t.r", ("pos",), "offset dropped"),
        ("t.v", ("norm",), "stored as 1 + w")]


def test_a_value_map_computed_in_float64_is_still_widened_to_float32() -> None:
    tensor = value_map("t.v", "norm", "stored as 1 + w", lambda w: w.astype(np.float64) + 1,
                       lambda v: v - 1).build(_parts(PARTS[0]))
    widened = tensor.widen(tensor.as_rows())
    assert widened.dtype == np.float32 and widened.flags.c_contiguous
    np.testing.assert_array_equal(widened, PARTS[0] + np.float32(1))


def test_a_stack_of_one_source_tensor_still_gains_the_outer_axis() -> None:
    tensor = stacked("t.s", ["e0"], "one expert").build(_parts(PARTS[0]))
    assert tensor.shape == (1, 4, 5)
    np.testing.assert_array_equal(tensor.as_rows(), PARTS[0])
