"""Every benchmark script runs once, on its smallest input, so none can rot unnoticed (bench_gate1.py
was broken for a release because nothing ran it). Each must print its ratio against the baseline it
measures in the same run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
BENCHMARKS = sorted(path.name for path in SCRIPTS.glob("bench_*.py"))
SMOKE_ARGS = {
    "bench_gate1.py": ["--smoke"],
    "bench_gates.py": ["--smoke"],
    "bench_api.py": ["--seconds", "1", "--connections", "4", "--verdicts", "2000"],
    "bench_scale.py": ["--smoke"],
    "bench_export.py": ["--smoke"],
    "bench_7b.py": ["--smoke", "--verify", "split"],
}
FIXTURE_SCRIPTS = {"bench_gate1.py", "bench_gates.py", "bench_scale.py", "bench_7b.py"}
RATIO = {
    "bench_gate1.py": r"minilm-F32\s+\d+.*\s\d+\.\d+\s+\d+\.\d+$",
    "bench_gates.py": r"full verify / baseline = \d+\.\d+x",
    "bench_api.py": r"POST /v1/verifications\s+throughput \d+\.\d+x, p99 \d+\.\d+x",
    "bench_scale.py": r"baseline",
    "bench_export.py": r"peak large / peak small = \d+\.\d+x",
    "bench_7b.py": r"-00001-of-00003\.gguf\s+\d+ s / \d+ s = \d+\.\d+x",
}


def test_every_benchmark_has_a_smoke_run():
    assert set(BENCHMARKS) <= set(SMOKE_ARGS), "a new bench_*.py needs its smallest-input arguments here"


@pytest.mark.parametrize("script", BENCHMARKS)
def test_benchmark_runs_on_its_smallest_input(script, minilm, qwen3):
    """bench_api.py needs Postgres (CONVGATE_TEST_PG, as the service tests): it fails, never skips, without."""
    fixtures = ["--fixtures", str(minilm.parent)] if script in FIXTURE_SCRIPTS else []
    result = subprocess.run([sys.executable, str(SCRIPTS / script), *SMOKE_ARGS[script], *fixtures],
                            capture_output=True, text=True, timeout=900, env=os.environ, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert re.search(RATIO[script], result.stdout, re.MULTILINE), result.stdout
