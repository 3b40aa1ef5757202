"""The parser's accepted files, read back exactly: shapes of every rank, limits at their edge, offsets.

The hostile cases live in test_gguf_structure.py; these pin what a *valid* file parses to, so a
parser that mis-sizes a 2-D tensor or shifts an offset cannot pass by refusing nothing.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME, ValueType
from engine.formats.gguf_structure import (
    MAX_DIMS,
    MAX_KEY_BYTES,
    MAX_TENSOR_NAME_BYTES,
    GGUFStructureError,
    parse_buffer,
)
from tests.gguf_bytes import GGUFBytes, gguf_string, kv_array, kv_scalar, kv_string, tensor_info


def parse(raw: bytes):
    return parse_buffer(raw, Path("t.gguf"))


def code_of(raw: bytes) -> str:
    with pytest.raises(GGUFStructureError) as info:
        parse(raw)
    return info.value.code


def tensors_file(specs: list[tuple[str, tuple[int, ...], str]], alignment: int = 32,
                 kvs: list[bytes] | None = None) -> tuple[bytes, list[int]]:
    """A valid file with the given tensors (name, ggml shape, type name), data laid out back to back."""
    infos, data, offsets = [], b"", []
    for name, shape, type_name in specs:
        ggml = GGML_TYPES_BY_NAME[type_name]
        nbytes = ggml.row_bytes(shape[0])
        for dim in shape[1:]:
            nbytes *= dim
        offsets.append(len(data))
        infos.append(tensor_info(name, shape, ggml.id, len(data)))
        data += bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256)
        data += b"\0" * (-len(data) % alignment)
    header_kvs = [kv_string("general.architecture", "test")]
    if alignment != 32:
        header_kvs.append(kv_scalar("general.alignment", ValueType.UINT32, alignment))
    gguf = GGUFBytes(kvs=header_kvs + (kvs or []), tensors=infos, data=data, alignment=alignment)
    return gguf.build(), offsets


def test_tensors_of_every_rank_are_sized_by_every_dimension():
    specs = [("v", (32,), "F32"), ("m", (64, 3), "F16"), ("q", (64, 5), "Q8_0"), ("t", (32, 2, 3), "BF16"),
             ("x", (256, 2, 2, 2), "Q4_K")]
    raw, offsets = tensors_file(specs)
    layout = parse(raw)
    assert [(t.name, t.shape, t.ggml_type.name) for t in layout.tensors] == [(n, s, k) for n, s, k in specs]
    assert [t.nbytes for t in layout.tensors] == [128, 384, 340, 384, 1152]
    assert [t.offset - layout.data_offset for t in layout.tensors] == offsets
    assert layout.data_offset % 32 == 0 and layout.data_offset < len(raw)
    assert layout.file_size == len(raw) and layout.version == 3 and layout.alignment == 32
    assert [t.numpy_shape for t in layout.tensors][1] == (3, 64)
    assert layout.tensors[4].n_elements == 256 * 8


def test_a_wrong_outer_dimension_is_caught():
    """The data of a (64, 3) tensor is 3 rows: declaring 4 rows runs past the end."""
    raw, _ = tensors_file([("m", (64, 3), "F16")])
    grown = raw.replace(struct.pack("<qq", 64, 3), struct.pack("<qq", 64, 4))
    assert code_of(grown) == "gguf.truncated"
    shrunk = raw.replace(struct.pack("<qq", 64, 3), struct.pack("<qq", 64, 2))
    assert code_of(shrunk) == "gguf.trailing_data"


def test_a_custom_alignment_is_read_and_used():
    raw, offsets = tensors_file([("a", (8,), "F32"), ("b", (8,), "F32")], alignment=64)
    layout = parse(raw)
    assert layout.alignment == 64 and offsets == [0, 64]
    assert [t.offset for t in layout.tensors] == [layout.data_offset, layout.data_offset + 64]
    assert layout.data_offset % 64 == 0


def test_limits_are_inclusive():
    assert parse(tensors_file([("n" * MAX_TENSOR_NAME_BYTES, (32,), "F32")])[0]).tensors[0].name == "n" * 63
    assert code_of(tensors_file([("n" * (MAX_TENSOR_NAME_BYTES + 1), (32,), "F32")])[0]) == "gguf.bad_tensor_name"
    assert len(parse(tensors_file([("d", (32, 1, 1, 1), "F32")])[0]).tensors[0].shape) == MAX_DIMS
    five = GGUFBytes(tensors=[tensor_info("d", (32, 1, 1, 1, 1), 0, 0)], data=bytes(128)).build()
    assert code_of(five) == "gguf.bad_n_dims"
    key = "k" * MAX_KEY_BYTES
    assert parse(GGUFBytes(kvs=[kv_string(key, "v")]).build()).metadata[key] == "v"
    assert code_of(GGUFBytes(kvs=[kv_string(key + "k", "v")]).build()) == "gguf.bad_key"
    assert code_of(GGUFBytes(tensors=[tensor_info("", (32,), 0, 0)], data=bytes(128)).build()) == (
        "gguf.bad_tensor_name")


def test_names_and_keys_must_be_utf8():
    bad_key = gguf_string(b"k\xff") + struct.pack("<i", ValueType.STRING) + gguf_string("v")
    assert code_of(GGUFBytes(kvs=[bad_key]).build()) == "gguf.bad_key"
    bad_name = GGUFBytes(tensors=[tensor_info(b"t\xff", (32,), 0, 0)], data=bytes(128)).build()
    assert code_of(bad_name) == "gguf.bad_tensor_name"


def test_values_read_back_with_their_types():
    kvs = [kv_scalar("u8", ValueType.UINT8, 255), kv_scalar("i8", ValueType.INT8, -128),
           kv_scalar("u16", ValueType.UINT16, 65535), kv_scalar("i16", ValueType.INT16, -32768),
           kv_scalar("u32", ValueType.UINT32, 4294967295), kv_scalar("i32", ValueType.INT32, -2147483648),
           kv_scalar("f32", ValueType.FLOAT32, 0.5), kv_scalar("b", ValueType.BOOL, True),
           kv_scalar("u64", ValueType.UINT64, (1 << 64) - 1), kv_scalar("i64", ValueType.INT64, -(1 << 63)),
           kv_scalar("f64", ValueType.FLOAT64, 0.1), kv_string("s", "héllo"),
           kv_array("ai", ValueType.INT32, [1, -2, 3]), kv_array("as", ValueType.STRING, ["x", "", "ÿ"]),
           gguf_string("raw") + struct.pack("<i", ValueType.STRING) + gguf_string(b"\xff")]
    metadata = parse(GGUFBytes(kvs=kvs).build()).metadata
    assert [metadata[k] for k in ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "b", "u64", "i64", "f64", "s")] == [
        255, -128, 65535, -32768, 4294967295, -2147483648, 0.5, True, (1 << 64) - 1, -(1 << 63), 0.1, "héllo"]
    assert metadata["b"] is True
    assert metadata["ai"].element_type is ValueType.INT32 and metadata["ai"].values.tolist() == [1, -2, 3]
    assert not metadata["ai"].values.flags.writeable
    assert metadata["as"].values == ("x", "", "ÿ") and len(metadata["as"]) == 3
    assert metadata["raw"] == b"\xff".decode("utf-8", errors="surrogateescape")  # kept, never silently dropped


def test_a_file_with_no_tensors_ends_at_its_header():
    raw = GGUFBytes().build()
    layout = parse(raw)
    assert layout.tensors == () and layout.file_size == len(raw)
    assert code_of(raw + b"\0" * 64) == "gguf.trailing_data"


def test_the_tokenizer_arrays_must_agree_with_the_token_count():
    tokens = kv_array("tokenizer.ggml.tokens", ValueType.STRING, ["a", "b"])
    ok = [tokens, kv_array("tokenizer.ggml.scores", ValueType.FLOAT32, [0.0, 1.0]),
          kv_array("tokenizer.ggml.token_type", ValueType.INT32, [1, 3]),
          kv_scalar("tokenizer.ggml.eos_token_id", ValueType.UINT32, 1)]
    assert parse(GGUFBytes(kvs=ok).build()).metadata["tokenizer.ggml.eos_token_id"] == 1
    out_of_range = [tokens, kv_scalar("tokenizer.ggml.eos_token_id", ValueType.UINT32, 2)]
    assert code_of(GGUFBytes(kvs=out_of_range).build()) == "gguf.bad_tokenizer_array"
    short = [tokens, kv_array("tokenizer.ggml.token_type", ValueType.INT32, [1])]
    assert code_of(GGUFBytes(kvs=short).build()) == "gguf.bad_tokenizer_array"


def why_of(raw: bytes) -> str:
    with pytest.raises(GGUFStructureError) as info:
        parse(raw)
    return info.value.why


def test_tensor_lookup_by_name():
    layout = parse(tensors_file([("a", (32,), "F32"), ("b", (64,), "F32")])[0])
    assert layout.tensor("b").shape == (64,) and layout.tensor("a").shape == (32,)
    with pytest.raises(KeyError, match="'c'"):
        layout.tensor("c")


def test_numbers_are_read_with_their_signedness():
    """Each field's wire type decides what a hostile value reads as, and so what the message says."""
    assert why_of(GGUFBytes(version=0xFFFFFFFF).build()) == "GGUF version 4294967295 is not supported (2 or 3)"
    assert why_of(GGUFBytes(n_kv=-1).build()) == "key/value count -1 is negative, absurd or exceeds the file"
    bad_type = gguf_string("k") + struct.pack("<i", -1) + bytes(8)
    assert why_of(GGUFBytes(kvs=[bad_type]).build()) == "key 'k' has unknown value type -1"
    bad_element = gguf_string("k") + struct.pack("<ii", ValueType.ARRAY, -2) + bytes(8)
    assert why_of(GGUFBytes(kvs=[bad_element]).build()) == "array 'k' has unknown value type -2"
    huge_name = struct.pack("<Q", (1 << 64) - 1) + bytes(40)
    raw = GGUFBytes(tensors=[huge_name]).build()
    assert why_of(raw) == "tensor name length 18446744073709551615 is empty or too long"


