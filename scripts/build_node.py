#!/usr/bin/env python3
"""Build (or reuse) what the test node runs besides the kubelet (which scripts/build_kube.py builds
with the control plane, from the same k8s.io/kubernetes):

  kube/containerd  ->  containerd, containerd-shim-runc-v2, ctr   (github.com/containerd/containerd/v2)
  kube/cni         ->  bridge, host-local, loopback               (github.com/containernetworking/plugins)
  kube/pause       ->  pause (the pod sandbox's process; our own few lines of Go)
  kube/kube-router ->  kube-router (only its network policy controller runs: NetworkPolicy enforced
                       with iptables and ipset)                   (github.com/cloudnativelabs/kube-router/v2)

and two images, written as OCI archives without any registry or image builder:

  pause.tar    localhost/convgate/pause:1      the sandbox image containerd's CRI plugin pins
  busybox.tar  localhost/convgate/busybox:...  Debian's static busybox and its applets, for smoke tests
  kubectl.tar  localhost/convgate/kubectl:...  the same plus build_kube.py's kubectl (an in-cluster client)

runc, iptables, ipset and conntrack come from Debian (installed with apt-get when missing, as root), and
so does the static busybox the image is made of.

Everything is cached outside the repository, keyed by the module versions:

  ${CONVGATE_KUBE_CACHE:-~/.cache/convgate/kube}/node-<containerd>-<cni>/{bin,cni,images}/

(the node dir's name keeps the two main versions; kube-router's is in its stamp and versions.json).

Binaries carry a stamp (go.sum digest, Go version, flags, tags) like build_kube.py's; an image
archive is rebuilt when its inputs' digest changes. The last line on stdout is the node directory.

    python3 scripts/build_node.py            # build what is missing, print the node dir
    python3 scripts/build_node.py --print    # only print the node dir
    python3 scripts/build_node.py --check    # exit 1 unless everything is present
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from go_build import (
    KUBE,
    build_date,
    build_one,
    cache_root,
    commit_of,
    go_env,
    go_version,
    key_dir,
    module_info,
    required_version,
    stamp_for,
)
from go_build import versions as kube_versions

CONTAINERD = "github.com/containerd/containerd/v2"
CNI = "github.com/containernetworking/plugins"
KUBE_ROUTER = "github.com/cloudnativelabs/kube-router/v2"
# containerd's own release build tags; btrfs needs cgo and is left out, devmapper and zfs are unused
CONTAINERD_TAGS = ("urfave_cli_no_docs", "no_btrfs", "no_devmapper", "no_zfs")
SHIM_TAGS = ("urfave_cli_no_docs", "no_grpc")
CNI_PLUGINS = {"bridge": "main/bridge", "host-local": "ipam/host-local", "loopback": "main/loopback"}
BIN = ("containerd", "containerd-shim-runc-v2", "ctr", "pause", "kube-router")
DEBIAN = {"runc": "runc", "iptables": "iptables", "ipset": "ipset", "conntrack": "conntrack"}  # command -> package
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static
PAUSE_REF = "localhost/convgate/pause:1"
IMAGE_FORMAT = "2"  # bump when the archive layout below changes


def log(msg: str) -> None:
    print(f"[build_node] {msg}", file=sys.stderr, flush=True)


def versions() -> dict[str, str]:
    return {
        "containerd": required_version(KUBE / "containerd", CONTAINERD),
        "cni": required_version(KUBE / "cni", CNI),
        "kube-router": required_version(KUBE / "kube-router", KUBE_ROUTER),
    }


def node_dir(v: dict[str, str] | None = None) -> Path:
    v = v or versions()
    return cache_root() / f"node-{v['containerd']}-{v['cni']}"


# --- Debian packages -------------------------------------------------------------------------------

def _dpkg_installed(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], check=False, capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "install ok installed"


def missing_debian() -> list[str]:
    missing = [pkg for cmd, pkg in DEBIAN.items() if not shutil.which(cmd, path="/usr/sbin:/usr/bin:/sbin:/bin")]
    if not shutil.which("dpkg-query") or not _dpkg_installed("busybox-static"):
        missing.append("busybox-static")
    return missing


def ensure_debian() -> None:
    """runc, iptables, conntrack and busybox-static from Debian (apt-get as root when missing)."""
    missing = missing_debian()
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(f"build_node: missing Debian packages {', '.join(missing)}; install them with apt-get as root")
    log(f"installing Debian packages: {', '.join(missing)}")
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    subprocess.run(["apt-get", *lock, "update", "-qq"], check=True, stdout=sys.stderr)
    subprocess.run(["apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends", *missing],
                   check=True, stdout=sys.stderr, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


# --- Go builds ---------------------------------------------------------------------------------------

def targets(env: dict[str, str], v: dict[str, str]) -> dict[str, tuple[Path, str, list[str], tuple[str, ...], str]]:
    """name -> (wrapper module dir, package, -X flags, build tags, output dir name)."""
    cd = module_info(env, KUBE / "containerd", f"{CONTAINERD}@{v['containerd']}")
    cd_x = [f"{CONTAINERD}/version.Version={v['containerd']}", f"{CONTAINERD}/version.Revision={commit_of(cd)}",
            f"{CONTAINERD}/version.Package={CONTAINERD}"]
    cni_x = [f"{CNI}/pkg/utils/buildversion.BuildVersion={v['cni']}"]
    kr = module_info(env, KUBE / "kube-router", f"{KUBE_ROUTER}@{v['kube-router']}")
    out: dict[str, tuple[Path, str, list[str], tuple[str, ...], str]] = {
        "containerd": (KUBE / "containerd", f"{CONTAINERD}/cmd/containerd", cd_x, CONTAINERD_TAGS, "bin"),
        "containerd-shim-runc-v2": (KUBE / "containerd", f"{CONTAINERD}/cmd/containerd-shim-runc-v2", cd_x,
                                    SHIM_TAGS, "bin"),
        "ctr": (KUBE / "containerd", f"{CONTAINERD}/cmd/ctr", cd_x, CONTAINERD_TAGS, "bin"),
        "pause": (KUBE / "pause", "convgate.local/kube/pause", [], (), "bin"),
        "kube-router": (KUBE / "kube-router", f"{KUBE_ROUTER}/cmd/kube-router",
                        [f"{KUBE_ROUTER}/pkg/version.Version={v['kube-router']}",
                         f"{KUBE_ROUTER}/pkg/version.BuildDate={build_date(kr)}"], (), "bin"),
    }
    for name, sub in CNI_PLUGINS.items():
        out[name] = (KUBE / "cni", f"{CNI}/plugins/{sub}", cni_x, (), "cni")
    return out


# --- OCI archives ---------------------------------------------------------------------------------

def _tar_entry(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o644,
               link: str | None = None, directory: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, mode
        tar.addfile(info)
    elif link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
        tar.addfile(info)
    else:
        assert data is not None
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))


def _blob(blobs: dict[str, bytes], data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return digest


def write_oci_archive(dest: Path, ref: str, files: list[tuple[str, dict]], config: dict) -> str:
    """An OCI image layout (one image, one uncompressed layer) as a tar archive; returns the manifest digest.

    `files` are (path, {"data": bytes, "mode": int} | {"link": target} | {"dir": True, "mode": int});
    every timestamp and owner is zero, so equal inputs give an equal digest."""
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, spec in files:
            if spec.get("dir"):
                _tar_entry(tar, path, directory=True, mode=spec.get("mode", 0o755))
            elif "link" in spec:
                _tar_entry(tar, path, link=spec["link"])
            else:
                _tar_entry(tar, path, data=spec["data"], mode=spec.get("mode", 0o644))
    layer = layer_tar.getvalue()  # uncompressed: imported once, locally; gzip would only cost time
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    blobs: dict[str, bytes] = {}
    layer_digest = _blob(blobs, layer)
    image_config = {
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "scripts/build_node.py", "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z",
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_digest = _blob(blobs, config_bytes)
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                    "size": len(layer)}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = _blob(blobs, manifest_bytes)
    index = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": manifest["mediaType"], "digest": manifest_digest, "size": len(manifest_bytes),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": ref,
                                       "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]}}],
    }
    tmp = dest.with_name(f".{dest.name}.tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_entry(tar, "oci-layout", data=json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _tar_entry(tar, "index.json", data=json.dumps(index, sort_keys=True).encode())
        _tar_entry(tar, "blobs", directory=True)
        _tar_entry(tar, "blobs/sha256", directory=True)
        for digest, data in sorted(blobs.items()):
            _tar_entry(tar, f"blobs/sha256/{digest.split(':', 1)[1]}", data=data)
    os.replace(tmp, dest)
    return manifest_digest


def busybox_version() -> str:
    out = subprocess.run([str(BUSYBOX)], check=False, capture_output=True, text=True).stdout
    first = out.splitlines()[0] if out else ""
    return first.split()[1].lstrip("v") if first.startswith("BusyBox v") else "0"


def image_specs(bindir: Path, kube_bindir: Path | None = None) -> dict[str, tuple[str, list[tuple[str, dict]], dict]]:
    """name -> (reference, files, image config). `kubectl` (busybox plus the kubectl built with the
    control plane) when `kube_bindir` has one: an in-cluster API client for the node's smoke tests
    (busybox's own TLS offers no ECDSA signature algorithm, and the test cluster's keys are ECDSA)."""
    path_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    pause = (PAUSE_REF, [("pause", {"data": (bindir / "pause").read_bytes(), "mode": 0o755})],
             {"Entrypoint": ["/pause"], "Env": path_env, "User": "65535:65535"})
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    files: list[tuple[str, dict]] = [("bin", {"dir": True}), ("bin/busybox", {"data": BUSYBOX.read_bytes(),
                                                                               "mode": 0o755})]
    files += [(f"bin/{a}", {"link": "busybox"}) for a in sorted(set(applets)) if a != "busybox"]
    files += [("etc", {"dir": True}), ("tmp", {"dir": True, "mode": 0o1777}),
              ("etc/passwd", {"data": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"}),
              ("etc/group", {"data": b"root:x:0:\nnogroup:x:65534:\n"})]
    busybox = (f"localhost/convgate/busybox:{busybox_version()}", files, {"Cmd": ["/bin/sh"], "Env": path_env})
    specs = {"pause": pause, "busybox": busybox}
    kubectl = kube_bindir / "kubectl" if kube_bindir else None
    if kubectl and kubectl.exists():
        version = json.loads((kube_bindir.parent / "versions.json").read_text())["kubernetes"]  # type: ignore[union-attr]
        specs["kubectl"] = (f"localhost/convgate/kubectl:{version}",
                            [*files, ("usr", {"dir": True}), ("usr/local", {"dir": True}),
                             ("usr/local/bin", {"dir": True}),
                             ("usr/local/bin/kubectl", {"data": kubectl.read_bytes(), "mode": 0o755})],
                            {"Cmd": ["/bin/sh"], "Env": path_env})
    return specs


def build_images(ndir: Path, kube_bindir: Path | None = None) -> dict[str, dict[str, str]]:
    images_dir = ndir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    index_path = images_dir / "images.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    changed = False
    for name, (ref, files, config) in image_specs(ndir / "bin", kube_bindir).items():
        h = hashlib.sha256(IMAGE_FORMAT.encode() + ref.encode() + json.dumps(config, sort_keys=True).encode())
        for path, spec in files:
            meta = {k: v for k, v in spec.items() if k != "data"}
            h.update(path.encode() + json.dumps(meta, sort_keys=True).encode())
            h.update(hashlib.sha256(spec.get("data", b"")).digest())
        inputs = h.hexdigest()
        archive = images_dir / f"{name}.tar"
        if archive.exists() and index.get(name, {}).get("inputs") == inputs:
            continue
        t0 = time.monotonic()
        digest = write_oci_archive(archive, ref, files, config)
        index[name] = {"ref": ref, "archive": archive.name, "manifest": digest, "inputs": inputs}
        changed = True
        log(f"image {ref}: {archive.stat().st_size / 2**20:.1f} MiB in {time.monotonic() - t0:.1f}s ({digest[:19]})")
    if changed:
        index_path.write_text(json.dumps(index, indent=2) + "\n")
    return index


# --- main --------------------------------------------------------------------------------------------

def complete(ndir: Path) -> list[str]:
    """What is missing in a node dir (empty when complete)."""
    missing = [b for b in BIN if not (ndir / "bin" / b).exists()]
    missing += [f"cni/{p}" for p in CNI_PLUGINS if not (ndir / "cni" / p).exists()]
    index = ndir / "images" / "images.json"
    names = json.loads(index.read_text()) if index.exists() else {}
    missing += [f"images/{n}" for n in ("pause", "busybox", "kubectl") if n not in names]
    return missing + missing_debian()


def build(force: bool = False) -> Path:
    ensure_debian()
    v = versions()
    ndir = node_dir(v)
    env = go_env()
    gover = go_version(env)
    for sub in ("bin", "cni"):
        (ndir / sub).mkdir(parents=True, exist_ok=True)
    (ndir / "versions.json").write_text(json.dumps(v, indent=2) + "\n")
    log(f"versions: containerd {v['containerd']}, CNI plugins {v['cni']}; cache {ndir}")
    t_all = time.monotonic()
    timings: dict[str, float] = {}
    for name, (mdir, pkg, xflags, tags, sub) in targets(env, v).items():
        outdir = ndir / sub
        stamp = {**stamp_for(mdir, pkg, xflags, gover), "tags": list(tags)}
        stamp_file = outdir / f".{name}.stamp.json"
        if (not force and (outdir / name).exists() and stamp_file.exists()
                and json.loads(stamp_file.read_text()) == stamp):
            log(f"{name}: cached")
            continue
        secs = build_one(env, outdir, name, mdir, pkg, xflags, tags)
        stamp_file.write_text(json.dumps(stamp, indent=2) + "\n")
        timings[name] = secs
        log(f"{name}: built in {secs:.1f}s ({(outdir / name).stat().st_size / 2**20:.0f} MiB)")
    build_images(ndir, key_dir(kube_versions()) / "bin")
    if timings:
        with (ndir / "build-times.jsonl").open("a") as f:
            at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            f.write(json.dumps({"at": at, "go": gover, **timings}) + "\n")
    log(f"done in {time.monotonic() - t_all:.1f}s")
    return ndir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--print", action="store_true", help="print the node dir and exit")
    ap.add_argument("--check", action="store_true", help="exit 1 unless everything is present")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = ap.parse_args()
    if args.print:
        print(node_dir())
        return 0
    if args.check:
        missing = complete(node_dir())
        if missing:
            log(f"missing in {node_dir()}: {', '.join(missing)}")
            return 1
        print(node_dir())
        return 0
    print(build(args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
