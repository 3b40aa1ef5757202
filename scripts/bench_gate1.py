#!/usr/bin/env python3
"""Benchmark gate 1 against a baseline measured in the same run: gguf-py's plain dequantization
of the same file (GGUFReader + gguf.quants.dequantize of every tensor, no checks at all).

Each measurement runs in its own subprocess so peak RSS (the kernel's ru_maxrss) is per task.
Usage: python scripts/bench_gate1.py [--fixtures .fixtures] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

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
import sys, time
from pathlib import Path
from worker.gates.storage import run_storage_gate
from worker.policy import Policy
t = time.perf_counter()
result, blockers = run_storage_gate(Path(sys.argv[1]), Path(sys.argv[2]), Policy())
assert not blockers, blockers
n = sum(1 for _ in result.details["tensors"])
weights = sum(int(__import__("math").prod(r["shape"])) for r in result.details["tensors"])
print(time.perf_counter() - t, weights)
"""


def measure(code: str, *args: str) -> tuple[float, int, float]:
    """(seconds, weights, peak RSS MiB) of one run in a fresh interpreter."""
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    out = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmark child failed: {code[:40]!r}")
    seconds, weights = out.split()
    return float(seconds), int(weights), usage.ru_maxrss / 1024


def best_of(repeat: int, code: str, *args: str) -> tuple[float, int, float]:
    runs = [measure(code, *args) for _ in range(repeat)]
    return min(r[0] for r in runs), runs[0][1], max(r[2] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=Path(".fixtures"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    minilm = args.fixtures / "minilm"
    rows = []
    for name in ("F32", "Q4_K_M", "Q8_0"):
        artifact = str(minilm / f"minilm-{name}.gguf")
        base_s, base_n, base_rss = best_of(args.repeat, BASELINE, artifact)
        gate_s, gate_n, gate_rss = best_of(args.repeat, GATE1, artifact, str(minilm / "source"))
        rows.append({
            "fixture": f"minilm-{name}", "weights": gate_n,
            "gate1_s": round(gate_s, 3), "gate1_weights_per_s": round(gate_n / gate_s),
            "gate1_peak_rss_mib": round(gate_rss), "baseline_s": round(base_s, 3),
            "baseline_weights_per_s": round(base_n / base_s), "baseline_peak_rss_mib": round(base_rss),
            "time_ratio": round(gate_s / base_s, 2), "rss_ratio": round(gate_rss / base_rss, 2),
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"gate 1 vs gguf-py plain dequantization (best of {args.repeat}, {time.strftime('%Y-%m-%d')})")
    print(f"{'fixture':<16}{'weights':>10}{'gate1 s':>9}{'w/s':>12}{'RSS MiB':>9}"
          f"{'base s':>8}{'w/s':>12}{'RSS MiB':>9}{'time x':>8}{'RSS x':>7}")
    for r in rows:
        print(f"{r['fixture']:<16}{r['weights']:>10}{r['gate1_s']:>9}{r['gate1_weights_per_s']:>12,}"
              f"{r['gate1_peak_rss_mib']:>9}{r['baseline_s']:>8}{r['baseline_weights_per_s']:>12,}"
              f"{r['baseline_peak_rss_mib']:>9}{r['time_ratio']:>8}{r['rss_ratio']:>7}")


if __name__ == "__main__":
    main()
