"""The packages' import contracts (pyproject.toml, [tool.importlinter]), checked by import-linter's own
command: the engine imports neither the edge nor the service, nor any HTTP, SQL or server library; the
edge does not import the service; inside the service the API sits on dispatch, and dispatch on
persistence, never the other way (docs/architecture.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_every_import_contract_is_kept() -> None:
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert command, "import-linter is a dev dependency: lint-imports must be installed"
    result = subprocess.run([command, "--no-cache"], check=False, cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in result.stdout
