#!/usr/bin/env python3
"""Run each fuzz target (fuzz/targets.py) for a set time; save any crasher into its corpus.

With atheris installed, each target runs coverage-guided under libFuzzer in a child process, seeded
from a scratch copy of fuzz/corpus/<target> (the repo's corpus only gains crashers, never the
fuzzer's bulk). Without atheris, or with --driver random, a plain random-mutation driver runs the
same targets in-process. A crasher is written to fuzz/corpus/<target>/crash-<sha1>; fix the code,
keep the file, and tests/fuzz/test_corpus_replay.py replays it forever after.

Usage: python scripts/fuzz.py --seconds 60 [--driver atheris|random] [target ...]
Exit status 1 when any target crashed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fuzz.common import ALLOWED, CORPUS  # noqa: E402
from fuzz.targets import TARGETS  # noqa: E402

INTERESTING = (b"\x00", b"\xff", b"\x7f", b"\x80", b"\xff\xff\xff\xff", b"\x00\x00\x00\x80", b"\xff" * 8,
               b"\x00" * 8, b'"', b"[", b"{", b"}", b"]", b"\\ud800", b"9" * 4400, b"true", b"null", b"-1", b"1e999")


def save_crasher(target: str, data: bytes) -> Path:
    path = CORPUS / target / f"crash-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    return path


def mutate(data: bytes, seeds: list[bytes], rng: random.Random) -> bytes:
    """One to four random edits: bit flip, byte set, insert/delete a run, splice a seed, interesting value."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        pos = rng.randrange(len(out) + 1)
        if kind == 0 and out:
            out[min(pos, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1 and out:
            out[min(pos, len(out) - 1)] = rng.randrange(256)
        elif kind == 2:
            out[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 3 and out:
            del out[pos:pos + rng.randint(1, 32)]
        elif kind == 4:
            other = rng.choice(seeds)
            start = rng.randrange(len(other) + 1)
            out[pos:] = other[start:start + rng.randint(1, 256)] + out[pos:]
        else:
            value = rng.choice(INTERESTING)
            out[pos:pos + len(value)] = value
    return bytes(out)


def run_random(target: str, seconds: float, seed: int) -> int:
    """In-process random mutation of the saved corpus; returns the number of crashes found."""
    function = TARGETS[target]
    seeds = [p.read_bytes() for p in sorted((CORPUS / target).iterdir())] or [b""]
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    runs = crashes = 0
    while time.monotonic() < deadline:
        data = mutate(rng.choice(seeds), seeds, rng)
        runs += 1
        try:
            function(data)
        except ALLOWED:
            pass
        except Exception:  # a crash: anything that is not a coded error
            crashes += 1
            path = save_crasher(target, data)
            print(f"{target}: CRASH saved to {path.relative_to(ROOT)}\n{traceback.format_exc(limit=3)}")
    print(f"{target}: {runs} inputs in {seconds:.0f}s (random driver), {crashes} crash(es)")
    return crashes


def run_atheris(target: str, seconds: float) -> int:
    """libFuzzer via atheris in a child process; a crash stops the child with a saved artifact."""
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as scratch:
        work = Path(scratch) / "corpus"
        shutil.copytree(CORPUS / target, work)
        artifacts = Path(scratch) / "artifacts"
        artifacts.mkdir()
        command = [sys.executable, "-m", f"fuzz.{target}", f"-max_total_time={int(seconds)}",
                   f"-artifact_prefix={artifacts}/", "-rss_limit_mb=2048", "-timeout=30", str(work)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        found = sorted(artifacts.iterdir())
        for artifact in found:
            print(f"{target}: CRASH saved to {save_crasher(target, artifact.read_bytes()).relative_to(ROOT)}")
        if found:
            print(result.stderr[-3000:])
        stats = [line for line in result.stderr.splitlines() if line.startswith("#") and "DONE" in line]
        print(f"{target}: {stats[-1] if stats else 'ended'} (atheris), {len(found)} crash(es)")
        return len(found) or (result.returncode != 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", choices=[*TARGETS, []], help="default: every target")
    parser.add_argument("--seconds", type=float, default=60, help="time per target")
    parser.add_argument("--driver", choices=("atheris", "random"), default=None,
                        help="default: atheris when installed, else random")
    parser.add_argument("--seed", type=int, default=0, help="random driver's seed")
    args = parser.parse_args()
    driver = args.driver or ("atheris" if importlib.util.find_spec("atheris") else "random")
    crashed = 0
    for target in args.targets or list(TARGETS):
        crashed += run_atheris(target, args.seconds) if driver == "atheris" else run_random(target, args.seconds,
                                                                                           args.seed)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
