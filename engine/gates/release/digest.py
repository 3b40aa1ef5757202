"""Gate 3's first check, and its negative control's judge: the released bytes must be the bytes measured."""

from __future__ import annotations

from engine.blockers import Blocker


def digest_changed(actual_sha256: str, measured_sha256: str, name: str) -> Blocker | None:
    """The released bytes must be the bytes measured: any other digest is another file."""
    if actual_sha256 == measured_sha256:
        return None
    return Blocker(code="release.file_changed", gate="release",
                   why=f"{name} changed after it was measured; it is not the file verified")
