"""The frames the verifier and its llama.cpp child exchange: a JSON header and raw numeric arrays.

Why not pickle: the child parses a hostile file with a large native library, so it is the least
trusted process of a verification. Unpickling its answers would hand a compromised child code
execution in the verifier. A frame is a 4-byte length, a JSON header, and, for every array the header
declares, exactly its bytes: nothing the parent decodes can run code, and every size is checked
against a cap before anything is allocated.
"""

from __future__ import annotations

import json
import math
import struct
from typing import IO, Any

import numpy as np

from engine.errors import ConvgateError

# dtypes an array may have on the wire: little-endian numbers only, never objects
ARRAY_DTYPES = frozenset({"<f4", "<f8", "<i4", "<i8"})
MAX_HEADER_BYTES = 16 * 2**20
MAX_ARRAY_BYTES = 8 * 2**30
_LENGTH = struct.Struct("<I")


class WireError(ConvgateError):
    """A frame that is truncated, oversized or not what the protocol allows."""

    code = "engine.wire_invalid"


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks = []
    left = size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError(f"the stream ended {left} bytes before the end of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_frame(stream: IO[bytes], header: dict[str, Any], arrays: tuple[np.ndarray, ...] = ()) -> None:
    """One message: `header` (JSON values only) and `arrays`, described in the header under `arrays`."""
    described = []
    payloads = []
    for array in arrays:
        contiguous = np.ascontiguousarray(array)
        dtype = contiguous.dtype.newbyteorder("<").str
        if dtype not in ARRAY_DTYPES:
            raise WireError(f"arrays of dtype {contiguous.dtype} are not sent")
        described.append({"dtype": dtype, "shape": list(contiguous.shape)})
        payloads.append(contiguous.astype(dtype, copy=False).tobytes())
    body = json.dumps({**header, "arrays": described}, allow_nan=True).encode()
    stream.write(_LENGTH.pack(len(body)) + body)
    for payload in payloads:
        stream.write(payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The next message; `EOFError` when the peer is gone before a whole frame arrived."""
    (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a frame header of {length} bytes exceeds {MAX_HEADER_BYTES}")
    header = json.loads(_read_exactly(stream, length))
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        raise WireError("a frame header is not an object with an array list")
    arrays = []
    for spec in header.pop("arrays"):
        dtype, shape = (spec.get("dtype"), spec.get("shape")) if isinstance(spec, dict) else (None, None)
        if dtype not in ARRAY_DTYPES or not isinstance(shape, list) or not all(
                type(n) is int and n >= 0 for n in shape):
            raise WireError(f"an array is described as {str(spec)[:80]!r}")
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if size > MAX_ARRAY_BYTES:
            raise WireError(f"an array of {size} bytes exceeds {MAX_ARRAY_BYTES}")
        arrays.append(np.frombuffer(_read_exactly(stream, size), dtype=dtype).reshape(shape))
    return header, arrays
