"""A real Kubernetes node on this machine for the test cluster: containerd (with its CRI plugin and
the runc v2 shim, Debian's runc underneath), CNI bridge + host-local + loopback, the kubelet,
kube-scheduler, kube-proxy (iptables mode) and kube-router's network policy controller (NetworkPolicy
enforced with iptables and ipset), all from the versions scripts/build_kube.py and
scripts/build_node.py build and cache.

    node = KubeNode.start(cluster)          # one per machine at a time (a file lock serializes sessions)
    node.load_image(archive)                # `ctr -n k8s.io images import`; pods use imagePullPolicy Never
    ns = node.namespace("smoke")            # restricted pod security, tolerating the node's taint
    host, port = node.relay(5432)           # a host loopback port (Postgres) reachable from pods
    node.stop()

How it is wired (kube/README.md has the reasons):
- The node's address is this machine's primary IPv4 address (`node_ip()`): the kubelet registers
  it as InternalIP and serves on it, the API server listens on all addresses and advertises it, so
  the `kubernetes` Service (10.0.0.1:443) leads there through kube-proxy's iptables rules.
- Pods live on the bridge `cgbr0`, 10.244.0.0/24 (gateway 10.244.0.1, no masquerading: nothing
  outside this machine is reachable anyway). There is no cluster DNS: pods use the Service
  environment variables and IP addresses.
- The node is tainted `convgate.io/test-node=kubelet:NoSchedule`; a namespace made by `namespace()`
  carries the PodTolerationRestriction annotation that tolerates it, so its pods (Jobs, Deployments,
  hooks, without changing them) go to this node. Pods in other namespaces stay with the pod runner
  (tests/cluster/pod_runner.py), whose fake Node carries its own taint, so kube-scheduler never
  places anything there.
- containerd's root, state, socket, CNI config and IPAM state, the kubelet's root dir and pod logs
  all live under `<cluster workdir>/node/`; the kubelet's cgroups under `/convgate-node` in every
  cgroup v1 hierarchy. `stop()` deletes the pods, stops everything, removes kube-proxy's rules, the
  bridge, the mounts and the cgroups.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from .api import Api, ApiError
from .cluster import REPO, Proc, free_port, process_env

if TYPE_CHECKING:
    from .cluster import Cluster

NODE_NAME = "convgate-kubelet"
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
BRIDGE = "cgbr0"
CGROUP_ROOT = "convgate-node"
TAINT_KEY = "convgate.io/test-node"  # the pod runner's fake Node carries the same key (pod_node.py)
TAINT = {"key": TAINT_KEY, "value": "kubelet", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT_KEY, "operator": "Equal", "value": "kubelet", "effect": "NoSchedule"}
NODE_LABELS = {"convgate.io/node-pool": "cpu"}  # manifests/kueue/resource-flavor.yaml's nodeLabels
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy", "kubectl")
KUBE_ROUTER_USER = "convgate:kube-router"
# what kube-router's network policy controller reads (its own ClusterRole, bound to its certificate)
KUBE_ROUTER_RULES = [
    {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
]
# kube-router's network policy state: filter-table chains and ipsets with these prefixes
KUBE_ROUTER_CHAINS = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
KUBE_ROUTER_IPSETS = ("KUBE-SRC-", "KUBE-DST-", "inet6:KUBE-SRC-", "inet6:KUBE-DST-")
LOCK = Path(tempfile.gettempdir()) / "convgate-node.lock"
CGROUP_FS = Path("/sys/fs/cgroup")


class NodeError(RuntimeError):
    pass


def find_node_dir() -> Path:
    """$CONVGATE_NODE_DIR, else the cache dir of scripts/build_node.py (no build here)."""
    if os.environ.get("CONVGATE_NODE_DIR"):
        ndir = Path(os.environ["CONVGATE_NODE_DIR"])
    else:
        out = subprocess.run([sys.executable, str(REPO / "scripts" / "build_node.py"), "--print"],
                             check=True, capture_output=True, text=True).stdout
        ndir = Path(out.strip().splitlines()[-1])
    index = ndir / "images" / "images.json"
    missing = [b for b in ("containerd", "containerd-shim-runc-v2", "ctr", "pause", "kube-router")
               if not (ndir / "bin" / b).exists()]
    missing += [p for p in ("bridge", "host-local", "loopback") if not (ndir / "cni" / p).exists()]
    if not index.exists():
        missing.append("images")
    missing += [f"{tool} (Debian package)" for tool in ("runc", "iptables", "ipset") if not shutil.which(tool)]
    if missing:
        raise FileNotFoundError(f"node binaries missing in {ndir} ({', '.join(missing)}); "
                                "run: python3 scripts/build_kube.py")
    return ndir


def check_node_binaries(bindir: Path) -> None:
    missing = [b for b in NODE_BINARIES if not (bindir / b).exists()]
    if missing:
        raise FileNotFoundError(f"node binaries missing in {bindir} ({', '.join(missing)}); "
                                "run: python3 scripts/build_kube.py")


def _cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, ..., name=systemd), not the unified one."""
    roots = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup" and parts[1].startswith(str(CGROUP_FS) + "/"):
            roots.append(Path(parts[1]))
    return roots


