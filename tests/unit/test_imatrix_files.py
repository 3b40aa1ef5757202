"""llama.cpp's importance matrix, both forms, read into the exact weights llama-quantize passes to
`ggml_quantize_chunk` (tools/quantize/quantize.cpp `load_imatrix`, src/llama-quant.cpp's lookup).

Files are built byte by byte here: the GGUF form (`<name>.in_sum2` F32 [ne0, n_mat], `<name>.counts`
F32 [1, n_mat], `imatrix.*` keys) and the legacy `.dat` form (entries of `(sum / count) * ncall`)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from engine.formats.ggml_types import ValueType
from engine.quant.imatrix import ImatrixError, read_imatrix
from tests.gguf_bytes import GGUFBytes, kv_array, kv_scalar, kv_string, tensor_info

F32, F16 = 0, 1
METADATA = (kv_string("general.type", "imatrix"), kv_array("imatrix.datasets", ValueType.STRING, ["texts.txt"]),
            kv_scalar("imatrix.chunk_count", ValueType.UINT32, 4),
            kv_scalar("imatrix.chunk_size", ValueType.UINT32, 512))


def gguf_imatrix(entries: dict[str, tuple[np.ndarray, np.ndarray]], *, kvs: tuple[bytes, ...] = METADATA,
                 counts_type: int = F32, extra: tuple[tuple[str, np.ndarray], ...] = ()) -> bytes:
    """`entries`: name -> (sums [n_mat, ne0], counts [n_mat]); `extra`: more F32 tensors as they are."""
    tensors: list[tuple[str, tuple[int, ...], int, bytes]] = []
    for name, (sums, counts) in entries.items():
        sums2 = np.atleast_2d(np.asarray(sums, dtype="<f4"))
        tensors.append((f"{name}.in_sum2", (sums2.shape[1], sums2.shape[0]), F32, sums2.tobytes()))
        dtype = "<f4" if counts_type == F32 else "<f2"
        tensors.append((f"{name}.counts", (1, len(counts)), counts_type, np.asarray(counts, dtype=dtype).tobytes()))
    tensors += [(name, tuple(reversed(values.shape)), F32, values.astype("<f4").tobytes()) for name, values in extra]
    gguf = GGUFBytes(kvs=list(kvs))
    offset = 0
    for name, shape, type_id, raw in tensors:
        gguf.tensors.append(tensor_info(name, shape, type_id, offset))
        padded = raw + b"\0" * (-len(raw) % gguf.alignment)
        gguf.data += padded
        offset += len(padded)
    return gguf.build()


def dat_entry(name: str | bytes, ncall: int, values: np.ndarray) -> bytes:
    raw = name.encode() if isinstance(name, str) else name
    flat = np.asarray(values, dtype="<f4").reshape(-1)
    return struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, flat.size) + flat.tobytes()


def dat_imatrix(entries: list[bytes], *, chunks: int = 4, dataset: bytes = b"texts.txt") -> bytes:
    trailer = struct.pack("<ii", chunks, len(dataset)) + dataset
    return struct.pack("<i", len(entries)) + b"".join(entries) + trailer


def legacy_values(sums: np.ndarray, counts: np.ndarray, ncall: int) -> np.ndarray:
    """What llama-imatrix's save_imatrix_legacy stores: (sum / count) * ncall in float32 per matrix."""
    per_value = np.repeat(np.asarray(counts, dtype=np.float32), np.asarray(sums).shape[-1])
    return (np.asarray(sums, dtype=np.float32).reshape(-1) / per_value) * np.float32(ncall)


def write(tmp_path: Path, data: bytes, name: str = "imatrix.bin") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def malformed(tmp_path: Path, data: bytes) -> str:
    with pytest.raises(ImatrixError) as caught:
        read_imatrix(write(tmp_path, data))
    assert caught.value.code == "imatrix.malformed"
    assert isinstance(caught.value.why, str) and len(caught.value.why) > 15  # a sentence, for the report
    return caught.value.why


RNG = np.random.default_rng(5)
SUMS = RNG.random((1, 256), dtype=np.float32) * 100
EXPERT_SUMS = RNG.random((3, 256), dtype=np.float32) * 50


# --- the GGUF form ---

