"""Our own bounded, non-recursive GGUF parser: the first thing that touches an artifact.

Every count and length is checked against what the bytes left in the file could hold *before*
anything is allocated or looped over, so a 100-byte file declaring 2^40 array elements fails at
once instead of hanging (gguf-py's reader does). Sizes are computed with Python ints, never
numpy's wrapping uint64. The result is a frozen `GGUFLayout`; any defect raises
`GGUFStructureError` carrying a `gguf.*` blocker code.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from engine.errors import CodedError
from engine.formats.ggml_types import GGML_TYPES, SCALAR_FORMATS, GGMLType, ValueType
from engine.formats.gguf_strings import read_string_array

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_KEY_BYTES = 1024
MAX_TENSOR_NAME_BYTES = 63  # GGML_MAX_NAME (64) minus the terminating NUL
MAX_DIMS = 4
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_ELEMENTS = (1 << 63) - 1
# The smallest possible encodings, used to refuse counts the remaining bytes cannot hold.
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8
MIN_ARRAY_ELEMENT_BYTES = {t: struct.calcsize(f) for t, f in SCALAR_FORMATS.items()} | {ValueType.STRING: 8}

TOKEN_ID_KEYS = tuple(
    f"tokenizer.ggml.{name}_token_id" for name in ("bos", "eos", "unknown", "seperator", "padding", "cls", "mask")
)


class GGUFStructureError(CodedError):
    """The file is not a well-formed GGUF; `code` is a `gguf.*` blocker code."""


@dataclass(frozen=True, slots=True)
class GGUFArray:
    """A metadata array: numeric arrays are read-only numpy views, string arrays tuples."""

    element_type: ValueType
    values: Sequence[str] | np.ndarray

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's header entry. `shape` is in ggml order (ne[0] is the row length)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        """Row-major shape, as the source framework (and numpy) sees it."""
        return tuple(reversed(self.shape))


@dataclass(frozen=True, slots=True)
class GGUFLayout:
    """A validated GGUF file: header facts, metadata and tensor table."""

    path: Path
    version: int
    alignment: int
    metadata: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int

    def tensor(self, name: str) -> TensorInfo:
        for info in self.tensors:
            if info.name == name:
                return info
        raise KeyError(name)


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class _Cursor:
    """Reads little-endian values from a buffer, refusing to read past its end."""

    def __init__(self, buffer: mmap.mmap | bytes, size: int) -> None:
        self.buffer = buffer
        self.size = size
        self.pos = 0

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.remaining:
            raise GGUFStructureError("gguf.truncated", f"file ends while reading {what}")
        chunk = self.buffer[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def length(self, unit: int, what: str, code: str = "gguf.length_out_of_range") -> int:
        """A u64 length whose `unit`-byte elements must fit in the rest of the file."""
        n = self.scalar("<Q", f"length of {what}")
        if n * unit > self.remaining:
            raise GGUFStructureError(code, f"{what} declares {n} elements, more than the file holds")
        return n

    def string(self, what: str) -> bytes:
        n = self.length(1, what)
        return self.take(n, what)


def _decode_utf8(raw: bytes, code: str, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GGUFStructureError(code, f"{what} is not valid UTF-8") from exc


def _value_type(raw: int, what: str) -> ValueType:
    try:
        return ValueType(raw)
    except ValueError as exc:
        raise GGUFStructureError("gguf.bad_value_type", f"{what} has unknown value type {raw}") from exc


def _read_array(cur: _Cursor, key: str) -> GGUFArray:
    element_type = _value_type(cur.scalar("<i", f"array type of {key}"), f"array {key!r}")
    if element_type is ValueType.ARRAY:
        raise GGUFStructureError("gguf.nested_array", f"array {key!r} holds arrays")
    count = cur.length(MIN_ARRAY_ELEMENT_BYTES[element_type], f"array {key!r}")
    if element_type is ValueType.STRING:
        def fail(why: str) -> GGUFStructureError:
            return GGUFStructureError("gguf.length_out_of_range", f"array {key!r}: {why}")

        strings, cur.pos = read_string_array(cur.buffer, cur.pos, cur.size, count, fail)
        return GGUFArray(element_type, strings)
    fmt = SCALAR_FORMATS[element_type]
    raw = cur.take(count * struct.calcsize(fmt), f"array {key!r}")
    values = np.frombuffer(raw, dtype=np.dtype(fmt[1]).newbyteorder("<"))
    values.flags.writeable = False
    return GGUFArray(element_type, values)


def _read_value(cur: _Cursor, value_type: ValueType, key: str) -> Any:
    if value_type is ValueType.STRING:
        return cur.string(f"value of {key!r}").decode("utf-8", errors="surrogateescape")
    if value_type is ValueType.ARRAY:
        return _read_array(cur, key)
    return cur.scalar(SCALAR_FORMATS[value_type], f"value of {key!r}")


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    magic = cur.take(4, "magic")
    if magic != GGUF_MAGIC:
        raise GGUFStructureError("gguf.bad_magic", f"magic is {magic!r}, expected {GGUF_MAGIC!r}")
    version = cur.scalar("<I", "version")
    swapped = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in SUPPORTED_VERSIONS and swapped in (1, 2, 3):
        raise GGUFStructureError("gguf.byte_swapped", f"version reads as {version}: the file is big-endian")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFStructureError("gguf.bad_version", f"GGUF version {version} is not supported (2 or 3)")
    n_tensors = cur.scalar("<q", "tensor count")
    n_kv = cur.scalar("<q", "key/value count")
    for what, n, limit, min_bytes in (
        ("tensor count", n_tensors, MAX_TENSORS, MIN_TENSOR_INFO_BYTES),
        ("key/value count", n_kv, MAX_KV, MIN_KV_BYTES),
    ):
        if n < 0 or n > limit or n * min_bytes > cur.remaining:
            raise GGUFStructureError("gguf.bad_count", f"{what} {n} is negative, absurd or exceeds the file")
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key_len = cur.scalar("<Q", "key length")
        if key_len == 0 or key_len > MAX_KEY_BYTES or key_len > cur.remaining:
            raise GGUFStructureError("gguf.bad_key", f"key length {key_len} is empty or too long")
        key = _decode_utf8(cur.take(key_len, "key"), "gguf.bad_key", "a key")
        if key in metadata:
            raise GGUFStructureError("gguf.duplicate_key", f"key {key!r} appears twice")
        value_type = _value_type(cur.scalar("<i", f"type of {key!r}"), f"key {key!r}")
        if key == "general.alignment" and value_type is not ValueType.UINT32:
            raise GGUFStructureError("gguf.bad_alignment", f"general.alignment has type {value_type.name}")
        metadata[key] = _read_value(cur, value_type, key)
    return metadata


def _read_tensor_info(cur: _Cursor, seen: set[str]) -> tuple[str, tuple[int, ...], GGMLType, int]:
    name_len = cur.scalar("<Q", "tensor name length")
    if name_len == 0 or name_len > MAX_TENSOR_NAME_BYTES or name_len > cur.remaining:
        raise GGUFStructureError("gguf.bad_tensor_name", f"tensor name length {name_len} is empty or too long")
    name = _decode_utf8(cur.take(name_len, "tensor name"), "gguf.bad_tensor_name", "a tensor name")
    if name in seen:
        raise GGUFStructureError("gguf.duplicate_tensor", f"tensor {name!r} appears twice", name)
    seen.add(name)
    n_dims = cur.scalar("<I", f"n_dims of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFStructureError("gguf.bad_n_dims", f"tensor {name!r} has {n_dims} dimensions", name)
    shape = tuple(cur.scalar("<q", f"dimension of {name!r}") for _ in range(n_dims))
    count = 1
    for dim in shape:
        if dim < 0:
            raise GGUFStructureError("gguf.bad_shape", f"tensor {name!r} has negative dimension {dim}", name)
        count *= dim
    if count > MAX_ELEMENTS:
        raise GGUFStructureError("gguf.bad_shape", f"tensor {name!r} element count overflows", name)
    type_id = cur.scalar("<i", f"type of {name!r}")
    ggml_type = GGML_TYPES.get(type_id)
    if ggml_type is None:
        raise GGUFStructureError("gguf.bad_tensor_type", f"tensor {name!r} has unknown type {type_id}", name)
    if shape[0] % ggml_type.block_size:
        raise GGUFStructureError(
            "gguf.bad_row_size",
            f"tensor {name!r} row length {shape[0]} is not a multiple of {ggml_type.name}'s block size "
            f"{ggml_type.block_size}",
            name,
        )
    offset = cur.scalar("<Q", f"offset of {name!r}")
    return name, shape, ggml_type, offset


def _place_tensors(
    entries: list[tuple[str, tuple[int, ...], GGMLType, int]], data_offset: int, alignment: int, file_size: int
) -> tuple[TensorInfo, ...]:
    """Check that tensor data is contiguous, in order, aligned and inside the file."""
    infos: list[TensorInfo] = []
    previous: TensorInfo | None = None
    for name, shape, ggml_type, rel_offset in entries:
        nbytes = ggml_type.row_bytes(shape[0])
        for dim in shape[1:]:
            nbytes *= dim
        if rel_offset % alignment:
            raise GGUFStructureError(
                "gguf.offset_misaligned", f"tensor {name!r} offset {rel_offset} is not a multiple of {alignment}", name
            )
        start = data_offset + rel_offset
        if start > file_size:
            raise GGUFStructureError(
                "gguf.tensor_out_of_bounds", f"tensor {name!r} starts at {start}, past the end ({file_size})", name
            )
        if previous is not None:
            prev_start = previous.offset - data_offset
            prev_end = prev_start + previous.nbytes
            if rel_offset < prev_start:
                raise GGUFStructureError(
                    "gguf.tensor_out_of_order", f"tensor {name!r} is stored before {previous.name!r}", name
                )
            if rel_offset < prev_end:
                raise GGUFStructureError("gguf.tensor_overlap", f"tensor {name!r} overlaps {previous.name!r}", name)
            if rel_offset > _align(prev_end, alignment):
                raise GGUFStructureError(
                    "gguf.tensor_gap", f"{rel_offset - prev_end} unexplained bytes before tensor {name!r}", name
                )
        elif rel_offset != 0:
            raise GGUFStructureError("gguf.tensor_gap", f"first tensor {name!r} starts at {rel_offset}, not 0", name)
        if start + nbytes > file_size:
            raise GGUFStructureError(
                "gguf.truncated", f"tensor {name!r} needs {nbytes} bytes, {file_size - start} are left", name
            )
        previous = TensorInfo(name, shape, ggml_type, start, nbytes)
        infos.append(previous)
    return tuple(infos)


def _check_tokenizer(metadata: Mapping[str, Any]) -> None:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    if not isinstance(tokens, GGUFArray) or tokens.element_type is not ValueType.STRING:
        raise GGUFStructureError("gguf.bad_tokenizer_array", "tokenizer.ggml.tokens is not an array of strings")
    expected = (("tokenizer.ggml.scores", ValueType.FLOAT32), ("tokenizer.ggml.token_type", ValueType.INT32))
    for key, element_type in expected:
        value = metadata.get(key)
        if value is None:
            continue
        if not isinstance(value, GGUFArray) or value.element_type is not element_type:
            raise GGUFStructureError("gguf.bad_tokenizer_array", f"{key} is not an array of {element_type.name}")
        if len(value) != len(tokens):
            raise GGUFStructureError(
                "gguf.bad_tokenizer_array", f"{key} has {len(value)} entries for {len(tokens)} tokens"
            )
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is not None and (not isinstance(merges, GGUFArray) or merges.element_type is not ValueType.STRING):
        raise GGUFStructureError("gguf.bad_tokenizer_array", "tokenizer.ggml.merges is not an array of strings")
    for key in TOKEN_ID_KEYS:
        token_id = metadata.get(key)
        if token_id is not None and (not isinstance(token_id, int) or not 0 <= token_id < len(tokens)):
            raise GGUFStructureError("gguf.bad_tokenizer_array", f"{key}={token_id} is not a token of the vocabulary")


def parse_buffer(buffer: mmap.mmap | bytes, path: Path) -> GGUFLayout:
    """Validate a whole GGUF held in `buffer` (usually a read-only mmap)."""
    size = len(buffer)
    cur = _Cursor(buffer, size)
    version, n_tensors, n_kv = _read_header(cur)
    metadata = _read_metadata(cur, n_kv)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFStructureError("gguf.bad_alignment", f"general.alignment {alignment} is not a power of two")
    _check_tokenizer(metadata)
    if n_tensors * MIN_TENSOR_INFO_BYTES > cur.remaining:
        raise GGUFStructureError("gguf.bad_count", f"{n_tensors} tensors cannot fit in the rest of the file")
    seen: set[str] = set()
    entries = [_read_tensor_info(cur, seen) for _ in range(n_tensors)]
    data_offset = _align(cur.pos, alignment)
    tensors = _place_tensors(entries, data_offset, alignment, size)
    end = tensors[-1].offset + tensors[-1].nbytes if tensors else min(data_offset, size)
    if size > _align(end, alignment):
        raise GGUFStructureError("gguf.trailing_data", f"{size - _align(end, alignment)} bytes after the last tensor")
    return GGUFLayout(path, version, alignment, MappingProxyType(metadata), tensors, data_offset, size)


def read_layout(path: Path) -> GGUFLayout:
    """Open `path` read-only, memory-mapped, and validate its structure."""
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size == 0:
                raise GGUFStructureError("gguf.truncated", "the file is empty")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                return parse_buffer(buffer, path)
    except OSError as exc:
        raise GGUFStructureError("gguf.unreadable", f"cannot read {path.name}: {exc.strerror or exc}") from exc
