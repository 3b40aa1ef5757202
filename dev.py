#!/usr/bin/env python3
"""One entry point for people and CI: `python3 dev.py demo` and `python3 dev.py test`.

Needs nothing but Python 3.11: it creates `.venv` in the repository on first use, installs the
project (torch pinned to the CPU build first, so nothing pulls a CUDA wheel), builds the real-model
fixtures into `.fixtures/` and then runs. Re-installs only when pyproject.toml changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".convgate-installed"
TORCH = "torch==2.13.0"
FIXTURES = ROOT / ".fixtures"


def _run(*args: str | Path, env: dict[str, str] | None = None) -> int:
    print("+", " ".join(str(a) for a in args), file=sys.stderr, flush=True)
    return subprocess.call([str(a) for a in args], cwd=ROOT, env=env)


def _check(*args: str | Path) -> None:
    if _run(*args):
        sys.exit(f"dev.py: command failed: {' '.join(str(a) for a in args)}")


def ensure_venv() -> None:
    """Create the virtual environment and install the project once per pyproject change."""
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not PYTHON.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = (PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q")
    _check(*pip, "--upgrade", "pip")
    _check(*pip, TORCH)
    _check(*pip, "-e", f"{ROOT}[dev]")
    STAMP.write_text(wanted)


def build_fixtures(*names: str) -> None:
    _check(PYTHON, ROOT / "scripts" / "build_fixtures.py", "--out", FIXTURES, *names)


def demo() -> int:
    """A real verification, end to end, on the embedded default."""
    build_fixtures("minilm")
    reports = ROOT / "reports"
    reports.mkdir(exist_ok=True)
    report = reports / "demo-minilm-q8_0.json"
    code = _run(
        VENV / "bin" / "convgate", "verify",
        "--source", FIXTURES / "minilm" / "source",
        "--artifact", FIXTURES / "minilm" / "minilm-Q8_0.gguf",
        "--texts", ROOT / "examples" / "english.txt",
        "--cache-dir", FIXTURES / "cache",
        "--report", report,
    )
    print(f"\nfull JSON report: {report.relative_to(ROOT)}", file=sys.stderr)
    return code


def test(pytest_args: list[str]) -> int:
    """Lint, build every fixture, run the whole suite."""
    _check(VENV / "bin" / "ruff", "check", "worker", "service", "tests", "scripts", "dev.py")
    build_fixtures()
    env = dict(os.environ, CONVGATE_FIXTURES=str(FIXTURES))
    return _run(PYTHON, "-m", "pytest", *pytest_args, env=env)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"demo", "test", "setup"}:
        print("usage: python3 dev.py demo | test [pytest args] | setup", file=sys.stderr)
        return 2
    ensure_venv()
    command = sys.argv[1]
    if command == "demo":
        return demo()
    if command == "test":
        return test(sys.argv[2:])
    build_fixtures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
