"""Fuzz target: the bounded GGUF structure parser on arbitrary bytes."""

from __future__ import annotations

from pathlib import Path

from fuzz.common import main
from worker.formats.gguf_structure import parse_buffer


def one_input(data: bytes) -> None:
    parse_buffer(data, Path("fuzz.gguf"))


if __name__ == "__main__":
    main(one_input)
