"""The progress callback the engine reports through; the CLI draws bars, services record it."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]  # (stage, done, total)


def no_progress(stage: str, done: int, total: int) -> None:
    """The default: report nothing."""
