#!/usr/bin/env python3
"""Build (or reuse) the binaries of the real control plane used by tests/cluster.

These binaries come from Go modules through the wrapper modules under kube/:

  kube/controlplane  ->  kube-apiserver, kube-controller-manager,  (k8s.io/kubernetes)
                         and for the real node kubelet, kube-scheduler, kube-proxy, kubectl
  kube/etcd          ->  etcd                                      (go.etcd.io/etcd/server/v3)
  kube/kueue         ->  kueue                                     (sigs.k8s.io/kueue/cmd/kueue)

then scripts/build_node.py builds the rest of the node (containerd, its runc shim, ctr, the CNI
plugins, the pause and busybox images; runc from Debian) into its own cache dir, and
scripts/build_promtool.py builds promtool (the alert rules' unit tests) into its own.

They are cached outside the repository, keyed by the module versions:

  ${CONVGATE_KUBE_CACHE:-~/.cache/convgate/kube}/<k8s>-<etcd>-<kueue>/bin/

Each binary is built to a temporary name and renamed into place, so an interrupted build never
leaves a half-written binary behind. A stamp file beside each binary records the inputs (go.sum
digest, Go version, flags); a binary whose stamp does not match is rebuilt. Kueue's `config/`
directory (CRDs, webhook configurations, visibility APIService, ...) is copied from the module
cache to `<key>/kueue-config/` for the test harness.

The last line printed on stdout is the bin directory. Progress and timings go to stderr.

    python3 scripts/build_kube.py            # build what is missing, print the bin dir
    python3 scripts/build_kube.py --print    # only print the bin dir (no build)
    python3 scripts/build_kube.py --check    # exit 1 unless every binary is present (the node's too)
    python3 scripts/build_kube.py --sync-staging   # after bumping k8s.io/kubernetes in
                                                   # kube/controlplane/go.mod: rewrite the replaces
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import build_node
import build_promtool
from go_build import (
    KUBE,
    build_date,
    build_one,
    commit_of,
    go_env,
    go_version,
    key_dir,
    module_info,
    stamp_for,
    versions,
)

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kueue")
NODE = ("kubelet", "kube-scheduler", "kube-proxy", "kubectl")  # same k8s.io/kubernetes as the apiserver
BINARIES = CONTROL_PLANE + NODE


def log(msg: str) -> None:
    print(f"[build_kube] {msg}", file=sys.stderr, flush=True)


def staging_replaces(env: dict[str, str], kver: str) -> dict[str, str]:
    """k8s.io/<staging> -> v0.<minor>.<patch>, from the go.mod of k8s.io/kubernetes@kver."""
    info = module_info(env, KUBE / "controlplane", f"k8s.io/kubernetes@{kver}")
    names = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", Path(info["GoMod"]).read_text(), re.M)
    return {n: "v0." + kver.split(".", 1)[1] for n in names}


def check_or_sync_staging(env: dict[str, str], kver: str, sync: bool) -> None:
    gomod = KUBE / "controlplane" / "go.mod"
    text = gomod.read_text()
    want = staging_replaces(env, kver)
    have = dict(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+k8s\.io/[\w.-]+\s+(v\S+)", text, re.M))
    if have == want:
        return
    if not sync:
        sys.exit(f"build_kube: the replaces in {gomod} do not match k8s.io/kubernetes@{kver}'s staging modules; "
                 "run: python3 scripts/build_kube.py --sync-staging")
    block = "replace (\n" + "".join(f"\t{n} => {n} {v}\n" for n, v in sorted(want.items())) + ")\n"
    text = re.sub(r"^replace \($.*?^\)\n", block, text, flags=re.M | re.S)
    gomod.write_text(text)
    subprocess.run(["go", "mod", "tidy"], cwd=gomod.parent, env=env, check=True)
    log(f"{gomod}: {len(want)} staging replaces pinned to {next(iter(want.values()))}; go mod tidy done")


def targets(env: dict[str, str], v: dict[str, str]) -> dict[str, tuple[Path, str, list[str]]]:
    """name -> (wrapper module dir, package, -X flags)."""
    k8s = module_info(env, KUBE / "controlplane", f"k8s.io/kubernetes@{v['kubernetes']}")
    kver = v["kubernetes"]
    major, minor = re.match(r"v(\d+)\.(\d+)\.", kver).groups()  # type: ignore[union-attr]
    cv = "k8s.io/component-base/version"
    k8s_x = [
        f"{cv}.gitVersion={kver}",
        f"{cv}.gitMajor={major}",
        f"{cv}.gitMinor={minor}",
        f"{cv}.gitCommit={commit_of(k8s)}",
        f"{cv}.gitTreeState=clean",
        f"{cv}.buildDate={build_date(k8s)}",
    ]
    etcd = module_info(env, KUBE / "etcd", f"go.etcd.io/etcd/server/v3@{v['etcd']}")
    etcd_x = [f"go.etcd.io/etcd/api/v3/version.GitSHA={commit_of(etcd)[:9]}"]
    kueue = module_info(env, KUBE / "kueue", f"sigs.k8s.io/kueue@{v['kueue']}")
    kv = "sigs.k8s.io/kueue/pkg/version"
    kueue_x = [
        f"{kv}.GitVersion={v['kueue']}",
        f"{kv}.GitCommit={commit_of(kueue)}",
        f"{kv}.BuildDate={build_date(kueue)}",
    ]
    return {
        "etcd": (KUBE / "etcd", "go.etcd.io/etcd/server/v3", etcd_x),
        "kube-apiserver": (KUBE / "controlplane", "k8s.io/kubernetes/cmd/kube-apiserver", k8s_x),
        "kube-controller-manager": (KUBE / "controlplane", "k8s.io/kubernetes/cmd/kube-controller-manager", k8s_x),
        "kueue": (KUBE / "kueue", "sigs.k8s.io/kueue/cmd/kueue", kueue_x),
        **{name: (KUBE / "controlplane", f"k8s.io/kubernetes/cmd/{name}", k8s_x) for name in NODE},
    }


def copy_kueue_config(env: dict[str, str], v: dict[str, str], dest: Path) -> None:
    if (dest / ".complete").exists():
        return
    info = module_info(env, KUBE / "kueue", f"sigs.k8s.io/kueue@{v['kueue']}")
    src = Path(info["Dir"]) / "config"
    tmp = Path(tempfile.mkdtemp(prefix=".kueue-config.", dir=dest.parent))
    shutil.copytree(src, tmp / "config")
    for p in (tmp / "config").rglob("*"):  # the module cache is read-only
        p.chmod(0o755 if p.is_dir() else 0o644)
    (tmp / "config" / ".complete").write_text(v["kueue"] + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp / "config", dest)
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"kueue config copied to {dest}")


def check(kdir: Path) -> int:
    """0 (and the bin dir printed) when every binary, Kueue's config and the node's pieces are there."""
    bindir = kdir / "bin"
    missing = [b for b in BINARIES if not (bindir / b).exists()] + (
        [] if (kdir / "kueue-config" / ".complete").exists() else ["kueue-config"]
    )
    if missing:
        log(f"missing in {kdir}: {', '.join(missing)}")
        return 1
    node_missing = build_node.complete(build_node.node_dir())
    if node_missing:
        log(f"missing for the node in {build_node.node_dir()}: {', '.join(node_missing)}")
        return 1
    if not build_promtool.binary().exists():
        log(f"missing: {build_promtool.binary()}")
        return 1
    print(bindir)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--print", action="store_true", help="print the bin dir and exit")
    ap.add_argument("--check", action="store_true", help="exit 1 unless all binaries exist")
    ap.add_argument("--only", choices=BINARIES, action="append", help="build only these binaries")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--sync-staging", action="store_true",
                    help="rewrite kube/controlplane/go.mod's staging replaces for its k8s.io/kubernetes version")
    args = ap.parse_args()

    v = versions()
    kdir = key_dir(v)
    bindir = kdir / "bin"
    if args.print:
        print(bindir)
        return 0
    if args.check:
        return check(kdir)
    env = go_env()
    check_or_sync_staging(env, v["kubernetes"], args.sync_staging)
    if args.sync_staging:
        return 0
    bindir.mkdir(parents=True, exist_ok=True)
    (kdir / "versions.json").write_text(json.dumps(v, indent=2) + "\n")
    log(f"versions: kubernetes {v['kubernetes']}, etcd {v['etcd']}, kueue {v['kueue']}; cache {kdir}")
    gover = go_version(env)
    t_all = time.monotonic()
    timings: dict[str, float] = {}
    for name, (mdir, pkg, xflags) in targets(env, v).items():
        if args.only and name not in args.only:
            continue
        stamp = stamp_for(mdir, pkg, xflags, gover)
        stamp_file = bindir / f".{name}.stamp.json"
        if (
            not args.force
            and (bindir / name).exists()
            and stamp_file.exists()
            and json.loads(stamp_file.read_text()) == stamp
        ):
            log(f"{name}: cached")
            continue
        secs = build_one(env, bindir, name, mdir, pkg, xflags)
        stamp_file.write_text(json.dumps(stamp, indent=2) + "\n")
        timings[name] = secs
        size = (bindir / name).stat().st_size / 2**20
        log(f"{name}: built in {secs:.1f}s ({size:.0f} MiB)")
    copy_kueue_config(env, v, kdir / "kueue-config")
    if not args.only:  # containerd, its shim, ctr, the CNI plugins, the pause and busybox images; promtool
            build_node.build(args.force)
            build_promtool.build(args.force)
    if timings:
        with (kdir / "build-times.jsonl").open("a") as f:
            at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            f.write(json.dumps({"at": at, "go": gover, **timings}) + "\n")
    log(f"done in {time.monotonic() - t_all:.1f}s")
    print(bindir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
