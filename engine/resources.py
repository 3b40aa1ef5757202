"""How many CPUs a verification may use: the pod's cgroup quota, not the host's core count.

A pod with a 2-CPU limit on a 64-core node sees 64 CPUs through `os.cpu_count()`; torch, OpenMP,
BLAS and llama.cpp would each start 64 spinning threads and be throttled by the quota, which made a
second verification beside the first 9-20x slower. Every thread pool is sized from `cpu_budget()`:
the `CONVGATE_THREADS` setting when given, else the tightest CPU quota of this process's cgroup and
its ancestors (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), rounded up, capped by the CPUs this process may
be scheduled on. The llama.cpp child's private-memory cap (`llama_memory_limit`) comes from the same
cgroup, or from `CONVGATE_LLAMA_MEMORY_MB`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from engine.errors import ConvgateError

THREADS_SETTING = "CONVGATE_THREADS"
CGROUP_ROOT = Path("/sys/fs/cgroup")


class ThreadSettingError(ConvgateError, ValueError):
    """`CONVGATE_THREADS` or `CONVGATE_LLAMA_MEMORY_MB` is not a positive integer."""

    code = "worker.setting_invalid"


def _quota(text: str) -> float | None:
    """CPUs from a v2 `cpu.max` line ("max 100000" or "200000 100000"), None when unlimited."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = int(fields[0]), int(fields[1])
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _v2_limits(root: Path, group: str) -> list[float]:
    """The quota of the process's v2 group and every ancestor (the effective limit is the tightest)."""
    limits = []
    directory = root / group.strip("/")
    while True:
        text = _read(directory / "cpu.max")
        found = _quota(text) if text else None
        if found is not None:
            limits.append(found)
        if directory == root or root not in directory.parents:
            return limits
        directory = directory.parent


def _v1_limits(root: Path, group: str) -> list[float]:
    limits = []
    for base in (root / "cpu", root / "cpu,cpuacct"):
        directory = base / group.strip("/")
        while base == directory or base in directory.parents:
            quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
            if quota and period and int(quota) > 0 and int(period) > 0:
                limits.append(int(quota) / int(period))
            if directory == base:
                break
            directory = directory.parent
    return limits


def _groups(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(v2 group path, v1 cpu controller group path) from /proc/self/cgroup."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """CPUs the cgroup quota allows this process (fractional), or None when no quota is set."""
    text = proc_cgroup if proc_cgroup is not None else (_read(Path("/proc/self/cgroup")) or "")
    v2, v1 = _groups(text)
    limits = (_v2_limits(root, v2) if v2 is not None else []) + (_v1_limits(root, v1) if v1 is not None else [])
    return min(limits) if limits else None


def _schedulable() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_budget(environ: Mapping[str, str] | None = None, root: Path = CGROUP_ROOT,
               proc_cgroup: str | None = None) -> int:
    """Threads (and gate-1 processes) a verification should use: the setting, else the pod's CPU limit."""
    environ = os.environ if environ is None else environ
    setting = environ.get(THREADS_SETTING, "").strip()
    if setting:
        if not setting.isdigit() or int(setting) < 1:
            raise ThreadSettingError(f"{THREADS_SETTING} must be a positive integer, not {setting!r}")
        return int(setting)
    limit = cgroup_cpu_limit(root, proc_cgroup)
    schedulable = _schedulable()
    return max(1, min(schedulable, math.ceil(limit))) if limit is not None else schedulable


def limit_native_threads(threads: int) -> None:
    """Caps the BLAS/OpenMP pools already loaded into this process (numpy's, torch's) and torch's own."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


LLAMA_MEMORY_SETTING = "CONVGATE_LLAMA_MEMORY_MB"


def _memory_limit(root: Path, proc_cgroup: str) -> int | None:
    """Bytes the memory cgroup allows this process (v2 `memory.max`, v1 `memory.limit_in_bytes`), or None."""
    limits = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            text = _read(root / parts[2].strip("/") / "memory.max")
        elif "memory" in parts[1].split(","):
            text = _read(root / "memory" / parts[2].strip("/") / "memory.limit_in_bytes")
        else:
            continue
        if text and text.strip().isdigit() and int(text) < 2**62:  # v1 writes "unlimited" as a huge number
            limits.append(int(text))
    return min(limits) if limits else None


def llama_memory_limit(environ: Mapping[str, str] | None = None, root: Path = CGROUP_ROOT,
                       proc_cgroup: str | None = None) -> int | None:
    """Private memory (bytes) the llama.cpp child may allocate: `CONVGATE_LLAMA_MEMORY_MB` when set, else the
    pod's memory limit (the child alone may never need more than the pod has), else no limit."""
    environ = os.environ if environ is None else environ
    setting = environ.get(LLAMA_MEMORY_SETTING, "").strip()
    if setting:
        if not setting.isdigit() or int(setting) < 1:
            raise ThreadSettingError(f"{LLAMA_MEMORY_SETTING} must be a positive integer (MiB), not {setting!r}")
        return int(setting) * 2**20
    text = proc_cgroup if proc_cgroup is not None else (_read(Path("/proc/self/cgroup")) or "")
    return _memory_limit(root, text)