def test_gguf_form_gives_sum_over_count_per_matrix_in_float32(tmp_path):
    matrix = read_imatrix(write(tmp_path, gguf_imatrix({
        "blk.0.ffn_up.weight": (SUMS, np.array([96.0])),
        "blk.0.ffn_up_exps.weight": (EXPERT_SUMS, np.array([10.0, 0.0, 7.0])),
    })))
    assert matrix.format == "gguf" and matrix.datasets == ("texts.txt",)
    assert (matrix.chunk_count, matrix.chunk_size) == (4, 512)
    assert sorted(matrix.entries) == ["blk.0.ffn_up.weight", "blk.0.ffn_up_exps.weight"]
    dense = matrix.entries["blk.0.ffn_up.weight"]
    assert dense.dtype == np.float32
    assert np.array_equal(dense.view(np.uint32), (SUMS[0] / np.float32(96)).view(np.uint32))
    experts = matrix.entries["blk.0.ffn_up_exps.weight"].reshape(3, 256)
    assert np.array_equal(experts[0], EXPERT_SUMS[0] / np.float32(10))
    assert np.array_equal(experts[1], np.ones(256, dtype=np.float32))  # an expert never routed to: weight 1
    assert np.array_equal(experts[2], EXPERT_SUMS[2] / np.float32(7))


def test_gguf_counts_are_rounded_half_away_from_zero_like_lround(tmp_path):
    below_half = float(np.nextafter(np.float32(0.5), np.float32(0)))  # float32 arithmetic would round it to 1
    counts = np.array([2.5, 1.0, below_half, -2.5, 0.5])
    matrix = read_imatrix(write(tmp_path, gguf_imatrix({"a.weight": (np.tile(SUMS, (5, 1)), counts)})))
    weights = matrix.entries["a.weight"].reshape(5, 256)
    assert np.array_equal(weights[0], SUMS[0] / np.float32(3))
    assert np.array_equal(weights[1], SUMS[0])  # a count of 1 divides, it is not "no data"
    assert np.array_equal(weights[2:4], np.ones((2, 256), dtype=np.float32))  # lround gives 0 and -3
    assert np.array_equal(weights[4], SUMS[0])  # 0.5 rounds up to 1
    assert not weights.flags.writeable


def test_gguf_metadata_other_than_an_array_of_datasets_and_a_zero_chunk_count_are_accepted(tmp_path):
    kvs = (METADATA[0], kv_string("imatrix.datasets", "one.txt"), kv_scalar("imatrix.chunk_count", ValueType.UINT32, 0),
           METADATA[3])
    matrix = read_imatrix(write(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))}, kvs=kvs)))
    assert (matrix.datasets, matrix.chunk_count) == ((), 0)


def test_gguf_tensors_that_are_not_sums_or_counts_are_ignored_as_llama_cpp_does(tmp_path):
    data = gguf_imatrix({"a.weight": (SUMS, np.array([4.0]))}, extra=(("notes", np.zeros(4, np.float32)),))
    assert sorted(read_imatrix(write(tmp_path, data)).entries) == ["a.weight"]


# --- the legacy .dat form ---

@pytest.mark.parametrize("ncall", [1, 2, 8])
def test_both_forms_of_one_matrix_give_identical_weights(tmp_path, ncall):
    counts = np.array([10.0, 3.0, 7.0])
    gguf = read_imatrix(write(tmp_path, gguf_imatrix({"x.weight": (EXPERT_SUMS, counts)}), "m.gguf"))
    dat = read_imatrix(write(tmp_path, dat_imatrix([dat_entry("x.weight", ncall,
                                                              legacy_values(EXPERT_SUMS, counts, ncall))]), "m.dat"))
    assert dat.format == "dat" and gguf.format == "gguf"
    assert np.array_equal(gguf.entries["x.weight"].view(np.uint32), dat.entries["x.weight"].view(np.uint32))


def test_dat_form_divides_by_ncall_in_float32(tmp_path):
    stored = RNG.random(256, dtype=np.float32) * 3
    matrix = read_imatrix(write(tmp_path, dat_imatrix([dat_entry("a.weight", 3, stored),
                                                       dat_entry("b.weight", 0, stored)], chunks=9)))
    assert (matrix.chunk_count, matrix.chunk_size, matrix.datasets) == (9, 0, ("texts.txt",))
    assert np.array_equal(matrix.entries["a.weight"], stored / np.float32(3))
    assert np.array_equal(matrix.entries["b.weight"], stored)  # ncall 0: the values as stored


def test_dat_trailer_is_optional(tmp_path):
    data = struct.pack("<i", 1) + dat_entry("a.weight", 1, SUMS)
    matrix = read_imatrix(write(tmp_path, data))
    assert (matrix.datasets, matrix.chunk_count) == ((), 0)


