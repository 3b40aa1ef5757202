"""Fuzz target: model.safetensors.index.json in an otherwise honest source, through open_source."""

from __future__ import annotations

from engine.formats.source import INDEX_NAME, open_source
from fuzz.common import honest_copy, main


def one_input(data: bytes) -> None:
    source, _ = honest_copy("shard_index")
    (source / INDEX_NAME).write_bytes(data)
    open_source(source)


if __name__ == "__main__":
    main(one_input)
