"""Run a built image under runc with a Kubernetes securityContext applied by hand.

A pod's container is, on the node, runc given an OCI bundle: a root filesystem and a config.json. This
module makes that bundle the way a kubelet + containerd would for our pods, from the chart's own
securityContext (deploy/helm/convgate/templates/_helpers.tpl) and the image's own config (user, env,
entrypoint), so the tests see what a cluster would run:

- runAsUser / runAsGroup / fsGroup  -> process.user uid, gid and supplementary group;
- runAsNonRoot                      -> refused here before starting when the uid is 0, as the kubelet does;
- readOnlyRootFilesystem            -> root.readonly;
- capabilities.drop [ALL]           -> every capability set empty;
- allowPrivilegeEscalation: false   -> process.noNewPrivileges;
- resources.limits.memory           -> linux.resources.memory.limit (its own cgroup);
- volumes                           -> bind mounts (emptyDir: a host folder owned by fsGroup; files: read-only).

seccompProfile RuntimeDefault is the one field not reproduced: it is containerd's built-in profile, which
the real node applies; runc alone has no such default.

The root filesystem is the image mounted by buildah (overlay: no copy of a multi-GB worker image).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

CHART = REPO / "deploy" / "helm" / "convgate"


def chart_helper(name: str) -> dict[str, Any]:
    """A YAML body of one `define` in the chart's _helpers.tpl (the securityContexts are plain YAML there)."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(r'\{\{-\s*define\s+"' + re.escape(name) + r'"\s*-\}\}\n(.*?)\{\{-\s*end\s*-\}\}', text, re.S)
    assert match, f"{name} is not defined in the chart's _helpers.tpl"
    body = yaml.safe_load(match.group(1))
    assert isinstance(body, dict), f"{name} is not a plain YAML mapping"
    return body


def chart_values() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values, dict)
    return values


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (8Gi, 512Mi, 1G, 1000) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    match = re.fullmatch(r"(\d+)([KMGT]i|[kMGT])?", str(quantity))
    assert match, f"unsupported quantity {quantity!r}"
    return int(match.group(1)) * units.get(match.group(2) or "", 1)


@dataclass(frozen=True)
class SecurityContext:
    """The pod's and the container's securityContext merged, as the kubelet resolves them."""

    uid: int
    gid: int
    fs_group: int | None
    run_as_non_root: bool
    read_only_root: bool
    no_new_privileges: bool
    capabilities: tuple[str, ...]  # what is left after drop/add

    @classmethod
    def resolve(cls, pod: dict[str, Any], container: dict[str, Any]) -> SecurityContext:
        """The container's fields win over the pod's, as in Kubernetes."""
        merged = {**pod, **container}
        capabilities = container.get("capabilities", {})
        assert capabilities.get("drop") == ["ALL"], f"drops {capabilities.get('drop')}, not ALL: update this mapping"
        return cls(uid=int(merged["runAsUser"]), gid=int(merged["runAsGroup"]), fs_group=merged.get("fsGroup"),
                   run_as_non_root=bool(merged.get("runAsNonRoot")),
                   read_only_root=bool(merged.get("readOnlyRootFilesystem")),
                   no_new_privileges=merged.get("allowPrivilegeEscalation") is False,
                   capabilities=tuple(capabilities.get("add", [])))

    @classmethod
    def from_chart(cls) -> SecurityContext:
        """The chart's pods (API Deployment, migration hook): its podSecurity and restrictedContainer helpers."""
        return cls.resolve(chart_helper("convgate.podSecurity"), chart_helper("convgate.restrictedContainer"))


@dataclass(frozen=True)
class Mount:
    source: Path
    destination: str
    read_only: bool = True


@dataclass
class Image:
    """An image in the build script's buildah store: its config and a way to mount its root filesystem."""

    name: str
    buildah: list[str]  # the buildah argv prefix with the store's flags
    env: dict[str, str]
    _containers: list[str] = field(default_factory=list)

    def config(self) -> dict[str, Any]:
        out = subprocess.run([*self.buildah, "inspect", "--type", "image", self.name], env=self.env,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)["OCIv1"]["config"]

    @contextlib.contextmanager
    def rootfs(self) -> Iterator[Path]:
        container = subprocess.run([*self.buildah, "from", "--pull-never", self.name], env=self.env,
                                   capture_output=True, text=True, check=True).stdout.strip()
        try:
            path = subprocess.run([*self.buildah, "mount", container], env=self.env, capture_output=True,
                                  text=True, check=True).stdout.strip()
            yield Path(path)
        finally:
            subprocess.run([*self.buildah, "rm", container], env=self.env, capture_output=True, check=False)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def _capabilities(caps: Sequence[str]) -> dict[str, list[str]]:
    names = [c if c.startswith("CAP_") else f"CAP_{c}" for c in caps]
    return {kind: list(names) for kind in ("bounding", "effective", "permitted", "ambient")}


