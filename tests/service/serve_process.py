"""`convgate serve` as a real process, for the tests that need what only a process has: the server's own
uvicorn configuration (its protocol deadlines, its graceful shutdown), real signals, and an interpreter of
its own (a client in the test's process would otherwise share the server's GIL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.service.conftest import free_port

CONVGATE = str(Path(sys.executable).parent / "convgate")


@dataclass
class ServeProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float) -> float:
        """SIGTERM, then the seconds until the process exited (AssertionError if it took over `timeout`)."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout} s after SIGTERM") from None
        return time.monotonic() - started

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve_process(database_url: str, tmp_path: Path, *arguments: str, **settings: str) -> Iterator[ServeProcess]:
    """`convgate serve` on `database_url` (migrated already), API-only, with more command-line `arguments` and
    `CONVGATE_<NAME>` settings; killed at the end if a test left it running."""
    env = dict(os.environ, CONVGATE_DATABASE_URL=database_url, CONVGATE_DISPATCHER="none",
               CONVGATE_CACHE_DIR=str(tmp_path / "cache"),
               **{f"CONVGATE_{name.upper()}": value for name, value in settings.items()})
    port = free_port()
    handle, name = tempfile.mkstemp(prefix="convgate-serve-", suffix=".log", dir=tmp_path)
    log = Path(name)
    with os.fdopen(handle, "wb") as sink:
        process = subprocess.Popen([CONVGATE, "serve", "--port", str(port), "--no-migrate", *arguments], env=env,
                                   stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    served = ServeProcess(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"convgate serve exited: {served.output()[-3000:]}"
            try:
                if httpx.get(f"{served.url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"convgate serve was not ready in 60 s: {served.output()[-3000:]}"
            time.sleep(0.1)
        yield served
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # its worker processes too
            process.wait(timeout=30)