def test_dat_edge_values_that_are_still_valid(tmp_path):
    one_value = np.array([3.0], dtype=np.float32)
    matrix = read_imatrix(write(tmp_path, dat_imatrix(
        [dat_entry("a", 1, one_value), dat_entry("b" * 1024, -1, SUMS)], dataset=b"")))
    assert np.array_equal(matrix.entries["a"], one_value)
    assert np.array_equal(matrix.entries["b" * 1024], SUMS[0])  # ncall <= 0: the values as stored
    assert matrix.datasets == ()  # an empty dataset name is no dataset, as in llama.cpp
    assert not matrix.entries["a"].flags.writeable
    odd = read_imatrix(write(tmp_path, dat_imatrix([dat_entry("a", 1, one_value)], dataset=b"t\xff.txt")))
    assert odd.datasets == ("t\\xff.txt",)


# --- per tensor: what llama-quant.cpp looks up ---

def test_weights_for_a_matrix_a_stack_of_experts_and_an_absent_tensor(tmp_path):
    matrix = read_imatrix(write(tmp_path, gguf_imatrix({
        "blk.0.ffn_up.weight": (SUMS, np.array([2.0])),
        "blk.0.ffn_up_exps.weight": (EXPERT_SUMS, np.array([1.0, 2.0, 4.0]))})))
    dense = matrix.weights_for("blk.0.ffn_up.weight", (256, 512))
    assert dense is not None and dense.shape == (256,)
    experts = matrix.weights_for("blk.0.ffn_up_exps.weight", (256, 512, 3))
    assert experts is not None and experts.shape == (3, 256)
    assert np.array_equal(experts[2], EXPERT_SUMS[2] / np.float32(4))
    assert matrix.weights_for("blk.0.attn_q.weight", (256, 256)) is None


def test_an_entry_of_the_wrong_length_is_refused_naming_the_tensor(tmp_path):
    matrix = read_imatrix(write(tmp_path, gguf_imatrix({"blk.0.ffn_down.weight": (SUMS, np.array([2.0]))})))
    with pytest.raises(ImatrixError) as caught:
        matrix.weights_for("blk.0.ffn_down.weight", (512, 256))
    assert caught.value.code == "imatrix.entry_mismatch"
    assert caught.value.tensor == "blk.0.ffn_down.weight" and "256" in caught.value.why and "512" in caught.value.why


def test_a_token_embedding_entry_of_the_wrong_length_is_ignored_as_llama_quantize_does(tmp_path):
    matrix = read_imatrix(write(tmp_path, gguf_imatrix({"token_embd.weight": (SUMS, np.array([2.0]))})))
    assert matrix.weights_for("token_embd.weight", (128, 32000)) is None
    assert matrix.weights_for("token_embd.weight", (256, 32000)) is not None


# --- malformed files: a clear error, never a crash or a hang ---

def test_empty_and_garbage_files_are_malformed(tmp_path):
    assert "empty" in malformed(tmp_path, b"")
    malformed(tmp_path, bytes(RNG.integers(0, 256, size=300, dtype=np.uint8)))


@pytest.mark.parametrize("cut", [3, 10, 40, 300, 1000])
def test_truncated_dat_is_malformed(tmp_path, cut):
    data = dat_imatrix([dat_entry("a.weight", 1, SUMS), dat_entry("b.weight", 1, SUMS)])
    malformed(tmp_path, data[:cut])


def test_dat_counts_are_bounded_by_the_file_size(tmp_path):
    assert "entries" in malformed(tmp_path, struct.pack("<i", 0x7FFFFFFF) + b"\0" * 16)
    assert "entries" in malformed(tmp_path, struct.pack("<i", 0))
    assert "name" in malformed(tmp_path, struct.pack("<ii", 1, 0x7FFFFFF0) + b"a" * 16)
    assert "name" in malformed(tmp_path, struct.pack("<ii", 1, -5) + b"a" * 16)
    assert "name" in malformed(tmp_path, struct.pack("<ii", 1, 0) + b"a" * 16)
    assert "name" in malformed(tmp_path, dat_imatrix([dat_entry("b" * 1025, 1, SUMS)]))
    huge_nval = struct.pack("<i", 1) + struct.pack("<i", 1) + b"a" + struct.pack("<ii", 1, 0x7FFFFFFF) + b"\0" * 8
    assert "values" in malformed(tmp_path, huge_nval)
    assert "values" in malformed(tmp_path, struct.pack("<i", 1) + dat_entry("a", 1, np.zeros(0)) + b"\0" * 8)


