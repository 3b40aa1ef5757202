"""The content-addressed download cache: files stored under their own sha256."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.digests import sha256_file


@dataclass(frozen=True)
class ContentStore:
    """`root/sha256/ab/abcdef...`; downloads land in `root/tmp` and are admitted under their digest."""

    root: Path

    def path_for(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def temp_file(self) -> Path:
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self.root / "tmp")
        os.close(handle)
        return Path(name)

    def admit(self, temp: Path, sha256: str) -> Path:
        target = self.path_for(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(temp, target)
        return target

    def cached(self, expected: str | None) -> Path | None:
        if expected is None:
            return None
        path = self.path_for(expected.lower())
        return path if path.is_file() and sha256_file(path) == expected.lower() else None
