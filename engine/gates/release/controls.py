"""Gate 3's negative control: the released file with one byte changed in memory must fail the digest check.

The file is mapped copy-on-write (the planted byte stays in one private page), hashed, and judged by
`digest_changed`, the function gate 3 judges the real re-read with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from engine.controls.planted import Planted
from engine.gates.release import digest

CHECK = "release digest"


def release_control(artifact: Path, measured_sha256: str) -> Planted:
    copy = np.memmap(artifact, dtype=np.uint8, mode="c")  # copy-on-write: the file is never written
    byte = copy.size // 2
    copy[byte] ^= 1
    changed = digest.digest_changed(hashlib.sha256(copy.data).hexdigest(), measured_sha256, artifact.name)
    return Planted(check=CHECK, defect="one bit of the released file flipped", location=f"byte {byte}",
                   detected_by=(changed.code,) if changed else ())