def test_dat_duplicates_bad_names_non_finite_values_and_trailing_bytes_are_malformed(tmp_path):
    one = dat_entry("a.weight", 1, SUMS)
    assert "twice" in malformed(tmp_path, dat_imatrix([one, one]))
    assert "UTF-8" in malformed(tmp_path, dat_imatrix([dat_entry(b"\xff\xfe", 1, SUMS)]))
    assert "NUL" in malformed(tmp_path, dat_imatrix([dat_entry(b"a\0b", 1, SUMS)]))
    bad = SUMS.copy()
    bad[0, 7] = np.inf
    assert "finite" in malformed(tmp_path, dat_imatrix([dat_entry("a.weight", 1, bad)]))
    assert "after" in malformed(tmp_path, dat_imatrix([one]) + b"\0\0\0")


def test_gguf_without_imatrix_metadata_is_refused_as_llama_quantize_refuses_it(tmp_path):
    why = malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))}, kvs=METADATA[:2]))
    assert "imatrix.chunk_count" in why


def test_gguf_entry_defects_are_malformed(tmp_path):
    sums_only = GGUFBytes(kvs=list(METADATA)).with_f32_tensors(("a.weight.in_sum2", 8)).build()
    assert "counts" in malformed(tmp_path, sums_only)
    assert "F32" in malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))}, counts_type=F16))
    assert "divide" in malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0, 2.0, 3.0]))}))
    bad = SUMS.copy()
    bad[0, 3] = np.nan
    assert "finite" in malformed(tmp_path, gguf_imatrix({"a.weight": (bad, np.array([1.0]))}))
    assert "finite" in malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([np.inf]))}))
    assert "no importance" in malformed(tmp_path, gguf_imatrix({}))


def test_structurally_broken_gguf_is_malformed_with_the_parser_reason(tmp_path):
    data = gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))})
    assert "GGUF" in malformed(tmp_path, data[: len(data) - 100])


def test_an_unreadable_path_is_malformed_with_the_reason(tmp_path):
    with pytest.raises(ImatrixError) as caught:
        read_imatrix(tmp_path)
    assert caught.value.code == "imatrix.malformed" and "cannot read" in caught.value.why


def test_gguf_chunk_metadata_must_be_unsigned_32_bit_numbers(tmp_path):
    kvs = (*METADATA[:2], kv_scalar("imatrix.chunk_count", ValueType.BOOL, True), METADATA[3])
    assert "u32" in malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))}, kvs=kvs))
    kvs = (*METADATA[:3], kv_scalar("imatrix.chunk_size", ValueType.INT32, -1))
    assert "u32" in malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))}, kvs=kvs))
    kvs = (*METADATA[:3], kv_scalar("imatrix.chunk_size", ValueType.UINT64, 1 << 32))
    assert "u32" in malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))}, kvs=kvs))
    kvs = (*METADATA[:3], kv_string("imatrix.chunk_size", "512"))
    assert "u32" in malformed(tmp_path, gguf_imatrix({"a.weight": (SUMS, np.array([1.0]))}, kvs=kvs))


LONG = "n" * 40


@pytest.mark.parametrize(("cut", "what"), [(50, f"the call count of '{LONG}'"), (54, f"the value count of '{LONG}'"),
                                           (None, "the trailing chunk count"), (-2, "the dataset name length")])
def test_a_truncated_dat_names_what_it_was_reading(tmp_path, cut, what):
    entry = struct.pack("<i", 1) + dat_entry(LONG, 1, SUMS)
    data = entry[:cut] if isinstance(cut, int) and cut > 0 else entry + b"\0\0" if cut is None else entry + (
        struct.pack("<i", 2) + b"\0\0")
    assert malformed(tmp_path, data) == f"the file ends inside {what} (truncated)"


def test_dat_dataset_name_longer_than_the_file_and_non_finite_names_are_named(tmp_path):
    entry = struct.pack("<i", 1) + dat_entry("a.weight", 1, SUMS)
    assert "dataset name declares 100 bytes" in malformed(tmp_path, entry + struct.pack("<ii", 2, 100) + b"abc")
    bad = SUMS.copy()
    bad[0, 1] = np.nan
    assert "'a.weight'" in malformed(tmp_path, dat_imatrix([dat_entry("a.weight", 1, bad)]))
    assert "'g.weight'" in malformed(tmp_path, gguf_imatrix({"g.weight": (bad, np.array([1.0]))}))
    assert "'g.weight'" in malformed(tmp_path, gguf_imatrix({"g.weight": (SUMS, np.array([np.nan]))}))
