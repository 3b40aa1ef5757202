"""Hostile GGUF files, built byte by byte: each must be refused with its own gguf.* code, fast.

Covers the handcrafted cases of llama.cpp's tests/test-gguf.cpp and the ones the issue adds.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import pytest

from engine.formats.ggml_types import GGML_TYPES, ValueType
from engine.formats.gguf_structure import GGUFStructureError, parse_buffer, read_layout
from tests.gguf_bytes import GGUFBytes, gguf_string, kv_array, kv_scalar, kv_string, tensor_info


def parse(raw: bytes):
    return parse_buffer(raw, Path("t.gguf"))


def expect(code: str, raw: bytes) -> GGUFStructureError:
    started = time.perf_counter()
    with pytest.raises(GGUFStructureError) as info:
        parse(raw)
    assert time.perf_counter() - started < 1.0
    assert info.value.code == code, info.value.why
    return info.value


def two_tensors(**overrides) -> GGUFBytes:
    return GGUFBytes(**overrides).with_f32_tensors(("a", 8), ("b", 8))


def with_tokenizer(*kvs: bytes) -> bytes:
    tokens = kv_array("tokenizer.ggml.tokens", ValueType.STRING, ["a", "b", "c"])
    return GGUFBytes(kvs=[tokens, *kvs]).build()


MALFORMED = [
    ("bad magic", "gguf.bad_magic", GGUFBytes(magic=b"FUGG").build()),
    ("version 0", "gguf.bad_version", GGUFBytes(version=0).build()),
    ("version 1", "gguf.bad_version", GGUFBytes(version=1).build()),
    ("version from the future", "gguf.bad_version", GGUFBytes(version=4).build()),
    ("byte-swapped", "gguf.byte_swapped", GGUFBytes(version=0x03000000).build()),
    ("negative tensor count", "gguf.bad_count", GGUFBytes(n_tensors=-1).build()),
    ("absurd kv count", "gguf.bad_count", GGUFBytes(n_kv=1 << 40).build()),
    ("kv count beyond file", "gguf.bad_count", GGUFBytes(n_kv=1000).build()),
    ("key size huge", "gguf.bad_key", GGUFBytes(kvs=[struct.pack("<Q", (1 << 64) - 1) + b"k"]).build()),
    ("empty key", "gguf.bad_key", GGUFBytes(kvs=[kv_string("", "x")]).build()),
    ("key too long", "gguf.bad_key", GGUFBytes(kvs=[kv_string("k" * 5000, "x")]).build()),
    ("duplicate key", "gguf.duplicate_key", GGUFBytes(kvs=[kv_string("a", "x"), kv_string("a", "y")]).build()),
    ("unknown value type", "gguf.bad_value_type",
     GGUFBytes(kvs=[gguf_string("k") + struct.pack("<i", 13) + b"\0" * 8]).build()),
    ("nested array", "gguf.nested_array",
     GGUFBytes(kvs=[gguf_string("k") + struct.pack("<iiQ", 9, 9, 1)]).build()),
    ("2^40 array elements in ~100 bytes", "gguf.length_out_of_range",
     GGUFBytes(kvs=[gguf_string("k") + struct.pack("<iiQ", 9, 0, 1 << 40)]).build()),
    ("string longer than file", "gguf.length_out_of_range",
     GGUFBytes(kvs=[gguf_string("k") + struct.pack("<iQ", 8, 1 << 33) + b"abc"]).build()),
    ("alignment not power of two", "gguf.bad_alignment",
     GGUFBytes(kvs=[kv_scalar("general.alignment", ValueType.UINT32, 13)]).build()),
    ("alignment zero", "gguf.bad_alignment",
     GGUFBytes(kvs=[kv_scalar("general.alignment", ValueType.UINT32, 0)]).build()),
    ("alignment not u32", "gguf.bad_alignment",
     GGUFBytes(kvs=[kv_scalar("general.alignment", ValueType.INT32, 32)]).build()),
    ("tensor name too long", "gguf.bad_tensor_name",
     GGUFBytes(tensors=[tensor_info("t" * 64, (8,), 0, 0)], data=b"\0" * 32).build()),
    ("tensor name empty", "gguf.bad_tensor_name",
     GGUFBytes(tensors=[tensor_info("", (8,), 0, 0)], data=b"\0" * 32).build()),
    ("duplicate tensor name", "gguf.duplicate_tensor",
     GGUFBytes(tensors=[tensor_info("a", (8,), 0, 0), tensor_info("a", (8,), 0, 32)], data=b"\0" * 64).build()),
    ("n_dims 5", "gguf.bad_n_dims", GGUFBytes(tensors=[tensor_info("a", (1, 1, 1, 1, 8), 0, 0)]).build()),
    ("n_dims 0", "gguf.bad_n_dims", GGUFBytes(tensors=[tensor_info("a", (), 0, 0) + b"\0" * 8]).build()),
    ("negative dimension", "gguf.bad_shape", GGUFBytes(tensors=[tensor_info("a", (8, -1), 0, 0)]).build()),
    ("element count overflows", "gguf.bad_shape",
     GGUFBytes(tensors=[tensor_info("a", (1 << 40, 1 << 40), 24, 0)]).build()),
    ("nbytes wraps when padded", "gguf.tensor_out_of_bounds",
     GGUFBytes(tensors=[tensor_info("a", (4, (1 << 30) - 1, (1 << 30) + 1), 0, 1 << 62)]).build()),
    ("unknown tensor type", "gguf.bad_tensor_type", GGUFBytes(tensors=[tensor_info("a", (8,), 99, 0)]).build()),
    ("removed tensor type", "gguf.bad_tensor_type", GGUFBytes(tensors=[tensor_info("a", (8,), 4, 0)]).build()),
    ("row not a multiple of block", "gguf.bad_row_size",
     GGUFBytes(tensors=[tensor_info("a", (30,), 8, 0)], data=b"\0" * 64).build()),
    ("offset misaligned", "gguf.offset_misaligned",
     GGUFBytes(tensors=[tensor_info("a", (8,), 0, 0), tensor_info("b", (8,), 0, 33)], data=b"\0" * 96).build()),
    ("tensors overlap", "gguf.tensor_overlap",
     GGUFBytes(tensors=[tensor_info("a", (16,), 0, 0), tensor_info("b", (8,), 0, 32)], data=b"\0" * 96).build()),
    ("tensors out of order", "gguf.tensor_out_of_order",
     GGUFBytes(tensors=[tensor_info("a", (8,), 0, 0), tensor_info("b", (8,), 0, 32), tensor_info("c", (8,), 0, 0)],
               data=b"\0" * 96).build()),
    ("gap between tensors", "gguf.tensor_gap",
     GGUFBytes(tensors=[tensor_info("a", (8,), 0, 0), tensor_info("b", (8,), 0, 64)], data=b"\0" * 96).build()),
    ("tensor beyond the end", "gguf.tensor_out_of_bounds",
     GGUFBytes(tensors=[tensor_info("a", (8,), 0, 1 << 20)]).build()),
    ("two huge I8 tensors (mem size overflow)", "gguf.truncated",
     GGUFBytes(tensors=[tensor_info("a", (0x7FFFFFFFFFFFFFC0,), 24, 0),
                        tensor_info("b", (0x7FFFFFFFFFFFFFC0,), 24, 0x7FFFFFFFFFFFFFC0)]).build()),
    ("truncated data", "gguf.truncated", two_tensors().build()[:-40]),
    ("truncated header", "gguf.truncated", GGUFBytes().build()[:20]),
    ("trailing garbage", "gguf.trailing_data", two_tensors(trailing=b"\0" * 64).build()),
    ("tokens not strings", "gguf.bad_tokenizer_array",
     GGUFBytes(kvs=[kv_array("tokenizer.ggml.tokens", ValueType.INT32, [1, 2])]).build()),
    ("scores wrong length", "gguf.bad_tokenizer_array",
     with_tokenizer(kv_array("tokenizer.ggml.scores", ValueType.FLOAT32, [0.0, 1.0]))),
    ("token types wrong element type", "gguf.bad_tokenizer_array",
     with_tokenizer(kv_array("tokenizer.ggml.token_type", ValueType.FLOAT32, [0.0, 1.0, 2.0]))),
    ("merges not strings", "gguf.bad_tokenizer_array",
     with_tokenizer(kv_array("tokenizer.ggml.merges", ValueType.UINT8, [1]))),
    ("bos id outside vocabulary", "gguf.bad_tokenizer_array",
     with_tokenizer(kv_scalar("tokenizer.ggml.bos_token_id", ValueType.UINT32, 3))),
]


@pytest.mark.parametrize(("code", "raw"), [(c, r) for _, c, r in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_file_is_refused_with_its_code(code: str, raw: bytes) -> None:
    expect(code, raw)


def test_every_structural_code_in_the_table_has_a_malformed_case() -> None:
    from engine.blockers import BLOCKER_CODES

    covered = {code for _, code, _ in MALFORMED} | {"gguf.unreadable"}
    assert {c for c in BLOCKER_CODES if c.startswith("gguf.")} <= covered


def test_header_only_and_valid_files_are_accepted() -> None:
    assert parse(GGUFBytes(kvs=[]).build()).tensors == ()
    layout = parse(two_tensors().build())
    assert [t.name for t in layout.tensors] == ["a", "b"]
    assert layout.tensors[1].offset == layout.data_offset + 32
    tokens = with_tokenizer(kv_array("tokenizer.ggml.scores", ValueType.FLOAT32, [0.0, 1.0, 2.0]),
                            kv_scalar("tokenizer.ggml.bos_token_id", ValueType.UINT32, 2))
    assert parse(tokens).metadata["tokenizer.ggml.tokens"].values == ("a", "b", "c")


def test_declared_huge_array_is_refused_where_gguf_py_would_allocate(tmp_path: Path) -> None:
    raw = GGUFBytes(kvs=[gguf_string("k") + struct.pack("<iiQ", 9, 0, 1 << 40)]).build()
    assert len(raw) < 120
    path = tmp_path / "huge.gguf"
    path.write_bytes(raw)
    started = time.perf_counter()
    with pytest.raises(GGUFStructureError) as info:
        read_layout(path)
    assert info.value.code == "gguf.length_out_of_range"
    assert time.perf_counter() - started < 1.0


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GGUFStructureError, match="empty"):
        read_layout(empty)
    with pytest.raises(GGUFStructureError) as info:
        read_layout(tmp_path / "absent.gguf")
    assert info.value.code == "gguf.unreadable"


# gguf-py 0.19 still sizes Q8_1 with fp32 d and s (40 bytes); ggml's block_q8_1 uses two fp16 (36).
GGUF_PY_KNOWN_WRONG = {"Q8_1"}


def test_type_table_agrees_with_libggml() -> None:
    from engine.quant import libggml

    for type_id, ggml_type in GGML_TYPES.items():
        traits = libggml._lib().ggml_get_type_traits(type_id).contents
        assert traits.type_name.decode().upper() == ggml_type.name
        assert (traits.blck_size, traits.type_size) == (ggml_type.block_size, ggml_type.type_size)


def test_type_table_agrees_with_gguf_py_except_known_errors() -> None:
    for type_id, ggml_type in GGML_TYPES.items():
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            continue  # newer than this gguf-py
        assert qtype.name == ggml_type.name
        sizes = (ggml_type.block_size, ggml_type.type_size)
        assert (gguf.GGML_QUANT_SIZES[qtype] == sizes) != (ggml_type.name in GGUF_PY_KNOWN_WRONG)
