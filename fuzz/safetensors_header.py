"""Fuzz target: the strict safetensors reader on a whole file (8-byte length, JSON header, data)."""

from __future__ import annotations

from engine.formats.safetensors_strict import read_safetensors
from fuzz.common import main, scratch


def one_input(data: bytes) -> None:
    path = scratch() / "fuzz.safetensors"
    path.write_bytes(data)
    read_safetensors(path)


if __name__ == "__main__":
    main(one_input)
