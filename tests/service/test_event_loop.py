"""The event loop never blocks (issue 22, item 1). A red team froze the server without a token: `POST
/ui/login` looked its token up on the event loop, so one SQLite write lock held elsewhere (the dispatch
loop, a writer in another process) stopped every request, `/healthz` included, for the busy timeout
of each login in turn. These tests run the real server (uvicorn in a thread), hold the database's write
lock from another connection and measure the loop's lag with a probe scheduled on the server's own loop.

The server shares its process with the test session, whose heap grows with every test before this one: a
full garbage collection of it stops every thread, the loop included, for most of a second late in the
suite. The live server therefore freezes that heap (`gc.freeze`) while it runs, so the probe measures the
server and not the suite's heap."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy.exc import OperationalError

from service.api.app import create_app, no_loops
from service.api.login_throttle import LoginThrottle
from service.auth import Role
from service.persistence import tokens
from tests.service.conftest import add_token, free_port, settings_for

# A loop that waits for the lock stalls for the lock's whole hold (seconds here); a loop that never waits
# still sees ~0.1 s between turns when twenty request threads share the GIL on a loaded 2-core machine.
LAG_LIMIT_SECONDS = 0.3


class LoopProbe:
    """Sleeps 10 ms at a time on the server's loop and keeps the worst overshoot."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.running = True

    async def run(self) -> None:
        while self.running:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.perf_counter() - before - 0.01)


class Server:
    """A live server whose event loop the test can reach."""

    def __init__(self, app: Any) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

        async def capture(scope: Any, receive: Any, send: Any) -> None:
            if self.loop is None:
                self.loop = asyncio.get_running_loop()
            await app(scope, receive, send)

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(capture, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        httpx.get(f"{self.url}/healthz")  # lets the wrapper capture the loop
        gc.collect()
        gc.freeze()
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.unfreeze()
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def probe(self) -> LoopProbe:
        probe = LoopProbe()
        assert self.loop is not None
        asyncio.run_coroutine_threadsafe(probe.run(), self.loop)
        return probe


@pytest.fixture
def server(sqlite_url, tmp_path) -> Iterator[Server]:
    settings = settings_for(sqlite_url, tmp_path, dispatcher="none")
    with Server(create_app(settings, loops=no_loops)) as live:
        live.database = sqlite_url.split("///", 1)[1]
        yield live


def hold_write_lock(path: str, seconds: float) -> threading.Thread:
    """Another writer (a dispatch tick, a migration, a second process) holding SQLite's write lock."""
    ready = threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("BEGIN IMMEDIATE")
        ready.set()
        time.sleep(seconds)
        connection.execute("ROLLBACK")
        connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    ready.wait(5)
    return thread


def login(url: str, token: str) -> httpx.Response:
    return httpx.post(f"{url}/ui/login", data={"token": token}, timeout=60)


def test_bogus_logins_against_a_locked_database_never_block_the_loop(server):
    """Before: each login waited for the lock on the event loop (lag = the lock's whole hold)."""
    probe = server.probe()
    holder = hold_write_lock(server.database, seconds=3.0)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: login(server.url, f"bogus-{i}").status_code, range(8)))
        started = time.perf_counter()
        health = httpx.get(f"{server.url}/healthz", timeout=60)
        health_seconds = time.perf_counter() - started
    holder.join()
    probe.running = False
    assert probe.worst < LAG_LIMIT_SECONDS, f"the event loop stalled {probe.worst:.2f}s"
    assert health.status_code == 200 and health_seconds < 1.0
    assert set(statuses) <= {401, 429, 503}, statuses


def test_logins_are_throttled_per_address(server):
    statuses = [login(server.url, f"bogus-{i}").status_code for i in range(LoginThrottle.BURST + 3)]
    assert statuses[:LoginThrottle.BURST] == [401] * LoginThrottle.BURST
    assert statuses[-1] == 429
    refused = login(server.url, "bogus-again")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1


