"""A real control plane: etcd, kube-apiserver, kube-controller-manager and Kueue.

The binaries come from scripts/build_kube.py (built from Go modules, cached by version). Every
process runs in its own process group with its output in `<workdir>/logs/<name>.log`, listens on
127.0.0.1 on free ports (the API server on every address, advertising this machine's primary one,
so that pods on the real node of tests/cluster/node.py reach it through the `kubernetes` Service),
and gets an environment without HTTP(S)_PROXY. `Cluster.stop()` kills
the groups and removes the work dir (kept when CONVGATE_KEEP_CLUSTER=1).

    with Cluster.start() as c:
        c.api.get("/version")            # httpx with the admin client certificate
        c.kubeconfig                      # admin kubeconfig (CN=admin, O=system:masters)
        c.stop_kueue(); c.start_kueue()   # Kueue down / up again
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from .api import Api
from .cluster_kueue import ClusterError, KueueControl
from .pki import Pki

REPO = Path(__file__).resolve().parents[2]
SERVICE_CIDR = "10.0.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "ttl-after-finished-controller",
    "root-ca-certificate-publisher-controller",
    "deployment-controller",
    "replicaset-controller",
    # for the real node (tests/cluster/node.py): Services' endpoints for kube-proxy, PVs bound to claims
    "endpointslice-controller",
    "persistentvolume-binder-controller",
)
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kueue")
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ends of outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free loopback port below the ephemeral range, never handed out twice in this process.

    Ports are bound again long after they are picked (Kueue restarts mid-session); one from the
    ephemeral range may by then be the local end of some outgoing connection."""
    low, _ = ephemeral_range()
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port below {low}")


def process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    no_proxy = "127.0.0.1,localhost,::1,.svc,.svc.cluster.local,.cluster.local"
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    env.update(extra or {})
    return env


def node_ip() -> str:
    """This machine's primary IPv4 address (the source address of its default route; no packet is
    sent), else the first global address `ip` lists; CONVGATE_NODE_IP overrides. The API server
    advertises it and the real node registers it: pods cannot reach this machine's loopback."""
    if os.environ.get("CONVGATE_NODE_IP"):
        return os.environ["CONVGATE_NODE_IP"]
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.255", 9))  # TEST-NET-1: only the route lookup happens
        addr = s.getsockname()[0]
        if addr and not addr.startswith("127."):
            return addr
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        out = subprocess.run(["ip", "-j", "-4", "addr", "show", "scope", "global"], capture_output=True,
                             text=True, check=True).stdout
        for link in json.loads(out):
            for a in link.get("addr_info", []):
                if a.get("local") and not a["local"].startswith("10.244."):
                    return a["local"]
    return "127.0.0.1"  # no real node possible; the control plane alone still works


def find_binaries() -> Path:
    """$CONVGATE_KUBE_BIN, else the cache dir of scripts/build_kube.py (no build here)."""
    if os.environ.get("CONVGATE_KUBE_BIN"):
        bindir = Path(os.environ["CONVGATE_KUBE_BIN"])
    else:
        out = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "build_kube.py"), "--print"],
            check=True, capture_output=True, text=True,
        ).stdout
        bindir = Path(out.strip().splitlines()[-1])
    missing = [b for b in BINARIES if not (bindir / b).exists()]
    if missing or not (bindir.parent / "kueue-config" / ".complete").exists():
        raise FileNotFoundError(
            f"control-plane binaries missing in {bindir} ({', '.join(missing) or 'kueue-config'}); "
            "run: python3 scripts/build_kube.py"
        )
    return bindir


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        # the group may still hold children even when the leader is gone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


