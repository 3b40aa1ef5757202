#!/usr/bin/env python3
"""Mutation score of the verifier's checks: run mutmut ([tool.mutmut] in pyproject.toml) and print,
per mutated file, the share of mutants the unit tests kill.

A mutant nobody's test notices ("survived" or "no tests") is a check that could be deleted with every
test still green. The target is at least 90% killed for every file listed; exit status 1 below it.

Usage: python scripts/mutation_score.py [--no-run] [--target 0.9]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\s*(?P<module>[\w.]+?)\.x[\u01c1_]\S*__mutmut_\d+: (?P<status>[\w ]+)$")


def scores(results: str) -> dict[str, Counter[str]]:
    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    for line in results.splitlines():
        if match := LINE.match(line):
            per_module[match["module"]][match["status"].strip()] += 1
    return per_module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-run", action="store_true", help="only report the last run's results")
    parser.add_argument("--target", type=float, default=0.9)
    args = parser.parse_args()
    mutmut = Path(sys.executable).parent / "mutmut"
    env = dict(os.environ, CONVGATE_FIXTURES=os.environ.get("CONVGATE_FIXTURES", str(ROOT / ".fixtures")))
    if not args.no_run:
        subprocess.run([mutmut, "run", "--max-children", str(os.cpu_count() or 1)], cwd=ROOT, env=env, check=False)
    results = subprocess.run([mutmut, "results", "--all", "true"], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True).stdout
    below = False
    print("| module | mutants | killed | survived | no tests | other | killed % |\n|---|---|---|---|---|---|---|")
    for module, counts in sorted(scores(results).items()):
        total = sum(counts.values())
        killed = counts["killed"]
        other = total - killed - counts["survived"] - counts["no tests"]
        share = killed / total if total else 0.0
        below |= share < args.target
        print(f"| {module} | {total} | {killed} | {counts['survived']} | {counts['no tests']} | {other} | "
              f"{share:.1%} |")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
