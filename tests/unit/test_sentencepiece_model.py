"""The bounded reader of a SentencePiece tokenizer.model: the pieces, types and scores the converter reads, and a
clear `source.bad_file` for bytes that are not such a model, never a hang or an IndexError."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from engine.errors import SourceError
from engine.formats.sentencepiece_model import read_pieces

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))  # the scripts import each other by name
from fixtures_decoders import _field, _varint  # the fixtures' protobuf writer


def _piece(text: str, kind: int | None) -> bytes:
    body = _field(1, text.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", -1.5)
    return _field(1, body + (_varint(3 << 3) + _varint(kind) if kind is not None else b""))


def test_pieces_and_their_types_in_id_order_with_other_fields_skipped():
    model = _piece("<unk>", 2) + _piece("<s>", 3) + _piece("▁the", None) + _piece("<0x0A>", 6)
    model += _field(2, _varint(3 << 3) + _varint(2))  # trainer_spec, ignored
    assert read_pieces(model) == [("<unk>", 2, -1.5), ("<s>", 3, -1.5), ("▁the", 1, -1.5), ("<0x0A>", 6, -1.5)]


def test_a_piece_without_a_score_scores_zero_as_protobuf_defaults_it():
    assert read_pieces(_field(1, _field(1, b"a"))) == [("a", 1, 0.0)]


@pytest.mark.parametrize(("data", "why"), [
    (_field(1, _field(1, b"ok"))[:-1], "declares"),
    (b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "varint"),
    (_varint(1 << 3 | 3), "wire type"),
    (_field(1, _varint(3 << 3) + _varint(1)), "no text"),
    (_field(1, _field(1, b"\xff\xfe")), "UTF-8"),
    (_varint(1 << 3 | 2) + _varint(2**40) + b"x", "declares"),
])
def test_bytes_that_are_not_a_model_are_a_clear_refusal(data, why):
    with pytest.raises(SourceError, match=why) as caught:
        read_pieces(data)
    assert caught.value.code == "source.bad_file"
