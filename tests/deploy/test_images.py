"""The images a platform deploys, built for real from the Dockerfile and run under runc as a pod would run them.

The module's fixture builds both targets with scripts/build_images.py (an offline debootstrap base, buildah,
cached by content: a warm run reuses the saved images and archives), reusing dev.py's llama-cpp-python
wheel through the Dockerfile's `llama-wheels` build context instead of compiling llama.cpp again. torch
comes from PyPI here: the machines reach no other index (a user's build takes the CPU index).

Each container gets the securityContext a cluster would give it, applied by hand (tests/deploy/containers.py):
the worker the one the dispatcher's Job manifest sets (checked equal to the chart's), the API the chart's.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scripts import build_images
from service.config import Settings
from service.dispatch.kube.job_manifest import build_job
from tests.conftest import REPO, fixtures_root
from tests.deploy.containers import Image, Mount, Run, SecurityContext, chart_values, container, quantity_bytes

API_IMAGE_BUDGET = 300 * 10**6  # issue 21: keep the API image under 300 MB
# The first test to need an image may build it (the worker: ~16 minutes on 2 cores when its dependency
# layers are not cached); `python3 dev.py test` builds both before pytest, so this is the rare case.
pytestmark = pytest.mark.timeout(3600)


class Built:
    """Each target built (or reused) on first use, so the api tests do not wait for the worker's build."""

    def __init__(self) -> None:
        self._built: dict[str, build_images.BuiltImage] = {}

    def __getitem__(self, target: str) -> build_images.BuiltImage:
        if target not in self._built:
            self._built.update(build_images.build([target], **_build_options(target)))
        return self._built[target]

    def image(self, target: str) -> Image:
        buildah = build_images.store()
        return Image(self[target].image, buildah.argv(), buildah.env())


def _build_options(target: str) -> dict[str, Any]:
    """What dev.py passes to scripts/build_images.py, so the suite reuses what `python3 dev.py test` built."""
    if target != "worker":
        return {}
    import dev  # the repository's entry point keeps the portable llama-cpp-python wheel, built once

    return {"llama_wheels": dev.llama_wheel().parent, "torch_index": build_images.PYPI_INDEX}


@pytest.fixture(scope="module")
def built() -> Built:
    return Built()


def _worker_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod spec and container the dispatcher creates for a verification attempt."""
    job = build_job(Settings(dispatcher="kubernetes"), "smoke", 1)
    pod = job["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def _empty_dir(tmp_path: Path, name: str) -> Path:
    """An emptyDir as the kubelet makes it: world-writable, so the pod's uid can write."""
    path = tmp_path / name
    path.mkdir()
    path.chmod(0o777)
    return path


def _minilm() -> Path:
    root = fixtures_root() / "minilm"
    for needed in ("source/config.json", "minilm-Q8_0.gguf"):
        if not (root / needed).exists():
            pytest.fail(f"{root / needed} is missing: the minilm fixture is built by `python3 dev.py setup`")
    return root


def test_the_worker_pod_gets_the_charts_security_context() -> None:
    pod, worker = _worker_pod()
    assert SecurityContext.resolve(pod["securityContext"], worker["securityContext"]) == SecurityContext.from_chart()
    assert pod["automountServiceAccountToken"] is False


def _verify_in_worker_pod(built: Built, tmp_path: Path, gates: str) -> tuple[Run, Path]:
    """`convgate verify` in the worker image, as the Job's pod runs it: its securityContext, env, memory and
    CPU limits and scratch volume (an empty, world-writable folder, as an emptyDir is); the fixture files
    mounted read-only; no network (the container has its own, empty, network namespace)."""
    pod, worker = _worker_pod()
    security = SecurityContext.resolve(pod["securityContext"], worker["securityContext"])
    env = {item["name"]: item["value"] for item in worker["env"] if "value" in item}
    scratch = _empty_dir(tmp_path, "scratch")
    (mount,) = worker["volumeMounts"]
    limits = worker["resources"]["limits"]
    command = ["convgate", "verify", "--source", "/models/minilm/source",
               "--artifact", "/models/minilm/minilm-Q8_0.gguf", "--texts", "/texts/english.txt",
               "--report", "/scratch/report.json", "--gates", gates]
    with container(built.image("worker"), command, security=security, bundle_dir=tmp_path / "bundle", env=env,
                   mounts=[Mount(scratch, mount["mountPath"], read_only=False), Mount(_minilm(), "/models/minilm"),
                           Mount(REPO / "examples", "/texts")],
                   memory_limit=quantity_bytes(limits["memory"]), cpu_limit=float(limits["cpu"])) as worker_run:
        result = worker_run.run(timeout=1200)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    assert result.stdout.strip().splitlines()[-1] == "GO"
    assert (scratch / "report.json").stat().st_uid == security.uid
    return result, scratch


