"""Rewrite a GGUF with one thing changed: a metadata value, a tensor's bytes, the tensor list.

Test tooling for the mutation sweep, independent of gguf-py: it reads the header with its own small
walker (keeping every value's wire type, which the verifier's parser does not need to keep) and
writes header, tensor table and re-aligned data back out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.formats.ggml_types import GGML_TYPES, SCALAR_FORMATS, ValueType


@dataclass(frozen=True)
class KV:
    key: str
    vtype: ValueType
    value: Any  # a scalar, str, or list for arrays
    element_type: ValueType | None = None


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    type_id: int
    data: bytes


@dataclass
class GGUFFile:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    alignment: int = 32
    extra: dict[str, Any] = field(default_factory=dict)

    def kv(self, key: str) -> KV:
        return next(kv for kv in self.kvs if kv.key == key)

    def with_kv(self, new: KV) -> GGUFFile:
        kvs = [new if kv.key == new.key else kv for kv in self.kvs]
        if all(kv.key != new.key for kv in self.kvs):
            kvs.append(new)
        return replace(self, kvs=kvs)

    def with_tensors(self, tensors: list[Tensor]) -> GGUFFile:
        return replace(self, tensors=tensors)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8")

    def value(self, vtype: ValueType) -> Any:
        if vtype is ValueType.STRING:
            return self.string()
        return self.scalar(SCALAR_FORMATS[vtype])


def read(path: Path) -> GGUFFile:
    raw = path.read_bytes()
    r = _Reader(raw)
    assert r.take(4) == b"GGUF"
    version = r.scalar("<I")
    n_tensors, n_kv = r.scalar("<q"), r.scalar("<q")
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        vtype = ValueType(r.scalar("<i"))
        if vtype is ValueType.ARRAY:
            element = ValueType(r.scalar("<i"))
            count = r.scalar("<Q")
            kvs.append(KV(key, vtype, [r.value(element) for _ in range(count)], element))
        else:
            kvs.append(KV(key, vtype, r.value(vtype)))
    alignment = next((int(kv.value) for kv in kvs if kv.key == "general.alignment"), 32)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = tuple(r.scalar("<q") for _ in range(r.scalar("<I")))
        type_id, offset = r.scalar("<i"), r.scalar("<Q")
        infos.append((name, dims, type_id, offset))
    data_start = r.pos + (-r.pos % alignment)
    tensors = []
    for name, dims, type_id, offset in infos:
        ggml = GGML_TYPES[type_id]
        count = 1
        for dim in dims:
            count *= dim
        start = data_start + offset
        tensors.append(Tensor(name, dims, type_id, raw[start:start + ggml.row_bytes(count)]))
    return GGUFFile(version, kvs, tensors, alignment)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: ValueType, value: Any) -> bytes:
    return _string(value) if vtype is ValueType.STRING else struct.pack(SCALAR_FORMATS[vtype], value)


def kv_bytes(kv: KV) -> bytes:
    """One key-value pair as the file stores it (sweeps that change one key reuse the others' bytes)."""
    out = _string(kv.key) + struct.pack("<i", kv.vtype)
    if kv.vtype is not ValueType.ARRAY:
        return out + _value(kv.vtype, kv.value)
    assert kv.element_type is not None
    return out + struct.pack("<iQ", kv.element_type, len(kv.value)) + b"".join(
        _value(kv.element_type, item) for item in kv.value)


def write(gguf: GGUFFile, path: Path, encoded: dict[str, bytes] | None = None) -> Path:
    """Write `gguf`; a key found in `encoded` is written as those bytes (`kv_bytes` of its value)."""
    encoded = encoded or {}
    out = bytearray(b"GGUF" + struct.pack("<Iqq", gguf.version, len(gguf.tensors), len(gguf.kvs)))
    for kv in gguf.kvs:
        out += encoded.get(kv.key) or kv_bytes(kv)
    offset = 0
    data = bytearray()
    for tensor in gguf.tensors:
        out += _string(tensor.name) + struct.pack("<I", len(tensor.shape))
        out += b"".join(struct.pack("<q", dim) for dim in tensor.shape)
        out += struct.pack("<iQ", tensor.type_id, offset)
        padded = tensor.data + b"\0" * (-len(tensor.data) % gguf.alignment)
        data += padded
        offset += len(padded)
    out += b"\0" * (-len(out) % gguf.alignment)
    path.write_bytes(bytes(out) + bytes(data))
    return path
