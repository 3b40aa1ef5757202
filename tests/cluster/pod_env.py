"""The kubelet's view of a pod's configuration, for the pod runner: environment (values, `$(VAR)`
expansion, Secret / ConfigMap references, fieldRef, resourceFieldRef, envFrom), the volume checks
a kubelet makes before starting a container, and where a container's mounts live on this machine.

There is no mount namespace: an `emptyDir` volume is a directory under the pod's work dir, and
every environment value and argument that names a path under a mount path is rewritten to that
directory (the process cannot see `/scratch`, so `/scratch/cache` becomes `<pod dir>/volumes/scratch/cache`).
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from pathlib import Path
from typing import Any

from .api import Api

PodDict = dict[str, Any]


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ConfigError(Exception):
    """The kubelet would not start the container (reason, message)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known vars replaced, `$$` -> `$`, unknown left as is."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, s)


def quantity_to_float(q: str) -> float:
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    for suf in sorted(suffixes, key=len, reverse=True):
        if q.endswith(suf):
            return float(q[: -len(suf)]) * suffixes[suf]
    return float(q)




class PodEnv:
    """Resolves a pod's containers' configuration through the API, as a kubelet on `node_name` would."""

    def __init__(self, api: Api, node_name: str, capacity: dict[str, str]) -> None:
        self.api = api
        self.node_name = node_name
        self.capacity = capacity

    def get_data(self, kind: str, ns: str, name: str, optional: bool) -> dict[str, str] | None:
        path = f"/api/v1/namespaces/{ns}/{'secrets' if kind == 'Secret' else 'configmaps'}/{name}"
        obj = self.api.get(path, ok404=True)
        if obj is None:
            if optional:
                return None
            raise ConfigError("CreateContainerConfigError", f'{kind.lower()} "{name}" not found')
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return {**(obj.get("data") or {}), **{k: base64.b64decode(v).decode() for k, v in
                                             (obj.get("binaryData") or {}).items()}}

    def field(self, pod: PodDict, path: str) -> str:
        md = pod["metadata"]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            return (md.get(m.group(1)) or {}).get(m.group(2), "")
        return {
            "metadata.name": md["name"],
            "metadata.namespace": md["namespace"],
            "metadata.uid": md["uid"],
            "spec.nodeName": self.node_name,
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
            "status.podIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1",
        }.get(path, "")

    def resource(self, container: dict[str, Any], ref: dict[str, Any]) -> str:
        res = ref["resource"]
        kind, _, rname = res.partition(".")
        values = (container.get("resources") or {}).get(kind) or {}
        if rname not in values:
            values = (container.get("resources") or {}).get("limits") or {}
        raw = values.get(rname)
        if raw is None:
            raw = self.capacity.get(rname, "0")
        divisor = quantity_to_float(str(ref.get("divisor", "1")))
        v = quantity_to_float(str(raw)) / divisor
        return str(int(-(-v // 1)))  # ceil, as the kubelet does

    def resolve_env(self, pod: PodDict, container: dict[str, Any]) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for src in container.get("envFrom") or []:
            prefix = src.get("prefix", "")
            for key in ("configMapRef", "secretRef"):
                if key in src:
                    ref = src[key]
                    data = self.get_data("ConfigMap" if key == "configMapRef" else "Secret", ns, ref["name"],
                                          bool(ref.get("optional")))
                    for k, v in (data or {}).items():
                        env[prefix + k] = v
        for e in container.get("env") or []:
            name = e["name"]
            if "valueFrom" not in e:
                env[name] = expand(e.get("value", ""), env)
                continue
            vf = e["valueFrom"]
            if "secretKeyRef" in vf or "configMapKeyRef" in vf:
                kind = "Secret" if "secretKeyRef" in vf else "ConfigMap"
                ref = vf["secretKeyRef" if kind == "Secret" else "configMapKeyRef"]
                optional = bool(ref.get("optional"))
                data = self.get_data(kind, ns, ref["name"], optional)
                if data is None:
                    continue
                if ref["key"] not in data:
                    if optional:
                        continue
                    raise ConfigError("CreateContainerConfigError",
                                      f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
                env[name] = data[ref["key"]]
            elif "fieldRef" in vf:
                env[name] = self.field(pod, vf["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in vf:
                env[name] = self.resource(container, vf["resourceFieldRef"])
        return env

    def check_volumes(self, pod: PodDict) -> None:
        ns = pod["metadata"]["namespace"]
        for v in pod["spec"].get("volumes") or []:
            for key, ref, plural in (("secret", "secretName", "secrets"), ("configMap", "name", "configmaps")):
                src = v.get(key)
                if not src or src.get("optional"):
                    continue
                if self.api.get(f"/api/v1/namespaces/{ns}/{plural}/{src[ref]}", ok404=True) is None:
                    raise ConfigError("ContainerCreating",
                                      f'MountVolume.SetUp failed for volume "{v["name"]}" : {key.lower()} '
                                      f'"{src[ref]}" not found')

    # --- mounts ------------------------------------------------------------------------------
    @staticmethod
    def mounts(pod: PodDict, container: dict[str, Any], poddir: Path) -> dict[str, Path]:
        """mountPath -> local directory, for the container's emptyDir mounts (created here)."""
        empty = {v["name"] for v in pod["spec"].get("volumes") or [] if "emptyDir" in v}
        out: dict[str, Path] = {}
        for m in container.get("volumeMounts") or []:
            if m["name"] in empty:
                local = poddir / "volumes" / m["name"] / m.get("subPath", "")
                local.mkdir(parents=True, exist_ok=True)
                out[m["mountPath"].rstrip("/") or "/"] = local
        return out

    @staticmethod
    def localize(value: str, mounts: dict[str, Path]) -> str:
        """A path under a mount path, rewritten to the mount's local directory; anything else as is."""
        for mount_path in sorted(mounts, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(mounts[mount_path]) + value[len(mount_path):]
        return value