@dataclass
class Cluster(KueueControl):
    workdir: Path
    bindir: Path
    pki: Pki
    etcd_port: int
    api_port: int
    kcm_port: int
    kueue_webhook_port: int
    kueue_visibility_port: int
    kueue_health_port: int
    node_ip: str = "127.0.0.1"
    procs: dict[str, Proc] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    kueue_frameworks: list[str] = field(default_factory=lambda: ["batch/job"])
    kueue_multikueue: dict[str, Any] | None = None  # a MultiKueue manager's `multiKueue` configuration
    _api: Api | None = None
    _secret_sync_stop: threading.Event | None = None

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def start(cls, bindir: Path | None = None, workdir: Path | None = None, *,
              multikueue: dict[str, Any] | None = None) -> Cluster:
        """`multikueue`: run Kueue as a MultiKueue manager with this configuration (tests/cluster/multikueue.py)."""
        t0 = time.monotonic()
        bindir = bindir or find_binaries()
        workdir = workdir or Path(tempfile.mkdtemp(prefix="convgate-cluster-"))
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        ip = node_ip()
        c = cls(
            workdir=workdir, bindir=bindir, pki=Pki.create(workdir / "pki", node_ips=(ip,)), node_ip=ip,
            etcd_port=free_port(), api_port=free_port(), kcm_port=free_port(),
            kueue_webhook_port=free_port(), kueue_visibility_port=free_port(), kueue_health_port=free_port(),
            kueue_multikueue=multikueue,
        )
        try:
            c._write_kubeconfig()
            c._start_etcd()
            c._start_apiserver()
            c._start_kcm()
            c._install_kueue_objects()
            c.start_kueue()
            c._wait_kcm()
        except BaseException:
            logs = {n: p.tail() for n, p in c.procs.items()}
            c.stop()
            detail = "\n".join(f"--- {n} ---\n{t}" for n, t in logs.items())
            raise ClusterError(f"cluster failed to start; last log lines:\n{detail}") from None
        c.timings["total"] = time.monotonic() - t0
        return c

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- access ------------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api(self.server, self.pki.ca.cert_path, *self.pki.admin)
        return self._api

    def token_api(self, token: str) -> Api:
        """A client authenticating with a bearer token (e.g. from TokenRequest) instead of admin."""
        return Api(self.server, self.pki.ca.cert_path, token=token)

    def kube_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for the admin kubeconfig."""
        from kubernetes import config as kconfig

        return kconfig.new_client_from_config(config_file=str(self.kubeconfig))

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        tr = self.api.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )
        return tr["status"]["token"]

    def write_kubeconfig(self, path: Path, *, token: str | None = None, namespace: str | None = None) -> Path:
        """A kubeconfig for this cluster: admin certificate, or `token` (e.g. a ServiceAccount's)."""
        user: dict[str, str]
        if token:
            user = {"token": token}
        else:
            user = {"client-certificate": str(self.pki.admin[0]), "client-key": str(self.pki.admin[1])}
        ctx: dict[str, str] = {"cluster": "convgate-test", "user": "user"}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "convgate-test", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca.cert_path)}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "convgate-test", "context": ctx}],
            "current-context": "convgate-test",
        }
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def logs(self, name: str, n: int = 60) -> str:
        p = self.procs.get(name)
        return p.tail(n) if p else ""

    # --- processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        fh = log.open("ab")
        popen = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=process_env(env), cwd=self.workdir, start_new_session=True,
        )
        fh.close()
        proc = Proc(name, popen, log)
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, what: str, check: Any, timeout: float) -> None:
        proc = self.procs[name]
        t0 = time.monotonic()

        def guarded() -> Any:
            if not proc.alive():
                raise ClusterError(f"{name} exited with {proc.popen.returncode}:\n{proc.tail()}")
            return check()

        try:
            Api.wait(f"{name}: {what}", guarded, timeout=timeout, interval=0.1)
        except TimeoutError as exc:
            raise ClusterError(f"{exc}\n{proc.tail()}") from None
        self.timings[name] = time.monotonic() - t0

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig)

    def _start_etcd(self) -> None:
        peer = free_port()
        url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn("etcd", [
            str(self.bindir / "etcd"),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
            "--quota-backend-bytes=2147483648",
        ])

        def healthy() -> bool:
            r = httpx.get(f"{url}/health", timeout=2, trust_env=False)
            return r.status_code == 200 and r.json().get("health") == "true"

        self._wait("etcd", "/health", healthy, 30)

    def _start_apiserver(self) -> None:
        p = self.pki
        self._spawn("kube-apiserver", [
            str(self.bindir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            # all addresses: pods reach it on the node address through the `kubernetes` Service
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.node_ip}",
            # the `kubernetes` Service's endpoints cannot be a loopback address (a machine without one)
            *(["--endpoint-reconciler-type=none"] if self.node_ip.startswith("127.") else []),
            f"--secure-port={self.api_port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={p.serving[0]}",
            f"--tls-private-key-file={p.serving[1]}",
            f"--client-ca-file={p.ca.cert_path}",
            # Node: the kubelet's own credentials (system:node:<name>), as in a real cluster
            "--authorization-mode=Node,RBAC",
            # PodTolerationRestriction: a namespace's default tolerations send its pods to the real node
            "--enable-admission-plugins=NodeRestriction,PodTolerationRestriction",
            f"--kubelet-client-certificate={p.kubelet_client[0]}",
            f"--kubelet-client-key={p.kubelet_client[1]}",
            f"--kubelet-certificate-authority={p.ca.cert_path}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # the aggregation layer (Kueue's visibility API): the API server authenticates to the
            # extension server with front-proxy-client and passes the caller in X-Remote-* headers
            f"--proxy-client-cert-file={p.front_proxy_client[0]}",
            f"--proxy-client-key-file={p.front_proxy_client[1]}",
            f"--requestheader-client-ca-file={p.front_proxy_ca.cert_path}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--profiling=false",
            # what ServiceAccounts do, so tests can compare the permissions used with a Role
            f"--audit-policy-file={self._write_audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--v=1",
        ])
        self._wait("kube-apiserver", "/readyz", lambda: self.api.get("/readyz") == "ok", 90)

    def stop_apiserver(self) -> None:
        """The API server goes away (etcd keeps the data): what a cluster that becomes unreachable looks like
        to its clients, a MultiKueue manager among them."""
        proc = self.procs.pop("kube-apiserver", None)
        if proc:
            proc.stop(timeout=2.0)

    def restart_apiserver(self) -> None:
        """The API server back on the same port, with the same certificates and data."""
        if "kube-apiserver" not in self.procs:
            self._start_apiserver()

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.jsonl"

    def _write_audit_policy(self) -> Path:
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
        }))
        return path

    def audit_events(self, user: Callable[[str], bool]) -> list[dict[str, Any]]:
        """The audit events (stage ResponseComplete) of requests made by users `user(name)` accepts."""
        events = []
        if self.audit_log.exists():
            for line in self.audit_log.read_text().splitlines():
                event = json.loads(line)
                if event.get("stage") == "ResponseComplete" and user(event.get("user", {}).get("username", "")):
                    events.append(event)
        return events

    def _start_kcm(self) -> None:
        p = self.pki
        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            str(self.bindir / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.kcm_port}",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--leader-elect=false",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--root-ca-file={p.ca.cert_path}",
            f"--service-account-private-key-file={p.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--concurrent-job-syncs=5",
            "--v=1",
        ])

    def _wait_kcm(self) -> None:
        def ready() -> bool:
            r = httpx.get(f"https://127.0.0.1:{self.kcm_port}/healthz", verify=False, timeout=2, trust_env=False)
            if r.status_code != 200:
                return False
            # the serviceaccount controller has created `default` in a namespace
            return self.api.get("/api/v1/namespaces/default/serviceaccounts/default", ok404=True) is not None

        self._wait("kube-controller-manager", "/healthz and ServiceAccount default/default", ready, 60)

    # --- teardown ----------------------------------------------------------------------------
    def stop(self) -> None:
        if self._secret_sync_stop is not None:
            self._secret_sync_stop.set()
        for name in ("kueue", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc:
                # the data is thrown away: no need to wait out the API server's graceful shutdown
                proc.stop(timeout=2.0 if name == "kube-apiserver" else 10.0)
        for proc in list(self.procs.values()):
            proc.stop()
        self.procs.clear()
        if self._api is not None:
            self._api.close()
            self._api = None
        if os.environ.get("CONVGATE_KEEP_CLUSTER"):
            print(f"cluster work dir kept: {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def describe(self) -> str:
        return json.dumps({"server": self.server, "workdir": str(self.workdir), "timings": self.timings}, indent=2)
