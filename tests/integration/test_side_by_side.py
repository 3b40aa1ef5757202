"""Threads from the pod, not the host: two verifications in two real 1-CPU cgroups (what two pods with
a 1-CPU limit are) on this 2-core machine. Each reads its budget from its own cgroup's quota, and
neither slows by more than 2.5x against running alone in the same cgroup.

The cgroups are real (cgroup v1 `cpu` or v2 `cpu.max`, created under /sys/fs/cgroup): the test needs
root and a writable cgroup filesystem, as the CI machine has; without them it fails and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path("/sys/fs/cgroup")
MAX_SLOWDOWN = 2.5
ENGLISH = Path(__file__).resolve().parents[2] / "examples" / "english.txt"


def _make_group(name: str) -> Path:
    """A cgroup limited to one CPU: v2 `cpu.max` when the unified hierarchy has the controller, else v1."""
    if (ROOT / "cgroup.controllers").is_file():
        group = ROOT / name
        group.mkdir()
        (group / "cpu.max").write_text("100000 100000\n")
        return group
    group = ROOT / "cpu" / name
    group.mkdir()
    (group / "cpu.cfs_period_us").write_text("100000\n")
    (group / "cpu.cfs_quota_us").write_text("100000\n")
    return group


@pytest.fixture
def one_cpu_groups():
    try:
        groups = [_make_group(f"convgate-test-{uuid.uuid4().hex[:8]}") for _ in range(2)]
    except OSError as exc:
        pytest.fail(f"this test runs verifications in real 1-CPU cgroups and needs root and a writable "
                    f"{ROOT}: {exc}")
    yield groups
    for group in groups:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:  # its last process may still be exiting
                time.sleep(0.1)


def _verify_in(group: Path, minilm: Path, policy: Path) -> tuple[float, dict]:
    command = [sys.executable, "-m", "service", "verify", "--source", str(minilm / "source"), "--artifact",
               str(minilm / "minilm-Q8_0.gguf"), "--gates", "1,2,3", "--json", "--texts", str(ENGLISH),
               "--policy", str(policy)]
    env = {key: value for key, value in os.environ.items() if key != "CONVGATE_THREADS"}
    started = time.perf_counter()
    result = subprocess.run(["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *command],
                            capture_output=True, text=True, timeout=600, env=env, check=False)
    assert result.returncode == 0, result.stdout[-1000:] + result.stderr[-2000:]
    return time.perf_counter() - started, json.loads(result.stdout.rsplit("\n", 2)[0])


def test_two_verifications_side_by_side_each_on_its_own_cpu(one_cpu_groups, minilm, tmp_path):
    policy = tmp_path / "policy.json"  # the labelled set (~250 texts a side) would only lengthen each run
    policy.write_text(json.dumps({"labelled_retrieval": False}))
    alone, report = _verify_in(one_cpu_groups[0], minilm, policy)
    assert report["verdict"] == "GO"
    assert report["environment"]["threads"] == "1"  # the quota, not this machine's 2 CPUs
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda group: _verify_in(group, minilm, policy), one_cpu_groups))
    slowdowns = [seconds / alone for seconds, _ in both]
    assert max(slowdowns) <= MAX_SLOWDOWN, f"alone {alone:.1f} s, side by side {[s for s, _ in both]}"
    assert all(report["verdict"] == "GO" for _, report in both)
