"""The `coverage` mark: which (architecture, type, importance matrix) outcome a test proves.

The coverage table in docs/coverage.md is generated from these marks (`scripts/coverage_table.py`),
so it claims exactly what a test in the suite proves, and the suite fails if any of those tests fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pytest

OUTCOMES = ("GO", "NO-GO")


@dataclass(frozen=True, slots=True)
class Claim:
    """One proven outcome: `types` of `arch` (quantized with an importance matrix or not) reach
    `proves` through `gates`; a NO-GO claim names the defect the test plants."""

    arch: str
    types: tuple[str, ...]
    imatrix: bool
    proves: str
    test: str
    gates: str = "1,2"
    defect: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def claims_of(item: pytest.Item) -> list[Claim]:
    """The claims one collected test makes; a malformed mark is an error, never silently dropped."""
    out = []
    for mark in item.iter_markers("coverage"):
        kwargs = dict(mark.kwargs)
        unknown = set(kwargs) - {"arch", "types", "imatrix", "proves", "defect", "gates"}
        if mark.args or unknown or "arch" not in kwargs or kwargs.get("proves") not in OUTCOMES:
            raise pytest.UsageError(f"{item.nodeid}: malformed coverage mark {mark}")
        if kwargs["proves"] == "NO-GO" and not kwargs.get("defect"):
            raise pytest.UsageError(f"{item.nodeid}: a NO-GO coverage mark must name its defect")
        types = kwargs.get("types", ())
        out.append(Claim(arch=str(kwargs["arch"]), types=(types,) if isinstance(types, str) else tuple(types),
                         imatrix=bool(kwargs.get("imatrix", False)), proves=kwargs["proves"], test=item.nodeid,
                         gates=str(kwargs.get("gates", "1,2")), defect=str(kwargs.get("defect", ""))))
    return out
