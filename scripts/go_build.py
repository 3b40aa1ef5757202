"""Building Go binaries reproducibly into a cache keyed by version, shared by build_kube.py (the
control plane, the kubelet, Kueue) and build_node.py (containerd and the rest of the node): the Go
environment, the module versions the wrapper modules require, -X flags from the proxy's commit
information, and a stamp that says when a cached binary must be rebuilt."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "kube"


def log(msg: str) -> None:
    print(f"[build] {msg}", file=sys.stderr, flush=True)


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GOTOOLCHAIN"] = "local"  # fail fast on a newer `go` line instead of downloading a toolchain
    env["GOFLAGS"] = "-mod=mod"
    env.setdefault("CGO_ENABLED", "0")  # static binaries, no C toolchain needed
    go = shutil.which("go", path=env.get("PATH")) or "/usr/local/go/bin/go"
    if not Path(go).exists():
        sys.exit("build: no `go` on PATH nor /usr/local/go/bin/go")
    env["PATH"] = f"{Path(go).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def required_version(module_dir: Path, module: str) -> str:
    text = (module_dir / "go.mod").read_text()
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.M)
    if not m:
        sys.exit(f"build: {module} not required in {module_dir / 'go.mod'}")
    return m.group(1)


def versions() -> dict[str, str]:
    return {
        "kubernetes": required_version(KUBE / "controlplane", "k8s.io/kubernetes"),
        "etcd": required_version(KUBE / "etcd", "go.etcd.io/etcd/server/v3"),
        "kueue": required_version(KUBE / "kueue", "sigs.k8s.io/kueue"),
    }


def cache_root() -> Path:
    base = os.environ.get("CONVGATE_KUBE_CACHE")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "convgate" / "kube"


def key_dir(v: dict[str, str]) -> Path:
    return cache_root() / f"{v['kubernetes']}-{v['etcd']}-{v['kueue']}"


def module_info(env: dict[str, str], cwd: Path, mod: str) -> dict:
    out = subprocess.run(
        ["go", "mod", "download", "-json", mod], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)


def commit_of(info: dict) -> str:
    """The VCS commit of a module version, from the proxy's .info Origin when it has one."""
    info_file = info.get("Info")
    if info_file and Path(info_file).exists():
        origin = json.loads(Path(info_file).read_text()).get("Origin") or {}
        if origin.get("Hash"):
            return origin["Hash"]
    return "0000000000000000000000000000000000000000"


def build_date(info: dict) -> str:
    """Build date = the release's commit time (reproducible), else now."""
    info_file = info.get("Info")
    if info_file and Path(info_file).exists():
        t = json.loads(Path(info_file).read_text()).get("Time")
        if t:
            return t.replace(".000", "")
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def go_version(env: dict[str, str]) -> str:
    out = subprocess.run(["go", "env", "GOVERSION"], env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def stamp_for(module_dir: Path, pkg: str, xflags: list[str], gover: str) -> dict:
    h = hashlib.sha256()
    for f in ("go.mod", "go.sum"):
        p = module_dir / f
        h.update(p.read_bytes() if p.exists() else b"")
    return {"package": pkg, "go": gover, "modules": h.hexdigest(), "x": xflags, "flags": "-trimpath -s -w"}


def build_one(env: dict[str, str], bindir: Path, name: str, module_dir: Path, pkg: str, xflags: list[str],
              tags: tuple[str, ...] = ()) -> float:
    ldflags = " ".join(["-s", "-w", *(f"-X '{x}'" for x in xflags)])
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=bindir)
    os.close(fd)
    tag_args = ["-tags", ",".join(tags)] if tags else []
    cmd = ["go", "build", "-trimpath", *tag_args, "-ldflags", ldflags, "-o", tmp, pkg]
    log(f"building {name}: (cd {module_dir.relative_to(ROOT)} && {' '.join(cmd[:2])} ... {pkg})")
    t0 = time.monotonic()
    try:
        subprocess.run(cmd, cwd=module_dir, env=env, check=True, stdout=sys.stderr)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    os.chmod(tmp, 0o755)
    os.replace(tmp, bindir / name)
    return time.monotonic() - t0
