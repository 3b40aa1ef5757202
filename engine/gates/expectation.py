"""One GGUF metadata key and the value the source says it must hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NO_DEFAULT = object()


@dataclass(frozen=True, slots=True)
class Expectation:
    """`expected` comes from `origin` (a file and field of the source).

    `default` is what llama.cpp assumes when the key is absent: an absent key is then accepted only if
    the source's value equals it. `optional` keys are compared when present and may be absent."""

    key: str
    expected: Any
    origin: str
    is_float: bool = False
    default: Any = NO_DEFAULT
    optional: bool = False
