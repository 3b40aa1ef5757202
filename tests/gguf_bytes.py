"""Build GGUF files byte by byte, so tests can write every malformed case by hand."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from engine.formats.ggml_types import SCALAR_FORMATS, ValueType


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_scalar(key: str, value_type: ValueType, value: Any) -> bytes:
    return gguf_string(key) + struct.pack("<i", value_type) + struct.pack(SCALAR_FORMATS[value_type], value)


def kv_string(key: str, value: str) -> bytes:
    return gguf_string(key) + struct.pack("<i", ValueType.STRING) + gguf_string(value)


def kv_array(key: str, element_type: ValueType, values: list[Any]) -> bytes:
    body = struct.pack("<iQ", element_type, len(values))
    for value in values:
        body += gguf_string(value) if element_type is ValueType.STRING else struct.pack(
            SCALAR_FORMATS[element_type], value
        )
    return gguf_string(key) + struct.pack("<i", ValueType.ARRAY) + body


def tensor_info(name: str | bytes, shape: tuple[int, ...], type_id: int, offset: int) -> bytes:
    raw = name.encode() if isinstance(name, str) else name
    out = struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(shape))
    out += b"".join(struct.pack("<q", dim) for dim in shape)
    return out + struct.pack("<iQ", type_id, offset)


@dataclass
class GGUFBytes:
    """A small, valid GGUF by default; every field can be overridden to make it invalid."""

    magic: bytes = b"GGUF"
    version: int = 3
    kvs: list[bytes] = field(default_factory=lambda: [kv_string("general.architecture", "test")])
    tensors: list[bytes] = field(default_factory=list)
    data: bytes = b""
    n_tensors: int | None = None
    n_kv: int | None = None
    alignment: int = 32
    trailing: bytes = b""

    def with_f32_tensors(self, *specs: tuple[str, int]) -> GGUFBytes:
        """Add contiguous, aligned F32 tensors named and sized as given."""
        offset = 0
        data = b""
        for name, count in specs:
            self.tensors.append(tensor_info(name, (count,), 0, offset))
            chunk = struct.pack(f"<{count}f", *range(count))
            padded = -len(chunk) % self.alignment
            data += chunk + b"\0" * padded
            offset += len(chunk) + padded
        self.data = data
        return self

    def build(self) -> bytes:
        header = self.magic + struct.pack("<I", self.version)
        header += struct.pack("<q", len(self.tensors) if self.n_tensors is None else self.n_tensors)
        header += struct.pack("<q", len(self.kvs) if self.n_kv is None else self.n_kv)
        body = header + b"".join(self.kvs) + b"".join(self.tensors)
        body += b"\0" * (-len(body) % self.alignment)
        return body + self.data + self.trailing