def test_worker_image_runs_gate_1_under_runc(built: Built, tmp_path: Path) -> None:
    """The image starts and its engine reads a real conversion: gate 1 (structure, inventory, every tensor's
    values reproduced) on llama.cpp's Q8_0 conversion of all-MiniLM-L6-v2 ends GO."""
    _, scratch = _verify_in_worker_pod(built, tmp_path, "1")
    report = json.loads((scratch / "report.json").read_text())
    assert report["verdict"] == "GO" and report["blockers"] == []
    assert {gate["name"]: gate["status"] for gate in report["gates"].values()}["storage"] == "passed"


def test_worker_image_runs_all_three_gates_under_runc(built: Built, tmp_path: Path) -> None:
    """All three gates inside the container: the Hugging Face reference on torch, llama.cpp through
    llama-cpp-python, the released file re-measured; GO, with every gate passed."""
    _, scratch = _verify_in_worker_pod(built, tmp_path, "1,2,3")
    report = json.loads((scratch / "report.json").read_text())
    assert report["verdict"] == "GO" and report["blockers"] == []
    assert {gate["name"]: gate["status"] for gate in report["gates"].values()} == {
        "storage": "passed", "runtime": "passed", "release": "passed"}


PROBE = """
import json, os, pathlib
result = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "writes": {}}
for path in ("/opt/convgate/probe", "/app/probe", "/etc/probe", "/tmp/probe", "/probe", "/scratch/probe"):
    try:
        pathlib.Path(path).write_text("x")
        result["writes"][path] = "ok"
    except OSError as exc:
        result["writes"][path] = exc.strerror
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
result["cap_eff"] = status["CapEff"].strip()
result["no_new_privs"] = status["NoNewPrivs"].strip()
result["memory_limit"] = int(open("/sys/fs/cgroup/memory/memory.limit_in_bytes").read())
print(json.dumps(result))
"""


