"""A GGUF string array held as its raw bytes plus one offset per string, decoded only when read.

Decoding every string of a metadata array up front costs a Python object per string (~50 bytes plus
the text): 30 MB of short strings became +240 MB. Kept this way an array costs its own bytes plus 8
per string, whatever the strings hold; invalid UTF-8 still decodes with surrogate escapes, as the
rest of the parser's strings do.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import overload

_LENGTH = struct.Struct("<Q")


class StringArray(Sequence[str]):
    """Read-only sequence of the strings of one GGUF array."""

    __slots__ = ("_blob", "_starts")

    def __init__(self, blob: bytes, starts: array) -> None:
        self._blob = blob
        self._starts = starts  # where each string's bytes begin in blob (its length prefix is the 8 before)

    def __len__(self) -> int:
        return len(self._starts)

    def _item(self, index: int) -> str:
        start = self._starts[index]
        end = self._starts[index + 1] - _LENGTH.size if index + 1 < len(self._starts) else len(self._blob)
        return self._blob[start:end].decode("utf-8", errors="surrogateescape")

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self._item(i) for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._item(index)

    def __iter__(self) -> Iterator[str]:
        return (self._item(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings, {len(self._blob)} bytes)"


def read_string_array(buffer: bytes | memoryview | object, pos: int, end: int, count: int,
                      fail: Callable[[str], Exception]) -> tuple[StringArray, int]:
    """Read `count` length-prefixed strings from `buffer[pos:end]`; returns the array and the new position.

    `fail(why)` builds the error raised when a length runs past `end`."""
    unpack = _LENGTH.unpack_from
    begin = pos
    starts = array("Q")
    append = starts.append
    for _ in range(count):
        if end - pos < _LENGTH.size:
            raise fail("the file ends inside a string length")
        (length,) = unpack(buffer, pos)  # type: ignore[arg-type]
        pos += _LENGTH.size
        if length > end - pos:
            raise fail(f"a string declares {length} bytes, more than the file holds")
        append(pos - begin)
        pos += length
    return StringArray(bytes(buffer[begin:pos]), starts), pos  # type: ignore[index]
