#!/usr/bin/env python3
"""Build (or reuse) convgate's two container images, `api` and `worker`, from the repository's Dockerfile.

No image registry is reachable from the machines this project runs on, so the base image is made here:
Debian bookworm from the Debian mirror apt already uses (debootstrap, minbase), plus python3.11 with
venv/ensurepip, ca-certificates and libgomp1, trimmed of apt lists, docs, man pages and locales, and
committed with buildah. The Dockerfile is then built on it with `--build-arg BASE=<that image>`.

Everything is cached outside the repository, under $CONVGATE_IMAGES_CACHE
(default: ${CONVGATE_CACHE:-~/.cache/convgate}/images):

  storage-<driver>/, run/   buildah's graphroot and runroot (overlay when the kernel allows it, else vfs)
  tmp/                      buildah's TMPDIR: the Dockerfile's cache mounts (pip's cache) live here
  archives/<target>-<key>.tar / .json
                            the built image as an uncompressed OCI archive (`ctr images import` loads it)
                            and what was measured while building it

Keys are content digests: the base's key covers its recipe (suite, mirror, packages, trimming, the host's
extra CA certificates); an image's key covers what the Dockerfile copies (IMAGE_INPUTS: the Dockerfile,
.dockerignore, pyproject.toml, README.md, alembic.ini, scripts/image_requirements.py and every file of
engine/, service/, edge/ and migrations/), the base's key and the build arguments that target reads.
A warm run whose archive and image are both present builds nothing. When something changed,
`buildah bud --layers` still reuses every layer before the first changed input, so a source change does
not reinstall torch.

    python3 scripts/build_images.py                       # base + both targets; prints a JSON summary
    python3 scripts/build_images.py --target api          # one target
    python3 scripts/build_images.py --llama-wheels DIR    # reuse a llama-cpp-python wheel (dev.py's cache)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("api", "worker")
# What the image build reads from the repository (the Dockerfile's COPY lines): the image key hashes these.
IMAGE_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "alembic.ini",
                "scripts/image_requirements.py", "engine", "service", "edge", "migrations")
SUITE = "bookworm"
BASE_PACKAGES = ("python3.11", "python3.11-venv", "ca-certificates", "libgomp1")
# Bump when the base recipe below changes in a way the other key inputs do not show.
BASE_RECIPE = "3"
# Installed packages leave no docs, man pages or translations (the same trimming as Debian's slim images).
DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""
# A host behind a TLS-inspecting proxy trusts its CA here; the base must trust it too or pip cannot build.
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # the Dockerfile's default too
# The suite's machines reach PyPI only; PyPI's torch for x86-64 Linux is the CUDA build (several GB more).
PYPI_INDEX = "https://pypi.org/simple"


def log(message: str) -> None:
    print(f"[build_images] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """Outside the repository: images are gigabytes and belong to the machine, not to a clone."""
    explicit = os.environ.get("CONVGATE_IMAGES_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("CONVGATE_CACHE", Path.home() / ".cache" / "convgate")) / "images"


def _overlay_works(scratch: Path) -> bool:
    """Mount a throwaway overlay: the one thing buildah's overlay driver needs from this kernel and filesystem."""
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        dirs = {name: Path(tmp) / name for name in ("lower", "upper", "work", "merged")}
        for path in dirs.values():
            path.mkdir()
        options = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(dirs["merged"])],
                                 capture_output=True, check=False)
        if mounted.returncode != 0:
            return False
        subprocess.run(["umount", str(dirs["merged"])], check=False)
        return True


def storage_driver(cache: Path) -> str:
    """overlay shares unchanged layers between images; vfs copies each layer whole (gigabytes per image)."""
    forced = os.environ.get("CONVGATE_BUILDAH_DRIVER")
    if forced:
        return forced
    cache.mkdir(parents=True, exist_ok=True)
    return "overlay" if _overlay_works(cache) else "vfs"


