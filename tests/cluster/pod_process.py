"""The pod runner's process supervision: one container's command as a local process in its own
process group (emptyDir mounts localized, output in `<pod dir>/<container>.log`), run to its end
with `restartPolicy: OnFailure` restarts, SIGTERM then SIGKILL after the grace period when the pod
is deleted, and OOMKilled on request; the result is the container's `terminated` state."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .pod_env import ConfigError, PodDict, PodEnv, expand, now


@dataclass
class Run:
    namespace: str
    pod: str
    container: str
    argv: list[str]
    env: dict[str, str]
    started: float
    exit_code: int | None = None
    reason: str | None = None
    restarts: int = 0


@dataclass
class PodWork:
    uid: str
    namespace: str
    name: str
    thread: threading.Thread | None = None
    deleted: threading.Event = field(default_factory=threading.Event)
    oom: threading.Event = field(default_factory=threading.Event)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    grace: float = 30.0




class Supervisor:
    """Runs containers' processes for the pod runner; `runs` and `refused` are its record."""

    def __init__(self, base_env: dict[str, str], stop: threading.Event, max_grace: float) -> None:
        self.base_env = base_env
        self.stop = stop
        self.max_grace = max_grace
        self.oom_when: Callable[[PodDict, str], bool] | None = None
        self.oom_after = 0.3  # seconds a container runs before an oom_when kill
        self.runs: list[Run] = []
        self.refused: list[tuple[str, str, str, str]] = []  # (ns, pod, reason, message)

    def spawn(self, pod: PodDict, c: dict[str, Any], env: dict[str, str], poddir: Path) -> tuple[Run,
                                                                                             subprocess.Popen[bytes]]:
        mounts = PodEnv.mounts(pod, c, poddir)
        argv = [PodEnv.localize(expand(a, env), mounts)
                for a in (c.get("command") or []) + (c.get("args") or [])]
        local_env = {k: PodEnv.localize(v, mounts) for k, v in env.items()}
        penv = {**self.base_env, "HOSTNAME": pod["metadata"]["name"], "HOME": str(poddir), **local_env}
        cwd = c.get("workingDir")
        if not cwd or not Path(cwd).is_dir():
            cwd = str(poddir)
        log = (poddir / f"{c['name']}.log").open("ab")
        try:
            proc = subprocess.Popen(argv, env=penv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            log.write(f"pod runner: cannot start {argv!r}: {exc}\n".encode())
            log.close()
            raise ConfigError("RunContainerError", str(exc)) from exc
        log.close()
        run = Run(pod["metadata"]["namespace"], pod["metadata"]["name"], c["name"], argv, env, time.time())
        self.runs.append(run)
        return run, proc

    def terminate(self, w: PodWork, procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + min(w.grace, self.max_grace)
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)

    def run_container(self, pod: PodDict, w: PodWork, c: dict[str, Any], env: dict[str, str], poddir: Path,
                       on_start: Callable[[str, int], None]) -> dict[str, Any]:
        """Run one container to its end (restarting it for OnFailure); its final `terminated` state."""
        restart_policy = pod["spec"].get("restartPolicy", "Always")
        restarts = 0
        while True:
            try:
                run, proc = self.spawn(pod, c, env, poddir)
            except ConfigError as err:  # the command cannot be executed: what containerd reports
                self.refused.append((w.namespace, w.name, "StartError", err.message))
                return {"exitCode": 128, "reason": "StartError", "message": err.message, "startedAt": now(),
                        "finishedAt": now(), "restartCount": restarts}
            w.procs[c["name"]] = proc
            started = now()
            on_start(started, restarts)
            oom_at = None
            if self.oom_when is not None and self.oom_when(pod, c["name"]):
                oom_at = time.monotonic() + self.oom_after
            oom = False
            while proc.poll() is None:
                if w.deleted.is_set() or self.stop.is_set():
                    self.terminate(w, [proc])
                    break
                if w.oom.is_set() or (oom_at is not None and time.monotonic() >= oom_at):
                    oom = True
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.05)
            code = proc.returncode
            if code is not None and code < 0:
                code = 128 - code  # killed by signal N -> 128+N, as a container runtime reports
            reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
            if oom:
                code = 137
            run.exit_code, run.reason, run.restarts = code, reason, restarts
            term = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now(),
                    "containerID": f"local://{proc.pid}"}
            w.oom.clear()
            if (restart_policy == "OnFailure" and code != 0 and not w.deleted.is_set()
                    and not self.stop.is_set()):
                restarts += 1
                w.deleted.wait(min(10.0, 0.5 * 2 ** (restarts - 1)))  # crash-loop back-off, shortened
                if w.deleted.is_set():
                    return {**term, "restartCount": restarts}
                continue
            return {**term, "restartCount": restarts}
