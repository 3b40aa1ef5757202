"""Item 14 from outside: the real CLI on every hand-made hostile input exits 1 with a verdict line or 2
with a one-line error; never a traceback, never 3 (internal error). Gates 1, 2 and 3 all run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.hostile import CASES, Case, write_honest_pair

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli_gives_a_verdict_or_a_clear_error(tmp_path: Path, case: Case) -> None:
    source, artifact = write_honest_pair(tmp_path)
    case.apply(source, artifact)
    result = subprocess.run(
        [sys.executable, "-m", "worker", "verify", "--source", str(source), "--artifact", str(artifact),
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-2000:]
    assert result.returncode in (1, 2), output[-2000:]
    if result.returncode == 1:
        assert result.stdout.rstrip("\n").splitlines()[-1] == "NO-GO"
    else:
        assert result.stderr.startswith("convgate: ") and len(result.stderr.strip().splitlines()) == 1