@dataclass
class Container:
    """One container's bundle, ready to run (foreground: run(); background: start() ... stop())."""

    name: str
    bundle: Path
    process: subprocess.Popen[str] | None = None

    @property
    def cgroup(self) -> str:
        return f"/convgate-tests/{self.name}"

    def _command(self) -> list[str]:
        return ["runc", "run", "--bundle", str(self.bundle), self.name]

    def run(self, timeout: float = 900) -> Run:
        try:
            done = subprocess.run(self._command(), capture_output=True, text=True, timeout=timeout, check=False)
        finally:
            self.stop()
        return Run(done.returncode, done.stdout, done.stderr)

    def start(self, log: Path) -> subprocess.Popen[str]:
        handle = log.open("w")
        self.process = subprocess.Popen(self._command(), stdout=handle, stderr=subprocess.STDOUT, text=True)
        handle.close()
        return self.process

    def stop(self) -> None:
        subprocess.run(["runc", "kill", self.name, "KILL"], capture_output=True, check=False)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        subprocess.run(["runc", "delete", "--force", self.name], capture_output=True, check=False)


@contextlib.contextmanager
def container(image: Image, args: Sequence[str] | None, *, security: SecurityContext, bundle_dir: Path,
              mounts: Sequence[Mount] = (), env: dict[str, str] | None = None, memory_limit: int | None = None,
              cpu_limit: float | None = None, host_network: bool = False) -> Iterator[Container]:
    """The bundle for `args` (default: the image's entrypoint + cmd) run as a pod's container would run it."""
    config = image.config()
    if security.run_as_non_root and security.uid == 0:
        raise AssertionError("runAsNonRoot with uid 0: the kubelet refuses to start this container")
    bundle_dir.mkdir(parents=True, exist_ok=True)
    spec_path = bundle_dir / "config.json"
    spec_path.unlink(missing_ok=True)
    subprocess.run(["runc", "spec", "--bundle", str(bundle_dir)], check=True)  # runc's own defaults
    spec = json.loads(spec_path.read_text())
    name = f"convgate-test-{uuid.uuid4().hex[:10]}"
    process = spec["process"]
    process["terminal"] = False
    process["args"] = list(args) if args is not None else [*(config.get("Entrypoint") or []),
                                                             *(config.get("Cmd") or [])]
    merged_env = dict(item.split("=", 1) for item in config.get("Env", []))
    merged_env.update(env or {})
    process["env"] = [f"{k}={v}" for k, v in merged_env.items()]
    process["cwd"] = config.get("WorkingDir") or "/"
    process["user"] = {"uid": security.uid, "gid": security.gid,
                       **({"additionalGids": [security.fs_group]} if security.fs_group is not None else {})}
    process["capabilities"] = _capabilities(security.capabilities)
    process["noNewPrivileges"] = security.no_new_privileges
    spec["hostname"] = name
    spec["mounts"] += [{"destination": m.destination, "type": "bind", "source": str(m.source),
                        "options": ["rbind", "ro" if m.read_only else "rw", "nosuid", "nodev"]} for m in mounts]
    linux = spec["linux"]
    linux["cgroupsPath"] = f"/convgate-tests/{name}"
    if memory_limit is not None:
        linux.setdefault("resources", {})["memory"] = {"limit": memory_limit}
    if cpu_limit is not None:  # the kubelet's CFS quota for a CPU limit
        linux.setdefault("resources", {})["cpu"] = {"quota": int(cpu_limit * 100_000), "period": 100_000}
    if host_network:
        linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] != "network"]
    with image.rootfs() as rootfs:
        spec["root"] = {"path": str(rootfs), "readonly": security.read_only_root}
        spec_path.write_text(json.dumps(spec, indent=1))
        handle = Container(name, bundle_dir)
        try:
            yield handle
        finally:
            handle.stop()
