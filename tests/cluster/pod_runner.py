"""A stand-in for the kubelet: runs pods' commands as local processes (there is no container runtime).

Three parts: `pod_node.py` registers the Node and binds pods that fit it (there is no
kube-scheduler either); `pod_env.py` resolves each container's environment and checks its volumes
as a kubelet does; this module supervises the processes and writes pod status through the API:

- a container whose configuration a kubelet would refuse (missing Secret, ConfigMap or key that is
  not optional) leaves the pod Pending with the container `Waiting`, reason
  `CreateContainerConfigError` and the kubelet's message, retried until it resolves; a missing
  Secret / ConfigMap volume leaves it `ContainerCreating`; a container without `command` is refused
  (`CreateContainerError`): the image's entrypoint is unknown here.
- init containers run in order, then the containers, each as `command + args` (with `$(VAR)`
  expansion) in its own process group; the image is ignored (the process uses this machine's
  Python and PATH: `base_env`); emptyDir mounts are local directories (see `pod_env.py`). Output
  goes to `<workdir>/<ns>_<pod>/<container>.log`.
- pod status: Pending -> Running (Ready) -> Succeeded or Failed, with each container's `terminated`
  state (exit code, reason `Completed`/`Error`/`OOMKilled`); `restartPolicy: OnFailure` restarts a
  failed container in place and counts `restartCount`.
- when the pod is deleted (deletionTimestamp) it sends SIGTERM, SIGKILL after the grace period
  (capped by `max_grace`), writes the terminal status and removes the pod (grace 0), like a kubelet.
- OOMKilled on request: `oom_when(pod, container) -> bool` decides at container start, or
  `oom_kill(namespace, name)` for a running pod: the process is SIGKILLed and reported
  `OOMKilled`, exit code 137.

Not emulated: images, the contents of Secret / ConfigMap volumes, the service-account token mount,
probes, resource limits, networking (pods share the host's loopback).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .api import Api, ApiError
from .pod_env import ConfigError, PodDict, PodEnv, now
from .pod_node import Node, merge_condition, set_status
from .pod_process import PodWork, Run, Supervisor


class PodRunner:
    def __init__(
        self,
        api: Api,
        *,
        node_name: str = "local-node",
        node_labels: dict[str, str] | None = None,
        base_env: dict[str, str] | None = None,
        workdir: Path | None = None,
        api_host: str = "127.0.0.1",
        api_port: int | None = None,
        max_grace: float = 10.0,
        capacity: dict[str, str] | None = None,
    ):
        self.api = api
        self.node_name = node_name
        self.node_labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(node_labels or {}),
        }
        self.capacity = capacity or {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "1Ti", "pods": "110"}
        if base_env is None:
            path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
            base_env = {"PATH": path, "LANG": os.environ.get("LANG", "C.UTF-8")}
        if api_port:
            base_env = {**base_env, "KUBERNETES_SERVICE_HOST": api_host, "KUBERNETES_SERVICE_PORT": str(api_port)}
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="pod-runner-"))
        self._work: dict[str, PodWork] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.procs = Supervisor(base_env, self._stop, max_grace)
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.node = Node(api, node_name, self.node_labels, self.capacity, self.errors)
        self.env = PodEnv(api, node_name, self.capacity)

    # the supervisor's knobs and record, as the runner's (tests set `oom_when` and `max_grace`)
    @property
    def base_env(self) -> dict[str, str]:
        return self.procs.base_env

    @property
    def max_grace(self) -> float:
        return self.procs.max_grace

    @max_grace.setter
    def max_grace(self, seconds: float) -> None:
        self.procs.max_grace = seconds

    @property
    def oom_when(self) -> Callable[[PodDict, str], bool] | None:
        return self.procs.oom_when

    @oom_when.setter
    def oom_when(self, decide: Callable[[PodDict, str], bool] | None) -> None:
        self.procs.oom_when = decide

    @property
    def runs(self) -> list[Run]:
        return self.procs.runs

    @property
    def refused(self) -> list[tuple[str, str, str, str]]:
        return self.procs.refused

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> PodRunner:
        self.node.register()
        self._thread = threading.Thread(target=self._watch, name="pod-runner-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.api.close_watches()
        with self._lock:
            works = list(self._work.values())
        for w in works:
            w.deleted.set()
        for w in works:
            if w.thread:
                w.thread.join(self.max_grace + 5)
        for w in works:  # anything left: kill hard
            for p in w.procs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        if self._thread:
            # a watch blocked on its stream ends at the next event or the server's timeoutSeconds;
            # it is a daemon thread and yields nothing once `_stop` is set, so do not wait long
            self._thread.join(0.5)
        if self._own_workdir and not os.environ.get("CONVGATE_KEEP_CLUSTER"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test hooks --------------------------------------------------------------------------
    def oom_kill(self, namespace: str, name: str) -> None:
        with self._lock:
            for w in self._work.values():
                if w.namespace == namespace and w.name == name:
                    w.oom.set()
                    return
        raise KeyError(f"pod {namespace}/{name} is not running here")

    def log(self, namespace: str, pod: str, container: str | None = None) -> str:
        d = self.workdir / f"{namespace}_{pod}"
        files = [d / f"{container}.log"] if container else sorted(d.glob("*.log"))
        return "".join(f.read_text(errors="replace") for f in files if f.exists())

    def runs_of(self, namespace: str, prefix: str = "") -> list[Run]:
        return [r for r in self.runs if r.namespace == namespace and r.pod.startswith(prefix)]

    # --- watching ----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                for typ, obj in self.api.list_watch("/api/v1/pods", self._stop):
                    if typ == "SYNC":
                        for pod in obj["items"]:
                            self._on_pod("ADDED", pod)
                    else:
                        self._on_pod(typ, obj)
            except Exception as exc:
                if self._stop.is_set():
                    return
                self.errors.append(f"watch: {exc}")
                time.sleep(0.5)

    def _on_pod(self, typ: str, pod: PodDict) -> None:
        md, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
        uid = md["uid"]
        if typ == "DELETED":
            with self._lock:
                w = self._work.get(uid)
            if w:
                w.deleted.set()
            return
        node = spec.get("nodeName")
        if not node:
            if md.get("deletionTimestamp") is None:
                self.node.maybe_bind(pod)
            return
        if node != self.node_name:
            return
        with self._lock:
            w = self._work.get(uid)
            if md.get("deletionTimestamp"):
                if w:
                    w.grace = float(md.get("deletionGracePeriodSeconds") or 0)
                    w.deleted.set()
                elif status.get("phase") not in ("Succeeded", "Failed"):
                    # bound but never started by us (e.g. a runner restart): finish the deletion
                    threading.Thread(target=self._force_delete, args=(pod,), daemon=True).start()
                return
            if w is not None or status.get("phase") in ("Succeeded", "Failed"):
                return
            w = PodWork(uid, md["namespace"], md["name"])
            w.thread = threading.Thread(target=self._run_pod, args=(pod, w), name=f"pod-{md['name']}", daemon=True)
            self._work[uid] = w
        w.thread.start()

    # --- running -----------------------------------------------------------------------------
    def _force_delete(self, pod: PodDict) -> None:
        md = pod["metadata"]
        with contextlib.suppress(ApiError):
            self.api.request("DELETE", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}",
                             body={"gracePeriodSeconds": 0, "preconditions": {"uid": md["uid"]}})

    def _wait_config(self, pod: PodDict, w: PodWork, containers: list[dict[str, Any]]
                     ) -> dict[str, dict[str, str]] | None:
        """Resolve every container's env; while the kubelet would refuse, report Waiting and retry."""
        ns, name = w.namespace, w.name
        reported = None
        while not w.deleted.is_set() and not self._stop.is_set():
            try:
                self.env.check_volumes(pod)
                envs = {}
                for c in containers:
                    if not c.get("command"):
                        raise ConfigError("CreateContainerError",
                                          f"pod runner: container {c['name']} has no command (image entrypoints are "
                                          "unknown without a container runtime)")
                    envs[c["name"]] = self.env.resolve_env(pod, c)
                return envs
            except ConfigError as err:
                if reported != err.message:
                    reported = err.message
                    self.refused.append((ns, name, err.reason, err.message))

                    def waiting(st: dict[str, Any], err: ConfigError = err) -> None:
                        st["phase"] = "Pending"
                        st.setdefault("startTime", now())
                        st["hostIP"] = "127.0.0.1"
                        merge_condition(st, "Initialized", "True")
                        merge_condition(st, "Ready", "False", "ContainersNotReady",
                                              "containers with unready status")
                        merge_condition(st, "ContainersReady", "False", "ContainersNotReady")
                        st["containerStatuses"] = [
                            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                             "restartCount": 0, "started": False,
                             "state": {"waiting": {"reason": err.reason, "message": err.message}}}
                            for c in pod["spec"]["containers"]
                        ]

                    set_status(self.api, ns, name, waiting)
                w.deleted.wait(1.0)
        return None

    def _run_pod(self, pod: PodDict, w: PodWork) -> None:
        try:
            self._run_pod_inner(pod, w)
        except Exception as exc:
            self.errors.append(f"pod {w.namespace}/{w.name}: {exc!r}")
        finally:
            if w.deleted.is_set() and not self._stop.is_set():
                self._force_delete(pod)
            with self._lock:
                self._work.pop(w.uid, None)

    @staticmethod
    def _cstatus(c: dict[str, Any], state: dict[str, Any], restarts: int, ready: bool) -> dict[str, Any]:
        return {"name": c["name"], "image": c.get("image", ""), "imageID": "", "containerID": "local://",
                "ready": ready, "started": "running" in state, "restartCount": restarts, "state": state}

    @staticmethod
    def _terminated(c: dict[str, Any], term: dict[str, Any], ready: bool) -> dict[str, Any]:
        state = {"terminated": {k: v for k, v in term.items() if k != "restartCount"}}
        return PodRunner._cstatus(c, state, term["restartCount"], ready)

    def _run_pod_inner(self, pod: PodDict, w: PodWork) -> None:
        spec = pod["spec"]
        w.grace = float(spec.get("terminationGracePeriodSeconds", 30))
        init, containers = spec.get("initContainers") or [], spec["containers"]
        envs = self._wait_config(pod, w, init + containers)
        if envs is None:
            return
        poddir = self.workdir / f"{w.namespace}_{w.name}"
        poddir.mkdir(parents=True, exist_ok=True)
        start_time = now()

        def base(st: dict[str, Any]) -> None:
            st.setdefault("startTime", start_time)
            st["hostIP"], st["hostIPs"] = "127.0.0.1", [{"ip": "127.0.0.1"}]
            st["podIP"], st["podIPs"] = "127.0.0.1", [{"ip": "127.0.0.1"}]
            st["qosClass"] = st.get("qosClass", "BestEffort")

        init_statuses = self._run_init(pod, w, envs, poddir, base)
        if init_statuses[-1:] and (init_statuses[-1]["state"]["terminated"]["exitCode"] != 0 or w.deleted.is_set()):
            self._finish(w.namespace, w.name, pod, init_statuses, [
                self._cstatus(c, {"waiting": {"reason": "PodInitializing"}}, 0, False) for c in containers], base)
            return
        finals = self._run_main(pod, w, envs, poddir, base, init_statuses)
        self._finish(w.namespace, w.name, pod, init_statuses, finals, base)

    def _run_init(self, pod: PodDict, w: PodWork, envs: dict[str, dict[str, str]], poddir: Path,
                  base: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
        """Init containers in order, until one fails (its status is the last one returned)."""
        statuses: list[dict[str, Any]] = []
        for c in pod["spec"].get("initContainers") or []:
            def started(at: str, restarts: int, c: dict[str, Any] = c) -> None:
                def mut(st: dict[str, Any]) -> None:
                    base(st)
                    st["phase"] = "Pending"
                    merge_condition(st, "Initialized", "False", "ContainersNotInitialized")
                    st["initContainerStatuses"] = [
                        *statuses, self._cstatus(c, {"running": {"startedAt": at}}, restarts, False)]
                set_status(self.api, w.namespace, w.name, mut)

            term = self.procs.run_container(pod, w, c, envs[c["name"]], poddir, started)
            statuses.append(self._terminated(c, term, term["exitCode"] == 0))
            if term["exitCode"] != 0 or w.deleted.is_set():
                break
        return statuses

    def _run_main(self, pod: PodDict, w: PodWork, envs: dict[str, dict[str, str]], poddir: Path,
                  base: Callable[[dict[str, Any]], None], init_statuses: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
        """The containers, concurrently; Running once all have started; their final statuses."""
        containers = pod["spec"]["containers"]
        statuses: dict[str, dict[str, Any]] = {}
        finals: dict[str, dict[str, Any]] = {}
        lock = threading.Lock()

        def started(c: dict[str, Any], at: str, restarts: int) -> None:
            with lock:
                statuses[c["name"]] = self._cstatus(c, {"running": {"startedAt": at}}, restarts, True)
                if len(statuses) < len(containers):
                    return
                snapshot = [statuses[cc["name"]] for cc in containers]

            def mut(st: dict[str, Any]) -> None:
                base(st)
                st["phase"] = "Running"
                for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"):
                    merge_condition(st, t, "True")
                if init_statuses:
                    st["initContainerStatuses"] = init_statuses
                st["containerStatuses"] = snapshot
            set_status(self.api, w.namespace, w.name, mut)

        def run(c: dict[str, Any]) -> None:
            try:
                term = self.procs.run_container(pod, w, c, envs[c["name"]], poddir,
                                           lambda at, r, c=c: started(c, at, r))
            except Exception as exc:  # keep the pod's bookkeeping going; report as a start error
                self.errors.append(f"pod {w.namespace}/{w.name} container {c['name']}: {exc!r}")
                term = {"exitCode": 128, "reason": "StartError", "message": repr(exc), "startedAt": now(),
                        "finishedAt": now(), "restartCount": 0}
            finals[c["name"]] = self._terminated(c, term, False)

        threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in containers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [finals[c["name"]] for c in containers]

    def _finish(self, ns: str, name: str, pod: PodDict, init_statuses: list[dict[str, Any]],
                statuses: list[dict[str, Any]], base: Callable[[dict[str, Any]], None]) -> None:
        codes = [s["state"].get("terminated", {}).get("exitCode", 1) for s in init_statuses + statuses]
        phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"

        def mut(st: dict[str, Any]) -> None:
            base(st)
            st["phase"] = phase
            for t in ("PodReadyToStartContainers", "ContainersReady", "Ready"):
                merge_condition(st, t, "False", "PodCompleted" if phase == "Succeeded" else "PodFailed")
            if init_statuses:
                st["initContainerStatuses"] = init_statuses
            st["containerStatuses"] = statuses

        set_status(self.api, ns, name, mut)