@pytest.mark.parametrize("target", ["worker", "api"])
def test_root_filesystem_is_read_only_and_the_process_is_not_root(built: Built, tmp_path: Path,
                                                                   target: str) -> None:
    security = SecurityContext.from_chart()
    scratch = _empty_dir(tmp_path, "scratch")
    memory = quantity_bytes(chart_values()[target]["resources"]["limits"]["memory"])
    with container(built.image(target), ["python", "-c", PROBE], security=security, bundle_dir=tmp_path / "bundle",
                   mounts=[Mount(scratch, "/scratch", read_only=False)], memory_limit=memory) as probe:
        result = probe.run(timeout=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["uid"] == security.uid != 0 and seen["gid"] == security.gid
    assert security.fs_group in seen["groups"]
    assert seen["writes"] == {"/opt/convgate/probe": "Read-only file system", "/app/probe": "Read-only file system",
                              "/etc/probe": "Read-only file system", "/tmp/probe": "Read-only file system",
                              "/probe": "Read-only file system", "/scratch/probe": "ok"}
    assert (scratch / "probe").stat().st_uid == security.uid
    assert int(seen["cap_eff"], 16) == 0 and seen["no_new_privs"] == "1"
    assert seen["memory_limit"] == memory


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_api_image_migrates_and_serves_health_under_runc(built: Built, tmp_path: Path) -> None:
    """The migration hook's `convgate db upgrade`, then the Deployment's `convgate serve`, in the api image with
    the chart's securityContext and volumes (/tmp and /scratch), on the host's network namespace; it answers
    health, readiness and a page rendered from its templates."""
    security = SecurityContext.from_chart()
    scratch, tmp = _empty_dir(tmp_path, "scratch"), _empty_dir(tmp_path, "tmp")
    mounts = [Mount(scratch, "/scratch", read_only=False), Mount(tmp, "/tmp", read_only=False)]
    env = {"CONVGATE_DATABASE_URL": "sqlite:////scratch/convgate.db", "CONVGATE_DISPATCHER": "none", "HOME": "/tmp"}
    memory = quantity_bytes(chart_values()["api"]["resources"]["limits"]["memory"])
    common = {"security": security, "mounts": mounts, "env": env, "memory_limit": memory, "host_network": True}
    with container(built.image("api"), ["convgate", "--help"], bundle_dir=tmp_path / "help", **common) as helper:
        shown = helper.run(timeout=120)
    assert shown.returncode == 0 and "verify" in shown.stdout, shown.stderr
    api_image = built.image("api")
    with container(api_image, ["convgate", "db", "upgrade"], bundle_dir=tmp_path / "migrate", **common) as hook:
        migrated = hook.run(timeout=300)
    assert migrated.returncode == 0, migrated.stderr
    port = _free_port()
    log = tmp_path / "serve.log"
    with container(api_image, ["convgate", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-migrate"],
                   bundle_dir=tmp_path / "serve", **common) as api:
        process = api.start(log)
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, f"convgate serve exited {process.returncode}:\n{log.read_text()[-4000:]}"
            try:
                health = _get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                assert time.monotonic() < deadline, f"no /healthz within 120 s:\n{log.read_text()[-4000:]}"
                time.sleep(0.5)
        ready = _get(f"http://127.0.0.1:{port}/readyz")
        sign_in = _get(f"http://127.0.0.1:{port}/ui/login")  # a page: its template shipped in the image
    assert health[0] == 200 and ready[0] == 200, (health, ready)
    assert sign_in[0] == 200 and 'action="/ui/login"' in sign_in[1], sign_in


def test_api_image_has_no_engine_and_fits_its_budget(built: Built, tmp_path: Path) -> None:
    """The control plane carries neither torch nor llama.cpp (nor transformers), and stays under 300 MB."""
    check = ("import importlib.util as u, json; "
             "print(json.dumps({m: u.find_spec(m) is not None for m in ('torch', 'llama_cpp', 'transformers', "
             "'fastapi', 'sqlalchemy', 'psycopg', 'kubernetes', 'alembic')}))")
    with container(built.image("api"), ["python", "-c", check], security=SecurityContext.from_chart(),
                   bundle_dir=tmp_path / "bundle") as probe:
        result = probe.run(timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"torch": False, "llama_cpp": False, "transformers": False, "fastapi": True,
                                         "sqlalchemy": True, "psycopg": True, "kubernetes": True, "alembic": True}
    assert built["api"].size_bytes < API_IMAGE_BUDGET, f"api image is {built['api'].size_bytes / 1e6:.0f} MB"


@pytest.mark.parametrize("target", ["api", "worker"])
def test_no_wheel_is_left_in_any_layer(built: Built, target: str) -> None:
    """Every layer the Dockerfile added, read from the saved OCI archive, not just the final filesystem: a wheel
    deleted in a later layer still ships in the earlier one. (The base's own layers are the base's business:
    Debian's python3.11-venv keeps ensurepip's pip and setuptools wheels, as the official image does.)"""
    image = built[target]
    buildah = build_images.store()
    inspected = subprocess.run(buildah.argv("inspect", "--type", "image", image.base), env=buildah.env(),
                               capture_output=True, text=True, check=True).stdout
    base_layers = set(json.loads(inspected)["OCIv1"]["rootfs"]["diff_ids"])
    wheels: list[str] = []
    with tarfile.open(image.archive) as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(archive.extractfile(f"blobs/sha256/{manifest_digest}"))  # type: ignore[arg-type]
        added = [layer for layer in manifest["layers"] if layer["digest"] not in base_layers]
        assert len(added) < len(manifest["layers"]), "the image does not start from its base's layers"
        for layer in added:
            blob = archive.extractfile(f"blobs/sha256/{layer['digest'].split(':')[1]}")
            with tarfile.open(fileobj=blob, mode="r|*") as files:
                wheels += [member.name for member in files if member.name.endswith(".whl")]
    assert wheels == []


def test_a_warm_build_reuses_the_images() -> None:
    """A second run with nothing changed builds nothing: both keys found, image and archive reused."""

    def build_all() -> dict[str, build_images.BuiltImage]:
        return {target: build_images.build([target], **_build_options(target))[target]
                for target in build_images.TARGETS}

    first = build_all()  # the fixture's images, unless a source changed since (a developer's tree)
    started = time.monotonic()
    again = build_all()
    assert time.monotonic() - started < 60
    assert all(image.cached for image in again.values())
    assert {target: image.image for target, image in again.items()} == {t: i.image for t, i in first.items()}


def test_a_killed_builds_working_container_is_cleared_by_the_next_build(built: Built) -> None:
    """A build killed mid-stage leaves its working container, the stage's whole filesystem (two of the worker's
    once filled the disk); the next build, holding the build lock, removes it before it starts."""
    buildah = build_images.store()
    base = built["api"].base
    left = subprocess.run(buildah.argv("from", base), env=buildah.env(), capture_output=True, text=True,
                          check=True).stdout.strip()

    def containers() -> list[str]:
        return buildah.run("containers", "--noheading", "--format", "{{.ContainerName}}").split()

    assert left in containers()
    build_images.build(["api"], **_build_options("api"))
    assert containers() == []
