"""Item 14 from outside: the real CLI on every hand-made hostile input exits 1 with a verdict line or 2
with a one-line error; never a traceback, never 3 (internal error). Gates 1, 2 and 3 all run.

Every case runs the CLI in-process (typer's runner: the same command, options and exit-code translation,
without a new interpreter importing torch for each of 73 cases); a few run it as the process a user starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from tests.fuzz.hostile import CASES, Case, write_honest_pair

pytestmark = pytest.mark.slow
# one NO-GO from a hostile GGUF value, one refused source file, one refused safetensors header
IN_A_PROCESS = ("gguf-tokens-bad-utf8", "tokenizer-invalid-json", "safetensors-deep-nesting")


def _hostile_pair(tmp_path: Path, case: Case) -> list[str]:
    source, artifact = write_honest_pair(tmp_path)
    case.apply(source, artifact)
    return ["verify", "--source", str(source), "--artifact", str(artifact), "--cache-dir", str(tmp_path / "cache")]


def _assert_verdict_or_clear_error(code: int, stdout: str, stderr: str) -> None:
    output = stdout + stderr
    assert "Traceback" not in output, output[-2000:]
    assert code in (1, 2), output[-2000:]
    if code == 1:
        assert stdout.rstrip("\n").splitlines()[-1] == "NO-GO"
    else:
        assert stderr.startswith("convgate: ") and len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli_gives_a_verdict_or_a_clear_error(tmp_path: Path, case: Case) -> None:
    result = CliRunner().invoke(app, _hostile_pair(tmp_path, case))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    _assert_verdict_or_clear_error(result.exit_code, result.stdout, result.stderr)


@pytest.mark.parametrize("case", [c for c in CASES if c.name in IN_A_PROCESS],
                         ids=[c.name for c in CASES if c.name in IN_A_PROCESS])
def test_the_cli_process_gives_a_verdict_or_a_clear_error(tmp_path: Path, case: Case) -> None:
    result = subprocess.run([sys.executable, "-m", "service", *_hostile_pair(tmp_path, case)],
                            capture_output=True, text=True, timeout=300, check=False)
    _assert_verdict_or_clear_error(result.returncode, result.stdout, result.stderr)