def archive_refs(archive: Path) -> dict[str, str]:
    """Image name -> manifest digest, from an OCI archive's index.json (names from containerd's or the
    OCI ref annotation, when the latter is a full reference); {} when it names none."""
    with tarfile.open(archive) as tar:
        try:
            member = tar.getmember("index.json")
        except KeyError:
            return {}
        handle = tar.extractfile(member)
        index = json.loads(handle.read()) if handle else {}
    refs = {}
    for m in index.get("manifests", []):
        notes = m.get("annotations") or {}
        name = notes.get("io.containerd.image.name") or notes.get("org.opencontainers.image.ref.name", "")
        if "/" in name and ":" in name.rsplit("/", 1)[-1]:
            refs[name] = m["digest"]
    return refs


def _quiet(*argv: str) -> int:
    """Run a clean-up command whose failure only means there was nothing to clean; its exit code."""
    return subprocess.run(argv, check=False, capture_output=True, timeout=60, env=process_env()).returncode


def _clean_kube_router() -> None:
    """Remove kube-router's network policy chains (and the jumps to them) and its ipsets."""
    for tool in ("iptables", "ip6tables"):
        saved = subprocess.run([f"{tool}-save", "-t", "filter"], check=False, capture_output=True, text=True).stdout
        chains = [line[1:].split()[0] for line in saved.splitlines()
                  if line.startswith(":") and line[1:].startswith(KUBE_ROUTER_CHAINS)]
        for line in saved.splitlines():  # jumps from the built-in chains
            parts = shlex.split(line)
            if line.startswith("-A ") and parts[1] in ("INPUT", "FORWARD", "OUTPUT") and "-j" in parts and \
                    parts[parts.index("-j") + 1].startswith(KUBE_ROUTER_CHAINS):
                _quiet(tool, "-w", "-D", *parts[1:])
        for chain in chains:
            _quiet(tool, "-w", "-F", chain)
        for chain in chains:
            _quiet(tool, "-w", "-X", chain)
    if shutil.which("ipset"):
        names = subprocess.run(["ipset", "list", "-n"], check=False, capture_output=True, text=True).stdout.split()
        for name in names:
            if name.startswith(KUBE_ROUTER_IPSETS):
                _quiet("ipset", "destroy", name)


def _mounts_under(prefix: Path) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mountpoint = line.split()[4].replace("\\040", " ")
        if mountpoint == str(prefix) or mountpoint.startswith(str(prefix) + "/"):
            found.append(mountpoint)
    return found


