#!/usr/bin/env python3
"""The full mutation sweep: every metadata key and every tensor of each honest fixture, as twins.

Prints one line per missed twin and a table of twins made / caught / missed per fixture and kind.
Exit status 1 when any twin is missed. The test suite runs the same sweep with sampled tensors
(tests/mutation/test_twins.py).

Usage: python scripts/mutation_sweep.py [--fixtures .fixtures] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mutation.sweep import FIXTURES, sweep, tally  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=Path(os.environ.get("CONVGATE_FIXTURES", ROOT / ".fixtures")))
    parser.add_argument("--only", nargs="*", choices=sorted(FIXTURES), default=sorted(FIXTURES))
    args = parser.parse_args()
    rows = []
    missed_total = 0
    for name in args.only:
        folder, artifact = FIXTURES[name]
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as work:
            outcomes = sweep(args.fixtures / folder / "source", args.fixtures / folder / artifact, Path(work), None)
        for outcome in outcomes:
            if not outcome.caught:
                missed_total += 1
                print(f"MISSED {name} {outcome.twin.kind} {outcome.twin.describe}: {outcome.verdict} "
                      f"({outcome.explanation})")
        for kind, counts in sorted(tally(outcomes).items()):
            rows.append((name, kind, counts["caught"] + counts["missed"], counts["caught"], counts["missed"]))
        print(f"{name}: {len(outcomes)} twins in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print("\n| fixture | kind | twins | caught | missed |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    total = sum(r[2] for r in rows)
    print(f"\ntotal: {total} twins, {total - missed_total} caught, {missed_total} missed")
    return 1 if missed_total else 0


if __name__ == "__main__":
    sys.exit(main())