@dataclass(frozen=True)
class Buildah:
    """buildah with its storage under the cache directory, never the machine's /var/lib/containers."""

    cache: Path
    driver: str

    @property
    def tmpdir(self) -> Path:
        return self.cache / "tmp"

    def argv(self, *args: str) -> list[str]:
        """buildah's command line for this store (with no args: the prefix, for callers that add their own)."""
        return ["buildah", "--root", str(self.cache / f"storage-{self.driver}"), "--runroot", str(self.cache / "run"),
                "--storage-driver", self.driver, *args]

    def env(self) -> dict[str, str]:
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        # TMPDIR: buildah keeps RUN --mount=type=cache directories under $TMPDIR/buildah-cache
        return dict(os.environ, TMPDIR=str(self.tmpdir), BUILDAH_ISOLATION="oci")

    def run(self, *args: str, capture: bool = True) -> str:
        result = subprocess.run(self.argv(*args), env=self.env(), check=False, text=True,
                                stdout=subprocess.PIPE if capture else None)
        if result.returncode != 0:
            raise SystemExit(f"build_images: buildah {' '.join(args[:2])} failed (exit {result.returncode})")
        return result.stdout.strip() if capture else ""

    def save(self, name: str, archive: Path) -> None:
        """The image as an OCI archive with uncompressed layers, for `ctr images import`.

        skopeo rather than `buildah push --disable-compression`: buildah 1.28 still gzips layers for the
        oci-archive transport, which costs minutes of one core for a multi-GB worker image."""
        graphroot, runroot = self.cache / f"storage-{self.driver}", self.cache / "run"
        source = f"containers-storage:[{self.driver}@{graphroot}+{runroot}]{name}"
        result = subprocess.run(["skopeo", "copy", "--quiet", "--dest-oci-accept-uncompressed-layers", source,
                                 f"oci-archive:{archive}:{name}"], env=self.env(), check=False)
        if result.returncode != 0:
            raise SystemExit(f"build_images: skopeo copy of {name} failed (exit {result.returncode})")

    def image_exists(self, name: str) -> bool:
        return subprocess.run(self.argv("inspect", "--type", "image", name), env=self.env(), check=False,
                              capture_output=True).returncode == 0

    def image_size(self, name: str) -> str:
        """buildah's own figure, for the log (human units)."""
        return self.run("images", "--format", "{{.Size}}", name).splitlines()[0]


