"""What one negative control found, before it is timed and written into the report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from engine.blockers import Blocker


@dataclass(frozen=True, kw_only=True)
class Planted:
    """A defect planted in a copy of what a gate measured, and the blockers the gate's own comparison newly
    raised on it (`detected_by` None: nothing honest was left to plant a defect in, see `why`)."""

    check: str
    defect: str
    location: str | None = None
    detected_by: tuple[str, ...] | None = None
    why: str | None = None

    @property
    def outcome(self) -> Literal["detected", "not_detected", "not_applicable"]:
        if self.detected_by is None:
            return "not_applicable"
        return "detected" if self.detected_by else "not_detected"


def not_applicable(check: str, why: str) -> Planted:
    return Planted(check=check, defect="none planted", why=why)


def newly_raised(planted: Iterable[Blocker], honest: Iterable[Blocker]) -> tuple[str, ...]:
    """Codes of the blockers the planted copy raised that the honest measurement did not: a blocker the
    honest run already had proves nothing about the planted defect."""
    before = set(honest)
    return tuple(sorted({blocker.code for blocker in planted if blocker not in before}))
