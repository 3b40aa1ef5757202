#!/usr/bin/env python3
"""Redaction's property at scale: the suite's generator of secret-bearing URIs
(`tests/unit/test_redact_properties.py`, 10^5 URIs per run) run over 10^6 URIs, or --uris N. Exit status 0
when no URI leaked its secret; pytest prints the first URI that did, with the seed that rebuilds it.

Usage: python scripts/redact_property.py [--uris 1000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/unit/test_redact_properties.py::test_no_generated_uri_leaks_its_secret"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uris", type=int, default=1_000_000)
    args = parser.parse_args()
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST], cwd=ROOT,
                            env=dict(os.environ, CONVGATE_REDACT_URIS=str(args.uris)), check=False)
    verdict = "no leak" if result.returncode == 0 else "LEAKED"
    print(f"{args.uris:,} generated URIs: {verdict} ({time.perf_counter() - started:.0f} s)")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
