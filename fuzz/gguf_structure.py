"""Fuzz target: the bounded GGUF structure parser on arbitrary bytes."""

from __future__ import annotations

from pathlib import Path

from engine.formats.gguf_structure import parse_buffer
from fuzz.common import main


def one_input(data: bytes) -> None:
    parse_buffer(data, Path("fuzz.gguf"))


if __name__ == "__main__":
    main(one_input)