@pytest.mark.parametrize("version", [1, 2, 3])
def test_every_byte_swapped_version_is_named(version):
    swapped = struct.unpack("<I", struct.pack(">I", version))[0]
    assert code_of(GGUFBytes(version=swapped).build()) == "gguf.byte_swapped"


def test_utf8_errors_say_what_was_being_read():
    bad_key = gguf_string(b"k\xff") + struct.pack("<i", ValueType.STRING) + gguf_string("v")
    assert why_of(GGUFBytes(kvs=[bad_key]).build()) == "a key is not valid UTF-8"
    bad_name = GGUFBytes(tensors=[tensor_info(b"t\xff", (32,), 0, 0)], data=bytes(128)).build()
    assert why_of(bad_name) == "a tensor name is not valid UTF-8"


def test_string_arrays_keep_undecodable_bytes():
    """A vocabulary entry that is not UTF-8 is kept (escaped), never dropped or fatal: the tokenizer
    comparison then names it."""
    raw_array = gguf_string("toks") + struct.pack("<iiQ", ValueType.ARRAY, ValueType.STRING, 2)
    raw_array += gguf_string("ok") + gguf_string(b"\xfe")
    values = parse(GGUFBytes(kvs=[raw_array]).build()).metadata["toks"].values
    assert values == ("ok", b"\xfe".decode("utf-8", errors="surrogateescape"))
