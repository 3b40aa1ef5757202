"""The embedded dispatcher: a bounded pool of local worker processes running the same entrypoint a
Kubernetes Job runs, `convgate worker run --verification-id ID --attempt N`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from engine.errors import ConvgateError
from engine.resources import THREADS_SETTING, cpu_budget
from service.config import Settings
from service.dispatch.base import WorkerExit
from service.persistence.attempt_contract import ATTEMPT_SECRET_ENV

WORKER_ENV_KEYS = ("database_url", "cache_dir", "allow_file_uris", "allowed_hosts", "allow_private_addresses",
                   "trusted_hosts", "hf_endpoint", "lease_seconds", "max_attempts", "file_roots", "fetch_attempts",
                   "fetch_backoff_seconds", "fetch_max_backoff_seconds")


def worker_environment(settings: Settings) -> dict[str, str]:
    """The settings a worker needs, passed the way pydantic-settings reads them (JSON for structures)."""
    env = dict(os.environ)
    env.pop(ATTEMPT_SECRET_ENV, None)  # a local worker always takes the direct path
    dumped = settings.model_dump(mode="json")
    for key in WORKER_ENV_KEYS:
        value = dumped[key]
        if value is None:
            env.pop(f"CONVGATE_{key.upper()}", None)
            continue
        env[f"CONVGATE_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    if not env.get(THREADS_SETTING):
        # `concurrency` workers share this machine's CPUs: each sized to the whole would oversubscribe them.
        env[THREADS_SETTING] = str(max(1, cpu_budget() // settings.concurrency))
    return env


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalPool:
    name = "local"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.host = socket.gethostname()
        self.identity = f"local:{self.host}:{os.getpid()}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.attempts: dict[str, int] = {}

    def capacity(self) -> int:
        return max(self.settings.concurrency - len(self.processes), 0)

    def launch(self, verification_id: str, attempt: int, attempt_secret: str | None = None,
               shards: int = 1) -> None:
        """The secret is not handed on: a local worker runs on the operator's machine, with the
        operator's files and the service's own database URL (the direct path, `DirectChannel`). A local
        worker runs gate 1 on every CPU already; a sharded verification needs an Indexed Job."""
        if shards != 1:
            raise ConvgateError(f"verification {verification_id} is split into {shards} shards: the local pool "
                                "runs one worker per verification (use the kubernetes dispatcher)")
        self.attempts[verification_id] = attempt
        command = [sys.executable, "-m", "service.cli", "worker", "run", "--verification-id", verification_id,
                   "--attempt", str(attempt), "--worker-name", f"{self.identity}/{verification_id[:8]}"]
        self.processes[verification_id] = subprocess.Popen(
            command, env=worker_environment(self.settings), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def reap(self) -> list[WorkerExit]:
        exits = []
        for verification_id, process in list(self.processes.items()):
            code = process.poll()
            if code is None:
                continue
            del self.processes[verification_id]
            reason = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            exits.append(WorkerExit(verification_id, self.attempts.pop(verification_id, 0), reason, clean=code == 0))
        return exits

    def active(self) -> set[str]:
        return set(self.processes)

    def cancel(self, verification_id: str) -> None:
        process = self.processes.get(verification_id)
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)

    def owns_dead(self, worker: str | None) -> bool:
        """Workers are named `local:<host>:<pool pid>/<id>`; a pool pid that no longer runs is dead."""
        if not worker or not worker.startswith(f"local:{self.host}:"):
            return False
        pool_pid = int(worker.split(":", 2)[2].split("/", 1)[0])
        return pool_pid != os.getpid() and not _pid_alive(pool_pid)

    def sync(self, session) -> None:
        """Local processes have no cluster-side state."""

    def shutdown(self) -> None:
        for verification_id in list(self.processes):
            self.cancel(verification_id)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        self.processes.clear()
