#!/usr/bin/env python3
"""Build (or reuse) promtool, which unit-tests the chart's alert rules (`promtool test rules`).

promtool comes from the Go module `github.com/prometheus/prometheus` through the wrapper module
kube/promtool (its own module: Prometheus requires other k8s.io client libraries than the control
plane and Kueue). It is built with the `remove_all_sd` tag, which leaves out the service-discovery
plugins (AWS, Azure, GCE, ...) that rule tests never use and that would more than double the build.

Cached outside the repository, keyed by the module version, like the control plane's binaries:

  ${CONVGATE_KUBE_CACHE:-~/.cache/convgate/kube}/promtool-<version>/bin/promtool

The stamp beside it records the inputs (go.sum digest, Go version, flags); a stale one is rebuilt.
The last line printed on stdout is the binary's path.

    python3 scripts/build_promtool.py            # build when missing, print the path
    python3 scripts/build_promtool.py --print    # only print the path
    python3 scripts/build_promtool.py --check    # exit 1 unless it is built
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from go_build import (
    KUBE,
    build_one,
    cache_root,
    commit_of,
    go_env,
    go_version,
    module_info,
    required_version,
    stamp_for,
)

MODULE = "github.com/prometheus/prometheus"
PACKAGE = f"{MODULE}/cmd/promtool"
TAGS = ("remove_all_sd",)


def log(msg: str) -> None:
    print(f"[build_promtool] {msg}", file=sys.stderr, flush=True)


def binary() -> Path:
    version = required_version(KUBE / "promtool", MODULE)
    return cache_root() / f"promtool-{version}" / "bin" / "promtool"


def build(force: bool = False) -> Path:
    """Build promtool unless a binary with the same stamp is cached; returns its path."""
    target = binary()
    bindir = target.parent
    env = go_env()
    version = required_version(KUBE / "promtool", MODULE)
    info = module_info(env, KUBE / "promtool", f"{MODULE}@{version}")
    # promtool --version reads these (github.com/prometheus/common/version)
    common = "github.com/prometheus/common/version"
    xflags = [f"{common}.Version={version.removeprefix('v')}", f"{common}.Revision={commit_of(info)}",
              f"{common}.Branch=release"]
    stamp = stamp_for(KUBE / "promtool", PACKAGE, xflags, go_version(env)) | {"tags": list(TAGS)}
    stamp_file = bindir / ".promtool.stamp.json"
    if not force and target.exists() and stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        log(f"promtool {version}: cached")
        return target
    bindir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    build_one(env, bindir, "promtool", KUBE / "promtool", PACKAGE, xflags, tags=TAGS)
    stamp_file.write_text(json.dumps(stamp, indent=2) + "\n")
    log(f"promtool {version}: built in {time.monotonic() - t0:.1f}s ({target.stat().st_size / 2**20:.0f} MiB)")
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--print", action="store_true", help="print the binary's path and exit")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the binary exists")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = ap.parse_args()
    if args.print or args.check:
        path = binary()
        if args.check and not path.exists():
            log(f"missing: {path}")
            return 1
        print(path)
        return 0
    print(build(args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
