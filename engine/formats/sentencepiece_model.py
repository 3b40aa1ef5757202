"""A SentencePiece `tokenizer.model` read for its pieces and their types, by a bounded protobuf reader.

Why: llama.cpp's converter builds a SentencePiece vocabulary's token types from this file (IsUnknown,
IsControl, IsByte...), not from tokenizer.json; a transformers 5 source keeps the two consistent in its
strings but not in what tokenizer.json calls special. Gate 1 must derive the types as the converter does,
so it reads the same file, with our own reader (the file is untrusted input like every other): every
length is checked against the bytes left before anything is sliced, nothing recurses, and only
`ModelProto.pieces` (field 1) and, inside each, `piece` (1), `score` (2) and `type` (3) are kept: the
converter writes the scores as `tokenizer.ggml.scores`, and llama.cpp's SentencePiece tokenizer merges by
them.
"""

from __future__ import annotations

import struct

from engine.errors import SourceError

MAX_PIECES = 4_000_000
NORMAL = 1  # SentencePiece's Type enum is GGUF's token-type numbering (NORMAL .. BYTE)
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _malformed(why: str) -> SourceError:
    return SourceError("source.bad_file", f"tokenizer.model is not a SentencePiece model: {why}")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    for index in range(at, min(at + 10, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise _malformed(f"a varint at byte {at} is truncated or too long")


def _fields(data: bytes, start: int, end: int) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one message, without descending into nested messages."""
    out: list[tuple[int, int, int | bytes]] = []
    at = start
    while at < end:
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, at = _varint(data, at)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            if at + size > end:
                raise _malformed(f"field {number} runs past its message")
            value, at = int.from_bytes(data[at:at + size], "little"), at + size
        elif wire == _LENGTH:
            size, at = _varint(data, at)
            if size > end - at:
                raise _malformed(f"field {number} declares {size} bytes, {end - at} are left")
            value, at = data[at:at + size], at + size
        else:
            raise _malformed(f"field {number} has wire type {wire}, which a ModelProto does not use")
        out.append((number, wire, value))
    return out


def read_pieces(data: bytes) -> list[tuple[str, int, float]]:
    """Every piece of the model in id order: (text, type, score); protobuf's defaults where a field is absent."""
    pieces: list[tuple[str, int, float]] = []
    for number, wire, value in _fields(data, 0, len(data)):
        if number != 1 or wire != _LENGTH:
            continue
        if len(pieces) >= MAX_PIECES:
            raise _malformed(f"more than {MAX_PIECES} pieces")
        assert isinstance(value, bytes)
        text, kind, score = None, NORMAL, 0.0
        for inner, inner_wire, inner_value in _fields(value, 0, len(value)):
            if inner == 1 and inner_wire == _LENGTH:
                try:
                    text = bytes(inner_value).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _malformed(f"piece {len(pieces)} is not UTF-8") from exc
            elif inner == 2 and inner_wire == _FIXED32:
                score = struct.unpack("<f", int(inner_value).to_bytes(4, "little"))[0]
            elif inner == 3 and inner_wire == _VARINT:
                kind = int(inner_value)
        if text is None:
            raise _malformed(f"piece {len(pieces)} has no text")
        pieces.append((text, kind, score))
    return pieces
