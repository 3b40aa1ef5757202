"""Fuzz target: a GGUF's metadata values through gate 1 (metadata check, inventory, values) and the report.

The input is a whole GGUF file judged against a fixed honest tiny source; mutating a seed's value
bytes and type tags gives structurally valid files with wrong-typed or odd values, which is where
the metadata check and the report writer used to crash.
"""

from __future__ import annotations

from fuzz.common import gate1, honest_copy, main


def one_input(data: bytes) -> None:
    source, artifact = honest_copy("gguf_metadata")
    artifact.write_bytes(data)
    gate1(source, artifact)


if __name__ == "__main__":
    main(one_input)
