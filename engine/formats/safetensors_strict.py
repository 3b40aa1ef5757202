"""A strict safetensors header validator and memory-mapped tensor reader.

At least as strict as the `safetensors` library (a test compares the two): booleans are not
numbers, `__metadata__` is an object of strings when present, names are valid Unicode. Stricter
where the library is loose: it accepts duplicate tensor keys (the last one wins) and unknown
entry fields; we refuse both, and require the data region to be exactly covered by the tensors. Tensor data is
never copied up front: reads return views into a read-only memory map.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from engine.errors import SourceError
from engine.formats.json_input import parse_json

MAX_HEADER_BYTES = 100 * 1024 * 1024
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; widened to float32 by `to_float32`
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


@dataclass(frozen=True, slots=True)
class SafeTensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True, slots=True)
class SafetensorsFile:
    path: Path
    entries: MappingProxyType[str, SafeTensorEntry]
    metadata: MappingProxyType[str, str]

    def array(self, name: str) -> np.ndarray:
        """A read-only memory-mapped view of one tensor in its stored dtype."""
        entry = self.entries[name]
        dtype = DTYPES[entry.dtype]
        count = entry.nbytes // dtype.itemsize
        return np.memmap(self.path, dtype=dtype, mode="r", offset=entry.start, shape=(count,)).reshape(entry.shape)


def to_float32(values: np.ndarray, dtype: str) -> np.ndarray:
    """Widen stored values to float32 exactly (F16/BF16 widening is lossless)."""
    if dtype == "BF16":
        return (np.asarray(values, dtype=np.uint32) << 16).view(np.float32)
    return np.asarray(values, dtype=np.float32)


def _pairs_no_duplicates(path: Path):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise SourceError("source.duplicate_tensor", f"{path.name}: key {key!r} appears twice", key)
            seen[key] = value
        return seen

    return hook


def _natural(value: Any) -> bool:
    """A JSON non-negative integer; `True` is an `int` to Python, not to the safetensors format."""
    return type(value) is int and value >= 0


def _entry(path: Path, name: str, spec: Any, base: int, data_len: int) -> SafeTensorEntry:
    def bad(why: str) -> SourceError:
        return SourceError("source.bad_safetensors", f"{path.name}: tensor {name!r} {why}", name)

    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise bad("has a malformed entry")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad(f"has unsupported dtype {str(dtype)[:40]!r}")
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        raise bad("has an invalid shape")
    if (
        not isinstance(offsets, list) or len(offsets) != 2
        or not all(_natural(o) for o in offsets) or not offsets[0] <= offsets[1] <= data_len
    ):
        raise bad(f"has data offsets {offsets!r} outside the data region ({data_len} bytes)")
    count = 1
    for dim in shape:
        count *= dim
    nbytes = offsets[1] - offsets[0]
    if count * DTYPES[dtype].itemsize != nbytes:
        raise bad(f"declares {count} {dtype} elements in {nbytes} bytes")
    return SafeTensorEntry(name, dtype, tuple(shape), base + offsets[0], nbytes)


def read_safetensors(path: Path) -> SafetensorsFile:
    """Validate the header of `path` and return its tensor table."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise SourceError("source.bad_safetensors", f"{path.name}: too short for a header")
            header_len = struct.unpack("<Q", prefix)[0]
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise SourceError("source.bad_safetensors", f"{path.name}: header length {header_len} is impossible")
            raw = handle.read(header_len)
    except OSError as exc:
        raise SourceError("source.missing", f"cannot read {path.name}: {exc.strerror or exc}") from exc
    header = parse_json(raw, f"{path.name}: header", "source.bad_safetensors", _pairs_no_duplicates(path))
    if not isinstance(header, dict):
        raise SourceError("source.bad_safetensors", f"{path.name}: header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:  # the reference library reads null as "no metadata"
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SourceError("source.bad_safetensors", f"{path.name}: __metadata__ must map strings to strings")
    base = 8 + header_len
    data_len = size - base
    entries = {name: _entry(path, name, spec, base, data_len) for name, spec in header.items()}
    covered = 0
    for entry in sorted(entries.values(), key=lambda e: e.start):
        if entry.start - base != covered:
            raise SourceError(
                "source.bad_safetensors", f"{path.name}: tensor {entry.name!r} overlaps or leaves a hole", entry.name
            )
        covered += entry.nbytes
    if covered != data_len:
        raise SourceError("source.bad_safetensors", f"{path.name}: {data_len - covered} bytes not covered by tensors")
    return SafetensorsFile(path, MappingProxyType(entries), MappingProxyType(metadata))
