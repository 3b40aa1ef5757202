"""Kueue as a local process for the test cluster: its installation objects, the manager started
(or restarted) and stopped, and the kubelet's Secret volume for its webhook certificates played by a
thread. A mixin of `Cluster` (cluster.py), which provides the processes, the API and the ports."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from . import kueue_manifests
from .api import Api

if TYPE_CHECKING:
    from .cluster import Proc
    from .pki import Pki


class ClusterError(RuntimeError):
    pass


class KueueControl:
    bindir: Path
    workdir: Path
    kubeconfig: Path
    server: str
    pki: Pki
    api: Api
    procs: dict[str, Proc]
    timings: dict[str, float]
    kueue_frameworks: list[str]
    kueue_multikueue: dict[str, Any] | None
    kueue_webhook_port: int
    kueue_visibility_port: int
    kueue_health_port: int
    _secret_sync_stop: threading.Event | None

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        raise NotImplementedError

    def _wait(self, name: str, what: str, check: Any, timeout: float) -> None:
        raise NotImplementedError

    @property
    def kueue_config_dir(self) -> Path:
        return self.bindir.parent / "kueue-config"

    def _install_kueue_objects(self) -> None:
        t0 = time.monotonic()
        objs = kueue_manifests.render(
            self.kueue_config_dir, webhook_port=self.kueue_webhook_port, visibility_port=self.kueue_visibility_port
        )
        for obj in objs:  # serially: applying the CRDs in parallel measured no faster
            self.api.apply(obj)
        crds = [o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition"]

        def established() -> bool:
            for name in crds:
                crd = self.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])}
                if conds.get("Established") != "True":
                    return False
            return True

        Api.wait("Kueue CRDs established", established, timeout=60, interval=0.1)
        self.timings["kueue-objects"] = time.monotonic() - t0

    def start_kueue(self, timeout: float = 90) -> None:
        """Start (or restart) the Kueue manager and wait until its webhooks and visibility API serve."""
        if "kueue" in self.procs and self.procs["kueue"].alive():
            return
        # Kueue's visibility server writes its self-signed serving certificate to the fixed
        # directory /visibility (pkg/visibility/server.go certDir); it must be creatable.
        vis = Path("/visibility")
        if not (os.access(vis, os.W_OK) if vis.exists() else os.access("/", os.W_OK)):
            raise ClusterError("Kueue's visibility server needs a writable /visibility (run as root, or create "
                               "/visibility owned by this user)")
        cfg = kueue_manifests.configuration(
            webhook_port=self.kueue_webhook_port,
            visibility_port=self.kueue_visibility_port,
            health_port=self.kueue_health_port,
            cert_dir=self.workdir / "kueue-certs",
            frameworks=self.kueue_frameworks,
            multikueue=self.kueue_multikueue,
        )
        cfg_path = self.workdir / "kueue-config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        self._start_secret_sync(self.workdir / "kueue-certs")
        self._spawn("kueue", [
            str(self.bindir / "kueue"),
            f"--config={cfg_path}",
            f"--kubeconfig={self.kubeconfig}",
            "--zap-log-level=info",
        ], env={"KUBECONFIG": str(self.kubeconfig)})

        def ready() -> bool:
            r = httpx.get(f"http://127.0.0.1:{self.kueue_health_port}/readyz", timeout=2, trust_env=False)
            if r.status_code != 200:
                return False
            # caBundle injected and the webhooks answer: a server-side dry run passes through them
            self.api.request(
                "POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
                body={"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                      "metadata": {"name": "readiness-probe"}},
                params={"dryRun": "All"},
            )
            svc = self.api.get("/apis/apiregistration.k8s.io/v1/apiservices/v1beta2.visibility.kueue.x-k8s.io")
            conds = {c["type"]: c["status"] for c in svc.get("status", {}).get("conditions", [])}
            return conds.get("Available") == "True"

        self._wait("kueue", "readyz, webhooks and visibility APIService", ready, timeout)

    def stop_kueue(self) -> None:
        proc = self.procs.pop("kueue", None)
        if proc:
            proc.stop()
        if self._secret_sync_stop is not None:
            self._secret_sync_stop.set()
            self._secret_sync_stop = None

    def _start_secret_sync(self, cert_dir: Path) -> None:
        """Play the kubelet's Secret volume: Kueue's cert rotator writes its certificates into the
        Secret only and expects them mounted at `webhook.certDir`; mirror the Secret's keys there."""
        if self._secret_sync_stop is not None:
            return
        stop = self._secret_sync_stop = threading.Event()
        cert_dir.mkdir(parents=True, exist_ok=True)
        path = f"/api/v1/namespaces/{kueue_manifests.NAMESPACE}/secrets/{kueue_manifests.WEBHOOK_SECRET}"
        api = Api(self.server, self.pki.ca.cert_path, *self.pki.admin)

        def run() -> None:
            import base64

            written: dict[str, bytes] = {}
            try:
                while not stop.is_set():
                    with contextlib.suppress(Exception):
                        secret = api.get(path, ok404=True) or {}
                        for key, b64 in (secret.get("data") or {}).items():
                            value = base64.b64decode(b64)
                            if written.get(key) != value:
                                tmp = cert_dir / f".{key}.tmp"
                                tmp.write_bytes(value)
                                tmp.chmod(0o600)
                                os.replace(tmp, cert_dir / key)
                                written[key] = value
                    stop.wait(0.2 if len(written) < 2 else 2.0)
            finally:
                api.close()

        threading.Thread(target=run, name="kueue-secret-volume", daemon=True).start()

