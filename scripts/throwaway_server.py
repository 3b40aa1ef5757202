"""What the service benchmarks share: a throwaway Postgres database with `convgate serve` (one uvicorn
process, API-only: CONVGATE_DISPATCHER=none) on it and a token, torn down whatever happens; on a
failure the server's last log lines go to stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import psycopg

ADMIN = os.environ.get("CONVGATE_TEST_PG", "postgresql://convgate_test:convgate-test-only@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class Served:
    dsn: str  # psycopg's form, for seeding
    url: str
    token: str
    pid: int

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def served(role: str, *serve_args: str) -> Iterator[Served]:
    """A fresh database migrated to head, the server on it (`convgate serve` with `serve_args` too) and a token
    of `role`; all gone afterwards."""
    name = f"convgate_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = ADMIN.rsplit("/", 1)[0] + f"/{name}"
    env = dict(os.environ, CONVGATE_DATABASE_URL=dsn.replace("postgresql://", "postgresql+psycopg://"),
               CONVGATE_DISPATCHER="none")
    server = None
    with tempfile.TemporaryFile() as log:
        try:
            convgate = os.path.join(os.path.dirname(sys.executable), "convgate")
            subprocess.check_call([convgate, "db", "upgrade"], env=env, stdout=log, stderr=subprocess.STDOUT)
            token = subprocess.check_output([convgate, "tokens", "create", f"bench-{role}", "--role", role],
                                            env=env, text=True).strip()
            port = free_port()
            server = subprocess.Popen([convgate, "serve", "--port", str(port), "--no-migrate", *serve_args], env=env,
                                      stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            wait_ready(url)
            yield Served(dsn, url, token, server.pid)
        except BaseException:
            log.seek(0)
            print("the server's log, last lines:\n" + log.read().decode(errors="replace")[-6000:], file=sys.stderr)
            raise
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
            drop_database(name)


def wait_ready(url: str, path: str = "/readyz") -> None:
    """Poll `path` until it answers 200, for up to 30 s."""
    for _ in range(300):
        try:
            if httpx.get(f"{url}{path}").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready in 30 s")


def drop_database(name: str) -> None:
    """Retried: after a million inserts an autovacuum worker (not ours to end) may still be in it."""
    for attempt in range(30):
        try:
            with psycopg.connect(ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            if attempt == 29:
                raise
            time.sleep(1)
