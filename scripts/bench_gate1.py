#!/usr/bin/env python3
"""Benchmark gate 1 against a baseline measured in the same run: gguf-py's plain dequantization
of the same file (GGUFReader + gguf.quants.dequantize of every tensor, no checks at all).

Each measurement runs in its own subprocess so peak RSS (the kernel's ru_maxrss) is per task.
Gate 1 is also run with a process pool of the CPU budget (at least 2) to show how it scales.
Usage: python scripts/bench_gate1.py [--fixtures .fixtures] [--repeat 3] [--smoke] [--source DIR --artifact GGUF ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.resources import cpu_budget

BASELINE = """
import sys, time, numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
t = time.perf_counter()
reader = GGUFReader(sys.argv[1])
n = 0
for tensor in reader.tensors:
    values = dequantize(np.asarray(tensor.data), tensor.tensor_type)
    n += values.size
print(time.perf_counter() - t, n)
"""

GATE1 = """
import math, sys, time
from pathlib import Path
from engine.formats.gguf_structure import read_layout
from engine.formats.source import open_source
from engine.gates.storage import value_checks
from engine.gates.storage.gate import run_storage_gate
from engine.policy import Policy
if __name__ == "__main__":
    value_checks.PARALLEL_MIN_WEIGHTS = 0  # the pool whenever CONVGATE_THREADS > 1, whatever the model's size
    t = time.perf_counter()
    artifact = Path(sys.argv[1])
    result, blockers = run_storage_gate(artifact, read_layout(artifact), open_source(Path(sys.argv[2])), Policy())
    assert not blockers, blockers
    print(time.perf_counter() - t, sum(math.prod(row["shape"]) for row in result.details["tensors"]))
"""


def measure(code: str, *args: str, threads: int = 1) -> tuple[float, int, float]:
    """(seconds, weights, peak RSS MiB) of one run in a fresh interpreter with `threads` CPUs."""
    env = {**os.environ, "CONVGATE_THREADS": str(threads)}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(code)  # a file, not -c: the spawned pool processes re-import the main module
    process = subprocess.Popen([sys.executable, script.name, *args], stdout=subprocess.PIPE, text=True, env=env)
    out = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    Path(script.name).unlink()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmark child failed: {code[:40]!r}")
    seconds, weights = out.split()
    return float(seconds), int(weights), usage.ru_maxrss / 1024  # the child's, its reaped pool included


def best_of(repeat: int, code: str, *args: str, threads: int = 1) -> tuple[float, int, float]:
    runs = [measure(code, *args, threads=threads) for _ in range(repeat)]
    return min(r[0] for r in runs), runs[0][1], max(r[2] for r in runs)


def _row(name: str, artifact: str, source: str, repeat: int, cpus: int) -> dict:
    base_s, base_n, base_rss = best_of(repeat, BASELINE, artifact)
    gate_s, gate_n, gate_rss = best_of(repeat, GATE1, artifact, source)
    pool_s, _, _ = best_of(repeat, GATE1, artifact, source, threads=cpus)
    return {
        "fixture": name, "weights": gate_n,
        "gate1_s": round(gate_s, 3), "gate1_weights_per_s": round(gate_n / gate_s),
        "gate1_peak_rss_mib": round(gate_rss), "baseline_s": round(base_s, 3),
        "baseline_weights_per_s": round(base_n / base_s), "baseline_peak_rss_mib": round(base_rss),
        "time_ratio": round(gate_s / base_s, 2), "rss_ratio": round(gate_rss / base_rss, 2),
        "pool_processes": cpus, "pool_s": round(pool_s, 3), "pool_speedup": round(gate_s / pool_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=Path(".fixtures"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one fixture, one run (the test suite's check)")
    parser.add_argument("--source", type=Path, help="another model's source directory (with --artifact)")
    parser.add_argument("--artifact", type=Path, action="append", help="a GGUF of --source (repeatable)")
    args = parser.parse_args()
    minilm = args.fixtures / "minilm"
    cpus = max(2, cpu_budget())
    names = ("F32",) if args.smoke else ("F32", "Q4_K_M", "Q8_0")
    repeat = 1 if args.smoke else args.repeat
    cases = ([(path.stem, str(path), str(args.source)) for path in args.artifact] if args.source and args.artifact
             else [(f"minilm-{name}", str(minilm / f"minilm-{name}.gguf"), str(minilm / "source")) for name in names])
    rows = [_row(name, artifact, source, repeat, cpus) for name, artifact, source in cases]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"gate 1 vs gguf-py plain dequantization (best of {repeat}, {time.strftime('%Y-%m-%d')}); "
          f"pool: gate 1 with {cpus} processes vs 1")
    print(f"{'fixture':<16}{'weights':>10}{'gate1 s':>9}{'w/s':>12}{'RSS MiB':>9}"
          f"{'base s':>8}{'w/s':>12}{'RSS MiB':>9}{'time x':>8}{'RSS x':>7}{'pool s':>8}{'speedup':>8}")
    for r in rows:
        print(f"{r['fixture']:<16}{r['weights']:>10}{r['gate1_s']:>9}{r['gate1_weights_per_s']:>12,}"
              f"{r['gate1_peak_rss_mib']:>9}{r['baseline_s']:>8}{r['baseline_weights_per_s']:>12,}"
              f"{r['baseline_peak_rss_mib']:>9}{r['time_ratio']:>8}{r['rss_ratio']:>7}{r['pool_s']:>8}"
              f"{r['pool_speedup']:>8}")


if __name__ == "__main__":
    main()