def test_a_database_error_in_auth_is_a_503_with_retry_after(server, monkeypatch):
    """A fault the real database gives only under load (pool exhausted, lock timeout), injected here."""
    def fail(*_args: object) -> None:
        raise OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked"))

    monkeypatch.setattr(tokens, "active_name_and_role", fail)
    token = add_token(f"sqlite:///{server.database}", Role.ADMIN)
    api = httpx.get(f"{server.url}/v1/queue", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    form = login(server.url, token)
    for response in (api, form):
        assert response.status_code == 503, response.text
        assert int(response.headers["Retry-After"]) >= 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_refills_and_bounds_what_it_remembers():
    clock = Clock()
    throttle = LoginThrottle(clock=clock, max_keys=3)
    for _ in range(LoginThrottle.BURST):
        assert throttle.wait_seconds("a", "tok") == 0
    assert throttle.wait_seconds("a", "tok") > 0
    assert throttle.wait_seconds("b", "tok") > 0  # the same token prefix from another address
    assert throttle.wait_seconds("c", "other") == 0
    clock.now += LoginThrottle.REFILL_SECONDS
    assert throttle.wait_seconds("a", "tok2") == 0
    for key in ("d", "e", "f", "g"):
        throttle.wait_seconds(key, key)
    assert len(throttle) <= 3


ID = "00000000-0000-4000-8000-000000000000"
ROUTES = [  # every route that reads or writes the database, the async ones first
    ("POST", "/v1/verifications", {"source_uri": "hf://org/src@" + "0" * 40,
                                   "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf", "artifact_sha256": "e" * 64}),
    ("GET", "/v1/verifications", None), ("GET", f"/v1/verifications/{ID}/attestation", None),
    ("GET", "/v1/verdicts/export", None), ("GET", "/v1/queue", None), ("GET", f"/v1/verifications/{ID}", None),
    ("GET", f"/v1/verifications/{ID}/events", None), ("GET", f"/v1/verifications/{ID}/report", None),
    ("GET", f"/v1/verifications/{ID}/callbacks", None), ("POST", "/v1/callback-secret", None),
    ("POST", f"/v1/verifications/{ID}/cancel", None), ("GET", "/v1/access-log", None),
    ("GET", "/ui/queue", None), ("GET", "/ui/queue/table", None), ("GET", "/ui/auditor", None),
    ("GET", "/ui/export", None), ("GET", f"/ui/verifications/{ID}/report", None),
    ("GET", f"/ui/verifications/{ID}/attestation", None), ("GET", "/metrics", None), ("GET", "/readyz", None),
]


def test_no_route_blocks_the_loop_while_the_database_is_locked(server):
    """The audit of every `async def` route and dependency, as a measurement: each route runs while
    another writer holds the lock; only pool threads may wait for it."""
    token = add_token(f"sqlite:///{server.database}", Role.ADMIN)
    headers = {"Authorization": f"Bearer {token}"}
    probe = server.probe()
    holder = hold_write_lock(server.database, seconds=3.0)

    def call(route: tuple[str, str, Any]) -> int:
        method, path, body = route
        return httpx.request(method, f"{server.url}{path}", json=body, headers=headers, timeout=60).status_code

    with ThreadPoolExecutor(len(ROUTES)) as pool:
        statuses = dict(zip((path for _, path, _ in ROUTES), pool.map(call, ROUTES), strict=True))
    holder.join()
    probe.running = False
    assert probe.worst < LAG_LIMIT_SECONDS, f"the event loop stalled {probe.worst:.2f}s"
    assert all(code < 500 or code == 503 for code in statuses.values()), statuses


def test_a_write_waits_for_sqlites_lock_as_long_as_the_setting_says_then_answers_503(sqlite_url, tmp_path):
    """CONVGATE_SQLITE_BUSY_TIMEOUT_SECONDS is how long a request's write waits for another writer's lock."""
    settings = settings_for(sqlite_url, tmp_path, dispatcher="none", sqlite_busy_timeout_seconds=0.5)
    token = add_token(sqlite_url, Role.ADMIN)
    with Server(create_app(settings, loops=no_loops)) as live:
        holder = hold_write_lock(sqlite_url.split("///", 1)[1], seconds=8.0)
        method, path, body = ROUTES[0]  # a submission: it writes
        headers = {"Authorization": f"Bearer {token}"}
        started = time.monotonic()
        answer = httpx.request(method, f"{live.url}{path}", json=body, headers=headers, timeout=60)
        waited = time.monotonic() - started
        holder.join()
        again = httpx.request(method, f"{live.url}{path}", json=body, headers=headers, timeout=60)
    assert answer.status_code == 503 and waited < 5.0, (answer.status_code, waited)
    assert again.status_code == 202, again.text  # the lock released: the same write goes through