@dataclass
class KubeNode:
    cluster: Cluster
    bindir: Path
    nodedir: Path
    workdir: Path
    ip: str
    kubelet_port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    images: dict[str, dict[str, str]] = field(default_factory=dict)
    loaded: dict[str, list[str]] = field(default_factory=dict)
    kubelet_client: tuple[Path, Path] = (Path(), Path())
    kubelet_serving: tuple[Path, Path] = (Path(), Path())
    _scheduler_port: int = 0
    _proxy_health: int = 0
    _lock_fd: int | None = None
    _relays: list[_Relay] = field(default_factory=list)

    name = NODE_NAME

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def start(cls, cluster: Cluster, nodedir: Path | None = None, lock_timeout: float = 1800) -> KubeNode:
        t0 = time.monotonic()
        check_node_binaries(cluster.bindir)
        nodedir = nodedir or find_node_dir()
        node = cls(cluster=cluster, bindir=cluster.bindir, nodedir=nodedir, workdir=cluster.workdir / "node",
                   ip=cluster.node_ip)
        node._acquire_lock(lock_timeout)
        try:
            node._clean_host()  # whatever a killed session left behind
            node._write_files()
            node._start_containerd()
            for name in ("pause", "busybox", "kubectl"):
                node.images[name] = node._image_entry(name)
                node.load_image(nodedir / "images" / node.images[name]["archive"])
            node._start_scheduler()
            node._start_proxy()
            node._start_kubelet()
            node._wait_ready()
            node._start_kube_router()
        except BaseException:
            logs = {n: p.tail() for n, p in node.procs.items()}
            node.stop()
            detail = "\n".join(f"--- {n} ---\n{t}" for n, t in logs.items())
            raise NodeError(f"node failed to start; last log lines:\n{detail}") from None
        node.timings["total"] = time.monotonic() - t0
        return node

    def __enter__(self) -> KubeNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def api(self) -> Api:
        return self.cluster.api

    @property
    def busybox(self) -> str:
        return self.images["busybox"]["ref"]

    @property
    def kubectl_image(self) -> str:
        """busybox plus this cluster's kubectl: an in-cluster API client."""
        return self.images["kubectl"]["ref"]

    @property
    def containerd_root(self) -> Path:
        """containerd's root (content store, snapshots, metadata) persists beside the node's binaries, so a
        multi-GB image imported once is there for the next session (imports are skipped by digest).
        Only one node runs at a time (the lock); containers are removed at every stop."""
        return self.nodedir.parent / "node-state" / "containerd-root"

    @property
    def containerd_sock(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def logs(self, name: str, n: int = 60) -> str:
        p = self.procs.get(name)
        return p.tail(n) if p else ""

    def describe(self) -> str:
        return json.dumps({"node": self.name, "ip": self.ip, "workdir": str(self.workdir),
                           "timings": {k: round(v, 2) for k, v in self.timings.items()}}, indent=2)

    # --- the machine-wide lock ---------------------------------------------------------------
    def _acquire_lock(self, timeout: float) -> None:
        """One node per machine: the bridge, kube-proxy's iptables chains and the cgroup root are global."""
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        t0 = time.monotonic()
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise NodeError(f"another test session holds {LOCK} (its node is running)") from None
                if not told:
                    print(f"node: waiting for {LOCK} (another session's node is running)", file=sys.stderr)
                    told = True
                time.sleep(2)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.workdir}\n".encode())
        self._lock_fd = fd
        self.timings["lock wait"] = time.monotonic() - t0

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = None

    # --- files -------------------------------------------------------------------------------
    def _write_files(self) -> None:
        w = self.workdir
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        for d in ("logs", "containerd/state", "cni/net.d", "cni/ipam", "kubelet",
                  "pod-logs", "volume-plugins", "opt", "tmp"):
            (w / d).mkdir(parents=True, exist_ok=True)
        ca = self.cluster.pki.ca
        certs = w / "pki"
        certs.mkdir(exist_ok=True)
        self.kubelet_client = ca.issue(certs, "kubelet-client", f"system:node:{self.name}", orgs=("system:nodes",),
                                       client=True)
        self.kubelet_serving = ca.issue(certs, "kubelet-serving", self.name, dns=(self.name, "localhost"),
                                        ips=(self.ip, "127.0.0.1"), server=True)
        scheduler = ca.issue(certs, "kube-scheduler", "system:kube-scheduler", client=True)
        proxy = ca.issue(certs, "kube-proxy", "system:kube-proxy", client=True)
        router = ca.issue(certs, "kube-router", KUBE_ROUTER_USER, client=True)
        for name, (crt, key) in (("kubelet", self.kubelet_client), ("kube-scheduler", scheduler),
                                 ("kube-proxy", proxy), ("kube-router", router)):
            self._kubeconfig(w / f"{name}.kubeconfig", crt, key)
        (w / "cni" / "net.d" / "10-convgate.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "convgate",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(w / "cni" / "ipam"),
                         "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            }],
        }, indent=2))
        pause = self._image_entry("pause")["ref"]
        (w / "containerd" / "config.toml").write_text(containerd_config(
            root=self.containerd_root, state=w / "containerd" / "state", sock=self.containerd_sock,
            cni_bin=self.nodedir / "cni", cni_conf=w / "cni" / "net.d", pause=pause, opt=w / "opt",
            runc=Path(shutil.which("runc") or "/usr/sbin/runc")))

    def _kubeconfig(self, path: Path, crt: Path, key: Path) -> Path:
        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "convgate-test", "cluster": {
                "server": self.cluster.server, "certificate-authority": str(self.cluster.pki.ca.cert_path)}}],
            "users": [{"name": "user", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "convgate-test", "context": {"cluster": "convgate-test", "user": "user"}}],
            "current-context": "convgate-test",
        }
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def _image_entry(self, name: str) -> dict[str, str]:
        return json.loads((self.nodedir / "images" / "images.json").read_text())[name]

    # --- processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        fh = log.open("ab")
        path = os.pathsep.join([str(self.nodedir / "bin"), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                "/usr/bin", "/sbin", "/bin"])
        popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=process_env({"PATH": path, "TMPDIR": str(self.workdir / "tmp"), **(env or {})}),
                                 cwd=self.workdir, start_new_session=True)
        fh.close()
        proc = Proc(name, popen, log)
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, what: str, check: Any, timeout: float) -> None:
        proc = self.procs[name]
        t0 = time.monotonic()

        def guarded() -> Any:
            if not proc.alive():
                raise NodeError(f"{name} exited with {proc.popen.returncode}:\n{proc.tail()}")
            return check()

        try:
            Api.wait(f"{name}: {what}", guarded, timeout=timeout, interval=0.1)
        except TimeoutError as exc:
            raise NodeError(f"{exc}\n{proc.tail()}") from None
        self.timings[name] = time.monotonic() - t0

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [str(self.nodedir / "bin" / "ctr"), "--address", str(self.containerd_sock), "-n", "k8s.io", *args]
        out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, env=process_env())
        if check and out.returncode != 0:
            raise NodeError(f"{' '.join(argv[3:])} failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
        return out

    def _start_containerd(self) -> None:
        self._spawn("containerd", [str(self.nodedir / "bin" / "containerd"),
                                   "--config", str(self.workdir / "containerd" / "config.toml"), "--log-level", "info"])
        self._wait("containerd", "CRI up", lambda: self.containerd_sock.exists()
                   and self.ctr("plugins", "ls", check=False).returncode == 0, 60)
        plugins = self.ctr("plugins", "ls").stdout
        bad = [line for line in plugins.splitlines() if re.search(r"\bcri\b", line) and " error" in line]
        if bad:
            raise NodeError("containerd's CRI plugin failed to load:\n" + "\n".join(bad) + "\n"
                            + self.logs("containerd"))

    def _start_scheduler(self) -> None:
        kc = str(self.workdir / "kube-scheduler.kubeconfig")
        port = free_port()
        self._spawn("kube-scheduler", [
            str(self.bindir / "kube-scheduler"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}", "--leader-elect=false", "--v=1"])
        self._scheduler_port = port

    def _start_proxy(self) -> None:
        health, metrics = free_port(), free_port()
        self._spawn("kube-proxy", [
            str(self.bindir / "kube-proxy"), f"--kubeconfig={self.workdir / 'kube-proxy.kubeconfig'}",
            "--proxy-mode=iptables", f"--cluster-cidr={POD_CIDR}", f"--hostname-override={self.name}",
            f"--healthz-bind-address=127.0.0.1:{health}", f"--metrics-bind-address=127.0.0.1:{metrics}",
            # leave the machine's conntrack sysctls and route_localnet alone
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0", "--iptables-localhost-nodeports=false",
            "--v=1"])
        self._proxy_health = health

    def _start_kubelet(self) -> None:
        w = self.workdir
        self.kubelet_port = free_port()
        for root in _cgroup_hierarchies():  # the kubelet wants its cgroup root to exist (kind does the same)
            d = root / CGROUP_ROOT
            d.mkdir(exist_ok=True)
            if root.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((root / f).read_text())
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP_ROOT}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "address": self.ip, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            "tlsCertFile": str(self.kubelet_serving[0]), "tlsPrivateKeyFile": str(self.kubelet_serving[1]),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cluster.pki.ca.cert_path)}},
            "authorization": {"mode": "Webhook"},
            "registerWithTaints": [TAINT],
            "clusterDomain": "cluster.local", "clusterDNS": [],
            "failSwapOn": False, "podLogsDir": str(w / "pod-logs"),
            "volumePluginDir": str(w / "volume-plugins"),
            "maxPods": 110, "serializeImagePulls": False,
            # this disk is shared and busy: evict only when memory is really short, never for disk
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                             "imagefs.available": "0%", "imagefs.inodesFree": "0%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "imageMinimumGCAge": "87600h",
            "nodeStatusUpdateFrequency": "2s", "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s", "fileCheckFrequency": "10s",
            "runtimeRequestTimeout": "10m",
            "shutdownGracePeriod": "0s",
            "containerLogMaxSize": "10Mi", "containerLogMaxFiles": 2,
            "rotateCertificates": False, "serverTLSBootstrap": False,
            "resolvConf": "/etc/resolv.conf",
            # KUBE-IPTABLES-HINT / KUBE-FIREWALL are for other components; kube-proxy makes its own
            "makeIPTablesUtilChains": False,
        }
        (w / "kubelet-config.yaml").write_text(yaml.safe_dump(config))
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        self._spawn("kubelet", [
            str(self.bindir / "kubelet"), f"--config={w / 'kubelet-config.yaml'}",
            f"--kubeconfig={w / 'kubelet.kubeconfig'}", f"--root-dir={w / 'kubelet'}",
            f"--cert-dir={w / 'kubelet-certs'}", f"--hostname-override={self.name}", f"--node-ip={self.ip}",
            f"--node-labels={labels}", "--v=2"])

    def _wait_ready(self) -> None:
        def ready() -> bool:
            node = self.api.get(f"/api/v1/nodes/{self.name}", ok404=True)
            conds = {c["type"]: c["status"] for c in (node or {}).get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"

        self._wait("kubelet", f"Node {self.name} Ready", ready, 120)
        self._untaint_not_ready()

        def proxy_healthy() -> bool:
            r = httpx.get(f"http://127.0.0.1:{self._proxy_health}/healthz", timeout=2, trust_env=False)
            return r.status_code == 200

        self._wait("kube-proxy", "/healthz", proxy_healthy, 60)

        def scheduler_healthy() -> bool:
            r = httpx.get(f"https://127.0.0.1:{self._scheduler_port}/healthz", verify=False, timeout=2,
                          trust_env=False)
            return r.status_code == 200

        self._wait("kube-scheduler", "/healthz", scheduler_healthy, 60)

    def _start_kube_router(self) -> None:
        """kube-router with only its network policy controller (no routing, no service proxy, no CNI)."""
        api = self.api
        api.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": KUBE_ROUTER_USER}, "rules": KUBE_ROUTER_RULES})
        api.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": KUBE_ROUTER_USER},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": KUBE_ROUTER_USER},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBE_ROUTER_USER}]})
        health = free_port()
        self._spawn("kube-router", [
            str(self.nodedir / "bin" / "kube-router"), f"--kubeconfig={self.workdir / 'kube-router.kubeconfig'}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
            "--enable-cni=false", "--enable-pod-egress=false", "--enable-ipv6=false",
            f"--hostname-override={self.name}", "--service-cluster-ip-range=10.0.0.0/24",
            f"--health-port={health}", "--iptables-sync-period=1m", "--v=1"])

        def healthy() -> bool:
            r = httpx.get(f"http://127.0.0.1:{health}/healthz", timeout=2, trust_env=False)
            return r.status_code == 200

        self._wait("kube-router", "/healthz", healthy, 60)

    def _untaint_not_ready(self) -> None:
        """Drop `node.kubernetes.io/not-ready` (put on a new Node by the TaintNodesByCondition admission)
        once the kubelet reports Ready: the node lifecycle controller's job, which this control plane
        does not run (it would find the pod runner's fake Node without heartbeats and taint it too)."""
        for _ in range(20):
            node = self.api.get(f"/api/v1/nodes/{self.name}")
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
            if kept == taints:
                return
            try:
                self.api.request("PATCH", f"/api/v1/nodes/{self.name}", content_type="application/json-patch+json",
                                 body=[{"op": "test", "path": "/metadata/resourceVersion",
                                        "value": node["metadata"]["resourceVersion"]},
                                       {"op": "replace", "path": "/spec/taints", "value": kept}])
            except ApiError as exc:
                if exc.status not in (409, 422):
                    raise
        raise NodeError("could not remove the not-ready taint")

    # --- what the tests use ------------------------------------------------------------------
    def load_image(self, archive: Path) -> list[str]:
        """Import an OCI (or docker) archive into containerd's `k8s.io` namespace, unpacked for the
        overlayfs snapshotter, unless containerd already has every image it names at the same digest
        (its root persists between sessions); older tags of the same repositories are removed so their
        layers can be collected. Returns the image references. Pods use them with
        `imagePullPolicy: Never` (or IfNotPresent): nothing is ever pulled."""
        key = str(archive.resolve())
        if key in self.loaded:
            return self.loaded[key]
        t0 = time.monotonic()
        wanted = archive_refs(archive)
        have = self.image_digests()
        if not wanted or any(have.get(ref) != digest for ref, digest in wanted.items()):
            before = set(have)
            self.ctr("images", "import", "--snapshotter", "overlayfs", "--platform", "linux/amd64", str(archive))
            have = self.image_digests()
            wanted = wanted or {ref: have[ref] for ref in set(have) - before}
            self.timings[f"import {archive.name}"] = time.monotonic() - t0
        else:
            self.timings[f"import {archive.name} (present)"] = time.monotonic() - t0
        repos = {ref.rsplit(":", 1)[0] for ref in wanted}
        stale = [ref for ref in have if ref.rsplit(":", 1)[0] in repos and ref not in wanted]
        if stale:
            self.ctr("images", "rm", *stale, check=False)
        # the CRI plugin's `sha256:<image id>` records of manifests no name points to any more keep
        # their layers alive: drop them too, so containerd's garbage collector frees the disk
        named = set(self.image_digests().values())
        orphans = [ref for ref, digest in self.image_digests(with_ids=True).items()
                   if ref.startswith("sha256:") and digest not in named]
        if orphans:
            self.ctr("images", "rm", *orphans, check=False)
        self.loaded[key] = sorted(wanted)
        return self.loaded[key]

    def image_digests(self, *, with_ids: bool = False) -> dict[str, str]:
        """Image name -> manifest (or index) digest in containerd's k8s.io namespace; `with_ids` also
        lists the `sha256:<config digest>` records the CRI plugin adds."""
        out = self.ctr("images", "ls").stdout.splitlines()[1:]
        return {parts[0]: parts[2] for parts in (line.split() for line in out)
                if len(parts) > 2 and (with_ids or not parts[0].startswith("sha256:"))}

    def image_refs(self) -> list[str]:
        """Image names in containerd's k8s.io namespace (not the `sha256:` ids the CRI plugin adds)."""
        return [ref for ref in (line.strip() for line in self.ctr("images", "ls", "-q").stdout.splitlines())
                if ref and not ref.startswith("sha256:")]

    def namespace(self, name: str, *, restricted: bool = True) -> str:
        """A namespace whose pods run on this node (the toleration is added to every pod by the
        PodTolerationRestriction admission plugin), pod security `restricted` unless told otherwise."""
        labels = {"pod-security.kubernetes.io/enforce": "restricted",
                  "pod-security.kubernetes.io/enforce-version": "latest"} if restricted else {}
        self.api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "labels": labels,
            "annotations": {"scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps([TOLERATION])}}})
        Api.wait(f"ServiceAccount {name}/default",
                 lambda: self.api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default", ok404=True), timeout=30)
        return name

    def relay(self, port: int, host: str = "127.0.0.1") -> tuple[str, int]:
        """Make `host:port` on this machine (e.g. Postgres on loopback) reachable from pods: a TCP relay
        listening on the node address. Returns (address, port) for the pods."""
        relay = _Relay(self.ip, (host, port))
        relay.start()
        self._relays.append(relay)
        return self.ip, relay.port

    def task_pid(self, namespace: str, pod: str, container: str) -> int:
        """The host PID of a running container's main process (from the CRI labels containerd keeps)."""
        out = self.ctr("containers", "ls", f"labels.\"io.kubernetes.pod.namespace\"=={namespace}").stdout
        for line in out.splitlines()[1:]:
            cid = line.split()[0]
            info = json.loads(self.ctr("containers", "info", cid).stdout)
            labels = info.get("Labels", {})
            if labels.get("io.kubernetes.pod.name") == pod and labels.get("io.kubernetes.container.name") == container:
                task = self.ctr("tasks", "ls").stdout
                for tline in task.splitlines()[1:]:
                    parts = tline.split()
                    if parts and parts[0] == cid and parts[2] == "RUNNING":
                        return int(parts[1])
        raise NodeError(f"no running container {container} of pod {namespace}/{pod}")

    def kill_container(self, namespace: str, pod: str, container: str, sig: str = "SIGKILL") -> None:
        """Kill a container's task through the runtime (containerd -> the shim -> runc kill)."""
        out = self.ctr("containers", "ls", f"labels.\"io.kubernetes.pod.namespace\"=={namespace}").stdout
        for line in out.splitlines()[1:]:
            cid = line.split()[0]
            labels = json.loads(self.ctr("containers", "info", cid).stdout).get("Labels", {})
            if labels.get("io.kubernetes.pod.name") == pod and labels.get("io.kubernetes.container.name") == container:
                self.ctr("tasks", "kill", "--signal", sig, cid)
                return
        raise NodeError(f"no container {container} of pod {namespace}/{pod}")

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, env=process_env())
        if check and out.returncode != 0:
            raise NodeError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
        return out

    def kubectl_popen(self, *args: str) -> subprocess.Popen[str]:
        argv = [str(self.bindir / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env(),
                                start_new_session=True)

    # --- teardown ----------------------------------------------------------------------------
    def _own_shims(self) -> list[int]:
        """containerd-shim-runc-v2 processes serving this node's containerd (by its socket address)."""
        pids = []
        needle = str(self.containerd_sock).encode()
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmd = (p / "cmdline").read_bytes()
                if b"containerd-shim" in cmd and needle in cmd:
                    pids.append(int(p.name))
        return pids

    def _delete_pods(self, timeout: float) -> None:
        """Force-delete the pods bound here and let the kubelet stop their sandboxes (CNI DEL included)."""
        with contextlib.suppress(Exception):
            pods = self.api.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.name}"})["items"]
            for pod in pods:
                md = pod["metadata"]
                with contextlib.suppress(ApiError):
                    self.api.delete(f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}",
                                    params={"gracePeriodSeconds": "0"})
        if "kubelet" in self.procs and self.procs["kubelet"].alive() and "containerd" in self.procs:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                out = self.ctr("tasks", "ls", check=False, timeout=10)
                if out.returncode != 0 or len(out.stdout.strip().splitlines()) <= 1:
                    break
                time.sleep(0.5)

    def _tasks_left(self) -> bool:
        out = self.ctr("tasks", "ls", check=False, timeout=10)
        return out.returncode == 0 and len(out.stdout.strip().splitlines()) > 1

    def _remove_containers(self) -> None:
        """Kill every task left, then remove the containers and sandboxes: containerd's root outlives
        the session, and a container kept there would come back as a dead pod in the next one."""
        for line in self.ctr("tasks", "ls", check=False, timeout=10).stdout.splitlines()[1:]:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", line.split()[0], check=False, timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._tasks_left():
            time.sleep(0.2)
        for line in self.ctr("tasks", "ls", check=False, timeout=10).stdout.splitlines()[1:]:
            self.ctr("tasks", "delete", "--force", line.split()[0], check=False, timeout=10)
        containers = [line.split()[0] for line in self.ctr("containers", "ls", "-q", check=False).stdout.splitlines()
                      if line.strip()]
        if containers:
            self.ctr("containers", "rm", *containers, check=False, timeout=60)
        sandboxes = [line.split()[0] for line in self.ctr("sandboxes", "ls", "-q", check=False).stdout.splitlines()
                     if line.strip()]
        if sandboxes:
            self.ctr("sandboxes", "rm", "--force", *sandboxes, check=False, timeout=60)

    def stop(self) -> None:
        for relay in self._relays:
            relay.stop()
        self._relays.clear()
        scheduler = self.procs.pop("kube-scheduler", None)
        if scheduler:
            scheduler.stop()
        self._delete_pods(timeout=30)
        for name in ("kubelet", "kube-proxy", "kube-router"):
            proc = self.procs.pop(name, None)
            if proc:
                proc.stop()
        if "containerd" in self.procs:
            self._remove_containers()
            proc = self.procs.pop("containerd")
            proc.stop()
        for pid in self._own_shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.stop()
        self.procs.clear()
        self._clean_host()
        with contextlib.suppress(Exception):
            self.api.delete(f"/api/v1/nodes/{self.name}")
        self._release_lock()
        if not os.environ.get("CONVGATE_KEEP_CLUSTER"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _clean_host(self) -> None:
        """What a node leaves outside its work dir: kube-proxy's iptables chains, the bridge, mounts
        and cgroups. Also run at start, for a session that was killed before its teardown."""
        kube_proxy = self.bindir / "kube-proxy"
        if kube_proxy.exists():
            _quiet(str(kube_proxy), "--cleanup", "--proxy-mode=iptables")
        for tool in ("iptables", "ip6tables"):  # what `kube-proxy --cleanup` leaves: an empty KUBE-FIREWALL
            for chain in ("INPUT", "OUTPUT"):
                while _quiet(tool, "-w", "-D", chain, "-j", "KUBE-FIREWALL") == 0:
                    pass
            _quiet(tool, "-w", "-F", "KUBE-FIREWALL")
            _quiet(tool, "-w", "-X", "KUBE-FIREWALL")
        _clean_kube_router()
        for mountpoint in sorted(_mounts_under(self.workdir) + _mounts_under(self.containerd_root), key=len,
                                 reverse=True):
            _quiet("umount", "-l", mountpoint)
        _quiet("ip", "link", "delete", BRIDGE)
        for root in _cgroup_hierarchies():
            base = root / CGROUP_ROOT
            if not base.exists():
                continue
            for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()


def containerd_config(*, root: Path, state: Path, sock: Path, cni_bin: Path, cni_conf: Path, pause: str,
                      opt: Path, runc: Path) -> str:
    """containerd 2.x configuration (version 4) for a CRI node on cgroup v1 without systemd: every socket
    and directory its own, the runc v2 shim with Debian's runc and cgroupfs, CNI from `cni_bin` and
    `cni_conf`, the offline pause image pinned as the sandbox image."""
    return f"""version = 4
root = "{root}"
state = "{state}"

[plugins."io.containerd.server.v1.grpc"]
  address = "{sock}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  disable_apparmor = true
  # this machine withholds CAP_SYS_RESOURCE even from root: an oom_score_adj below containerd's own
  # (the kubelet asks -998 for sandboxes) is refused, so clamp it as for a rootless node
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{state}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
"""


class _Relay:
    """A TCP relay from (listen address, free port) to `target`, one pair of pump threads per connection."""

    def __init__(self, listen: str, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((listen, free_port()))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []

    def start(self) -> None:
        self.sock.listen(64)
        threading.Thread(target=self._accept, name=f"relay-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self._stop.is_set():
                client.close()
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.close()