def debian_sources() -> list[tuple[str, str]]:
    """(URI, suite) pairs of the Debian archive apt already uses here, from one-line and deb822 files."""
    found: list[tuple[str, str]] = []
    apt = Path("/etc/apt")
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list")),
             *sorted((apt / "sources.list.d").glob("*.sources"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
                if "deb" not in fields.get("Types", "").split() or "main" not in fields.get("Components", "").split():
                    continue
                found += [(uri, suite) for uri in fields.get("URIs", "").split()
                          for suite in fields.get("Suites", "").split()]
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(parts) >= 4 and parts[0] == "deb" and "main" in parts[3:]:
                    found.append((parts[1], parts[2]))
    return [(uri.rstrip("/"), suite) for uri, suite in found if suite.split("-")[0] == SUITE]


def base_sources() -> tuple[str, list[tuple[str, str]]]:
    """The mirror debootstrap uses (CONVGATE_DEBIAN_MIRROR overrides) and the base's own apt sources."""
    sources = debian_sources()
    mirror = os.environ.get("CONVGATE_DEBIAN_MIRROR") or next((uri for uri, suite in sources if suite == SUITE), "")
    if not mirror:
        raise SystemExit(f"build_images: no Debian {SUITE} mirror in /etc/apt sources; set CONVGATE_DEBIAN_MIRROR")
    if (mirror, SUITE) not in sources:
        sources.insert(0, (mirror, SUITE))
    return mirror, sources


def local_cas() -> list[Path]:
    return sorted(LOCAL_CA_DIR.glob("*.crt")) if LOCAL_CA_DIR.is_dir() else []


def digest_json(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def base_key() -> str:
    mirror, sources = base_sources()
    return digest_json({"suite": SUITE, "mirror": mirror, "sources": sources, "packages": BASE_PACKAGES,
                        "excludes": DPKG_EXCLUDES, "recipe": BASE_RECIPE,
                        "cas": {ca.name: hashlib.sha256(ca.read_bytes()).hexdigest() for ca in local_cas()}})[:16]


@contextlib.contextmanager
def proc_mounted(rootfs: Path) -> Iterator[None]:
    """apt's maintainer scripts expect /proc inside the chroot."""
    target = rootfs / "proc"
    target.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(target)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _chroot(rootfs: Path, *args: str) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    subprocess.run(["chroot", str(rootfs), *args], env=env, check=True)


def _trim(rootfs: Path) -> None:
    """What a container never reads: apt's lists and .debs, docs, man pages, translations, logs, caches."""
    keep_copyright = {p for p in (rootfs / "usr/share/doc").glob("*/copyright")}
    patterns = ("var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old", "var/lib/dpkg/*-old",
                "var/log/*", "usr/share/man/*", "usr/share/info/*", "usr/share/lintian/*", "usr/share/locale/*",
                "usr/share/doc/*/*", "tmp/*", "var/tmp/*", "root/.cache")
    for pattern in patterns:
        for path in rootfs.glob(pattern):
            if path in keep_copyright or path.name == "locale.alias":
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for locale in (rootfs / "usr/lib/locale").glob("*"):
        if locale.name != "C.utf8":
            shutil.rmtree(locale) if locale.is_dir() else locale.unlink()
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    # the build host's DNS and name are not the image's: the runtime provides both
    for name in ("etc/resolv.conf", "etc/hostname"):
        (rootfs / name).unlink(missing_ok=True)


def make_rootfs(rootfs: Path) -> None:
    mirror, sources = base_sources()
    log(f"debootstrap --variant=minbase {SUITE} from {mirror} (about 1.5 minutes)")
    subprocess.run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror], check=True,
                   stdout=subprocess.DEVNULL)
    (rootfs / "etc/dpkg/dpkg.cfg.d/convgate-slim").write_text(DPKG_EXCLUDES)
    (rootfs / "etc/apt/sources.list").write_text("".join(f"deb {uri} {suite} main\n" for uri, suite in sources))
    (rootfs / "etc/apt/apt.conf.d/convgate-slim").write_text(
        'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\nAcquire::Languages "none";\n')
    (rootfs / "usr/local/share/ca-certificates").mkdir(parents=True, exist_ok=True)
    for ca in local_cas():
        shutil.copy2(ca, rootfs / "usr/local/share/ca-certificates" / ca.name)
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    with proc_mounted(rootfs):
        _chroot(rootfs, "apt-get", "update", "-qq")
        _chroot(rootfs, "apt-get", "install", "-y", "-qq", *BASE_PACKAGES)
        _chroot(rootfs, "apt-get", "clean")
    _trim(rootfs)


def build_base(buildah: Buildah) -> str:
    """The offline base image, `localhost/convgate-base:<key>`; made once per key."""
    name = f"localhost/convgate-base:{base_key()}"
    if buildah.image_exists(name):
        log(f"base {name}: cached")
        return name
    started = time.monotonic()
    work = buildah.cache / "base-work"
    if work.exists():
        subprocess.run(["umount", "-l", str(work / "rootfs" / "proc")], check=False, capture_output=True)
        shutil.rmtree(work)
    work.mkdir(parents=True)
    rootfs = work / "rootfs"
    make_rootfs(rootfs)
    container = buildah.run("from", "scratch")
    try:
        mountpoint = Path(buildah.run("mount", container))
        subprocess.run(["cp", "-a", f"{rootfs}/.", str(mountpoint)], check=True)
        buildah.run("umount", container)
        buildah.run("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--env", "LANG=C.UTF-8", "--cmd", "/bin/bash",
                    "--label", f"io.convgate.base={SUITE}-minbase+python3.11", container)
        buildah.run("commit", "--quiet", "--rm", container, name)
    except BaseException:
        subprocess.run(buildah.argv("rm", container), env=buildah.env(), check=False, capture_output=True)
        raise
    shutil.rmtree(work)
    log(f"base {name}: built in {time.monotonic() - started:.0f} s, {buildah.image_size(name)}")
    return name


def archive_layers_bytes(archive: Path) -> int:
    """The image's size: its layers uncompressed (the archive is pushed without compression), as a node
    holds them once unpacked."""
    with tarfile.open(archive) as tar:
        index = json.load(_member(tar, "index.json"))
        manifest = json.load(_member(tar, "blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))
    return sum(int(layer["size"]) for layer in manifest["layers"])


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    handle = tar.extractfile(name)
    if handle is None:
        raise SystemExit(f"build_images: {name} missing from {tar.name}")
    return handle


def _tree_files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for child in sorted(path.rglob("*")):
        if child.is_file() and "__pycache__" not in child.parts and child.suffix != ".pyc":
            yield child


def image_key(target: str, base: str, build_args: dict[str, str], llama_wheels: Path | None) -> str:
    digest = hashlib.sha256()
    for name in IMAGE_INPUTS:
        for path in _tree_files(ROOT / name):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    wheels = sorted(p.name for p in llama_wheels.glob("*.whl")) if llama_wheels else []
    digest.update(json.dumps({"target": target, "base": base, "args": build_args, "wheels": wheels},
                             sort_keys=True).encode())
    return digest.hexdigest()[:16]


@dataclass
class BuiltImage:
    """What a caller (the tests, the node harness, a person) needs: the name in buildah's store, the archive."""

    target: str
    image: str
    base: str
    archive: str
    size_bytes: int
    build_seconds: float
    cached: bool


def build_image(buildah: Buildah, target: str, base: str, torch_index: str, llama_wheels: Path | None) -> BuiltImage:
    """One target, reused when its key's image and archive exist, else built with buildah and saved."""
    if target != "worker":  # only the worker reads them: the api's key must not change with them
        torch_index, llama_wheels = "", None
    args = {"BASE": base, **({"TORCH_INDEX": torch_index} if torch_index else {})}
    key = image_key(target, base, args, llama_wheels)
    name = f"localhost/convgate-{target}:{key}"
    archives = buildah.cache / "archives"
    archive, record = archives / f"{target}-{key}.tar", archives / f"{target}-{key}.json"
    if archive.exists() and record.exists() and buildah.image_exists(name):
        try:
            built = BuiltImage(**json.loads(record.read_text()))
        except (TypeError, ValueError):
            log(f"{target}: unreadable record {record.name}, saving again")  # an older script's format
        else:
            built.cached = True
            log(f"{target} {name}: cached ({built.size_bytes / 2**20:.0f} MiB)")
            return built
    started = time.monotonic()
    command = ["bud", "--layers", "--network", "host", "--runtime", "runc", "--target", target,
               "--file", str(ROOT / "Dockerfile"), "--tag", name]
    for arg, value in args.items():
        command += ["--build-arg", f"{arg}={value}"]
    if llama_wheels:
        command += ["--build-context", f"llama-wheels={llama_wheels}"]
    log(f"{target}: buildah {' '.join(command)} {ROOT}")
    buildah.run(*command, str(ROOT), capture=False)
    archives.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".tar.partial")
    partial.unlink(missing_ok=True)
    buildah.save(name, partial)
    partial.rename(archive)
    built = BuiltImage(target=target, image=name, base=base, archive=str(archive),
                       size_bytes=archive_layers_bytes(archive), build_seconds=round(time.monotonic() - started, 1),
                       cached=False)
    record.write_text(json.dumps(asdict(built), indent=1))
    # One image and one archive per target: older keys go (their shared layers stay while the new image
    # or buildah's layer cache uses them), or every source change would leave hundreds of MB behind.
    for stale in archives.glob(f"{target}-*.tar"):
        if stale != archive:
            stale.unlink()
            stale.with_suffix(".json").unlink(missing_ok=True)
    for other in buildah.run("images", "--noheading", "--format", "{{.Name}}:{{.Tag}}",
                             "--filter", f"reference=localhost/convgate-{target}").splitlines():
        if other != name:
            subprocess.run(buildah.argv("rmi", other), env=buildah.env(), capture_output=True, check=False)
    log(f"{target} {name}: built in {built.build_seconds:.0f} s, {built.size_bytes / 2**20:.0f} MiB")
    return built


def store_bytes(path: Path) -> int:
    """Disk actually used (du), so overlay's shared layers are not counted twice."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False).stdout
    return int(out.split()[0]) if out else 0


def clear_interrupted_builds(buildah: Buildah) -> None:
    """Remove every working container in our store. Builds are serialised by the build lock, and only builds
    make containers here, so any found under the lock was left by a build that was killed: each holds its
    stage's whole filesystem (GBs for the worker's dependencies), and two of them once filled the disk."""
    buildah.run("rm", "--all")


def store() -> Buildah:
    cache = cache_root()
    return Buildah(cache, storage_driver(cache))


def build(targets: Sequence[str] = TARGETS, llama_wheels: Path | None = None,
          torch_index: str | None = None) -> dict[str, BuiltImage]:
    """Build what is missing and return every requested image (the tests' fixture calls this)."""
    for tool in ("buildah", "skopeo", "debootstrap", "runc"):
        if not shutil.which(tool):
            raise SystemExit(f"build_images: {tool} is missing (python3 dev.py test installs it with apt)")
    buildah = store()
    index = torch_index or os.environ.get("CONVGATE_TORCH_INDEX") or DEFAULT_TORCH_INDEX
    # dev.py, the tests' fixture and the node harness may all ask at once: one builder at a time
    with (buildah.cache / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        clear_interrupted_builds(buildah)
        base = build_base(buildah)
        return {target: build_image(buildah, target, base, index, llama_wheels) for target in targets}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=TARGETS, action="append", help="default: both")
    parser.add_argument("--llama-wheels", type=Path, help="a folder holding a prebuilt llama-cpp-python wheel")
    parser.add_argument("--torch-index", help=f"pip index for torch (CONVGATE_TORCH_INDEX; {DEFAULT_TORCH_INDEX})")
    options = parser.parse_args()
    started = time.monotonic()
    built = build(options.target or TARGETS, options.llama_wheels, options.torch_index)
    cache = cache_root()
    summary = {"images": {target: asdict(image) for target, image in built.items()},
               "store_bytes": sum(store_bytes(p) for p in cache.glob("storage-*")),
               "archives_bytes": store_bytes(cache / "archives"), "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
