"""No request holds a lock or a connection while it waits for a thread (issue 34, item 1).

The red team stalled `convgate serve` on SQLite with ~50 concurrent authenticated reads: a request's unit of
work began BEGIN IMMEDIATE at its first read and then waited, with the lock held, for a second pool thread
to validate its answer, while every pool thread waited for that lock (or, beyond SQLite's 15 pooled
connections, for a connection): 503s after the 30 s busy timeout, `/healthz` fast all along. Two checks:

- an audit of every route, as the loop audit (`test_event_loop.py`) is of the event loop: each is `async
  def` with async dependencies only (its database work one unit in one pool thread, or on the loop), or a
  sync function that answers a Response itself (no second thread to validate it), so none can hold what
  another thread waits for while it waits for a thread;
- the measurement: 200 concurrent authenticated requests mixed over every read and write route, with 64
  event streams open, against `convgate serve` on SQLite and on Postgres: no 503 (nor any 5xx) while the
  database is healthy, and the 99th percentile under P99_LIMIT_SECONDS on this 2-core, shared machine.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from sqlalchemy import event

from service.api.app import create_app, no_loops
from service.auth import Role, digest, new_secret
from service.persistence import repository, tokens
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.conftest import settings_for
from tests.service.serve_process import serve_process

CLIENTS = 200
STREAMS = 64
STREAMERS = 8  # submitters holding 8 streams each (MAX_STREAMS_PER_PRINCIPAL)
# The stall answered after 30 s (the busy and pool timeouts); measured p99 here was 2-4 s with the machine's
# load average above 4 (other engineers' model benchmarks): 10 s leaves room for the load, not for a stall.
P99_LIMIT_SECONDS = 10.0
SHA = "e" * 64
HF_SOURCE = "hf://org/src@" + "0" * 40


# --- the audit ------------------------------------------------------------------------------------------

def _calls(dependant: Dependant) -> list[Callable[..., Any]]:
    found = [dependant.call] if dependant.call is not None else []
    for sub in dependant.dependencies:
        found += _calls(sub)
    return found


def _is_async(call: Callable[..., Any]) -> bool:
    """A coroutine or async generator function (a dependency object's own `__call__` counts)."""
    target = call if inspect.isfunction(call) or inspect.ismethod(call) else type(call).__call__
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    """Every APIRoute, those of included routers too (FastAPI keeps an included router whole)."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif (included := getattr(route, "original_router", None)) is not None:
            found += _api_routes(included.routes)
    return found


def test_no_route_can_wait_for_a_thread_while_it_holds_a_transaction(sqlite_url, tmp_path):
    """A sync dependency runs in a pool thread of its own and keeps what it opened for the request; a sync
    endpoint whose answer is a model is validated in a second pool thread. Either waits for a thread while
    it may hold a transaction; no route may do either."""
    app = create_app(settings_for(sqlite_url, tmp_path, dispatcher="none"), loops=no_loops)
    routes = _api_routes(app.routes)
    assert len(routes) >= 25
    refused = []
    for route in routes:
        endpoint, *dependencies = _calls(route.dependant)
        if any(not _is_async(call) for call in dependencies):
            refused.append(f"{route.path}: a sync dependency")
        if not _is_async(endpoint) and route.response_field is not None:
            refused.append(f"{route.path}: a sync endpoint whose answer FastAPI validates in another thread")
    assert refused == []


def _statements(app: Any) -> list[str]:
    seen: list[str] = []
    for engine in (app.state.engine, app.state.async_engine.sync_engine):
        event.listen(engine, "before_cursor_execute",
                     lambda _c, _cur, statement, *_rest: seen.append(" ".join(statement.split()[:2]).upper()))
    return seen


def test_reads_begin_as_reads_and_the_write_lock_comes_only_with_the_write(sqlite_url, tmp_path):
    """On SQLite: a request that only reads never takes the write lock; one that reads and logs the read takes
    it for the access-log row alone, after its reads, and commits it at once."""
    from fastapi.testclient import TestClient

    world = seed(sqlite_url)
    app = create_app(settings_for(sqlite_url, tmp_path, dispatcher="none", metrics_public=False),
                     loops=no_loops)
    with TestClient(app) as client:
        operator, admin = ({"Authorization": f"Bearer {t}"} for t in (world.operator, world.admin))
        client.get("/v1/queue", headers=operator)  # the pools' connections made before counting
        seen = _statements(app)
        for path in ("/v1/queue", "/metrics", "/readyz", "/ui/queue/table"):
            assert client.get(path, headers=operator).status_code == 200
        assert [s for s in seen if s.startswith("BEGIN")] and "BEGIN IMMEDIATE" not in seen, seen
        seen.clear()
        assert client.get(f"/v1/verifications/{world.done}", headers=admin).status_code == 200
        immediate = seen.index("BEGIN IMMEDIATE")
        assert seen[immediate + 1:] == ["INSERT INTO"], seen  # the log row, the unit's last statement
        assert all(s.startswith(("SELECT", "BEGIN")) for s in seen[:immediate]), seen


# --- the measurement ----------------------------------------------------------------------------------

@dataclass
class World:
    """Tokens and rows the requests use (seeded in the database before the server starts)."""

    admin: str
    operator: str
    auditor: str
    submitter: str
    streamers: list[tuple[str, list[str]]]  # each streaming submitter's token and its queued verifications
    done: str  # a completed GO verification (report, attestation, signature)
    to_cancel: list[str]


def _token(session: Any, role: Role) -> str:
    secret = new_secret()
    tokens.add_token(session, f"{role.value}-{uuid.uuid4().hex[:8]}", role.value, digest(secret))
    return secret


def _queued(session: Any, submitter: str, key: str) -> str:
    verification = repository.insert_unless_known(
        session, submitted_by=submitter, idempotency_key=key, request_sha256="a" * 64,
        request={"source_uri": HF_SOURCE, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf",
                 "artifact_sha256": SHA}, policy={"version": "1"}, policy_sha256="b" * 64, max_attempts=3,
        policy_origin="configured:default")
    assert verification is not None
    return verification.id


def _report(verdict: str) -> dict[str, Any]:
    return {"verdict": verdict, "blockers": [], "policy": {"values": {"version": "1"}, "sha256": "b" * 64},
            "gates": {"storage": {"name": "storage", "status": "passed", "seconds": 1.0, "details": {}}},
            "artifact": {"uri": "hf://org/m@" + "0" * 40 + "/m.gguf", "sha256": SHA, "size": 1},
            "files": [{"uri": "hf://org/m@" + "0" * 40 + "/m.gguf", "sha256": SHA, "size": 1}],
            "not_verified": [], "environment": {"convgate": "0.1.0"}, "timings": {}}


def seed(url: str) -> World:
    engine = make_engine(url)
    try:
        with transaction(session_factory(engine)) as session:
            names = {}
            secrets = {}
            for role in (Role.ADMIN, Role.OPERATOR, Role.AUDITOR, Role.SUBMITTER):
                secrets[role] = _token(session, role)
            names = {secret: name for secret, name in
                     ((s, tokens.active_name_and_role(session, digest(s))[0]) for s in secrets.values())}
            submitter = names[secrets[Role.SUBMITTER]]
            streamers = []
            for index in range(STREAMERS):
                secret = _token(session, Role.SUBMITTER)
                owner = tokens.active_name_and_role(session, digest(secret))[0]
                streamers.append((secret, [_queued(session, owner, f"stream-{index}-{n}") for n in range(8)]))
            done = _queued(session, submitter, "done")
            attempt = repository.claim(session, done, "seed").attempt
            repository.start_attempt(session, done, "seed", attempt=attempt)
            assert repository.record_verdict(session, done, attempt, _report("GO"), worker="seed")
            to_cancel = [_queued(session, submitter, f"cancel-{n}") for n in range(CLIENTS // 20)]
        return World(secrets[Role.ADMIN], secrets[Role.OPERATOR], secrets[Role.AUDITOR], secrets[Role.SUBMITTER],
                     streamers, done, to_cancel)
    finally:
        engine.dispose()


def requests_for(world: World) -> list[tuple[str, str, str, dict[str, Any], set[int]]]:
    """(method, path, token, extra httpx arguments, the statuses that are right) over every route."""
    body = {"source_uri": HF_SOURCE, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf", "artifact_sha256": SHA}
    one, done = world.streamers[0][1][0], world.done
    routes: list[Callable[[int], tuple[str, str, str, dict[str, Any], set[int]]]] = [
        lambda n: ("POST", "/v1/verifications", world.submitter,
                   {"json": body, "headers": {"Idempotency-Key": f"burst-{n}"}}, {202}),
        lambda n: ("GET", f"/v1/verifications/{one}", world.admin, {}, {200}),
        lambda n: ("GET", f"/v1/verifications/{one}/events", world.admin, {}, {200}),
        lambda n: ("GET", f"/v1/verifications/{done}/report", world.admin, {}, {200}),
        lambda n: ("GET", f"/v1/verifications/{done}/report", world.admin, {"headers": {"Accept": "text/html"}},
                   {200}),
        lambda n: ("GET", f"/v1/verifications/{done}/attestation", world.auditor, {}, {200}),
        lambda n: ("GET", f"/v1/verifications/{done}/attestation?predicate=vsa", world.auditor, {}, {200}),
        lambda n: ("GET", f"/v1/verifications/{done}/signature", world.admin, {}, {200}),
        lambda n: ("GET", f"/v1/verifications/{one}/callbacks", world.admin, {}, {200}),
        lambda n: ("GET", f"/v1/verifications?artifact_sha256={SHA}", world.auditor, {}, {200}),
        lambda n: ("GET", "/v1/queue", world.operator, {}, {200}),
        lambda n: ("GET", "/v1/access-log?limit=20", world.auditor, {}, {200}),
        lambda n: ("GET", "/v1/verdicts/export?format=csv", world.auditor, {}, {200}),
        lambda n: ("POST", "/v1/callback-secret", world.submitter, {}, {201}),
        lambda n: ("POST", f"/v1/verifications/{world.to_cancel[n % len(world.to_cancel)]}/cancel", world.admin,
                   {}, {200}),
        lambda n: ("GET", "/ui/queue", world.operator, {}, {200}),
        lambda n: ("GET", "/ui/queue/table", world.operator, {}, {200}),
        lambda n: ("GET", f"/ui/auditor?artifact_sha256={SHA}", world.auditor, {}, {200}),
        lambda n: ("GET", "/ui/export?format=jsonl", world.auditor, {}, {200}),
        lambda n: ("GET", f"/ui/verifications/{done}/report", world.auditor, {}, {200}),
        lambda n: ("GET", f"/ui/verifications/{done}/attestation", world.auditor, {}, {200}),
        lambda n: ("POST", "/ui/login", "", {"data": {"token": world.operator, "next": "/ui/queue"},
                                             "follow_redirects": False}, {303, 429}),  # 10 at once per address
        lambda n: ("GET", "/metrics", world.operator, {}, {200}),
        lambda n: ("GET", "/readyz", "", {}, {200}),
    ]
    return [routes[n % len(routes)](n) for n in range(CLIENTS)]


async def _stream(client: httpx.AsyncClient, token: str, verification_id: str, opened: asyncio.Event,
                  first_frames: list[bytes]) -> None:
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    async with client.stream("GET", f"/v1/verifications/{verification_id}/events", headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for chunk in response.aiter_bytes():
            first_frames.append(chunk)
            opened.set()
            await asyncio.sleep(3600)  # held open until the test cancels it


async def _burst(url: str, world: World) -> tuple[list[tuple[str, int, float]], int]:
    limits = httpx.Limits(max_connections=CLIENTS + STREAMS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        first_frames: list[bytes] = []
        opened = [asyncio.Event() for _ in range(STREAMS)]
        streams = [asyncio.create_task(_stream(client, token, ids[n], opened[index * 8 + n], first_frames))
                   for index, (token, ids) in enumerate(world.streamers) for n in range(8)]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), timeout=120)

        async def call(method: str, path: str, token: str, extra: dict[str, Any]) -> tuple[int, float]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            headers |= extra.pop("headers", {})
            started = time.perf_counter()
            response = await client.request(method, path, headers=headers, **extra)
            return response.status_code, time.perf_counter() - started

        planned = requests_for(world)
        results = await asyncio.gather(*(call(method, path, token, dict(extra))
                                         for method, path, token, extra, _ in planned))
        still_open = sum(not stream.done() for stream in streams)
        for stream in streams:
            stream.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    timed = [(f"{method} {path.split('?')[0]}", status, seconds)
             for (method, path, *_), (status, seconds) in zip(planned, results, strict=True)]
    wrong = [(route, status) for (route, status, _), (*_, right) in zip(timed, planned, strict=True)
             if status not in right]
    assert wrong == [], Counter(wrong)
    return timed, still_open


@pytest.fixture(params=["sqlite", "postgres"])
def database(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


def test_200_concurrent_clients_and_64_streams_are_served_without_a_503(database, tmp_path):
    world = seed(database)
    with serve_process(database, tmp_path, metrics_public="false") as server:
        # the signing keys are made on first use: once, before the burst (their creation is not under test)
        for path in (f"/v1/verifications/{world.done}/attestation", f"/v1/verifications/{world.done}/signature"):
            assert httpx.get(server.url + path, headers={"Authorization": f"Bearer {world.admin}"},
                             timeout=60).status_code == 200
        started = time.perf_counter()
        timed, still_open = asyncio.run(_burst(server.url, world))
        wall = time.perf_counter() - started
    seconds = sorted(duration for _, _, duration in timed)
    p50, p99 = seconds[len(seconds) // 2], seconds[int(len(seconds) * 0.99) - 1]
    statuses = Counter(status for _, status, _ in timed)
    print(f"\n{database.split(':')[0]}: {len(timed)} requests with {STREAMS} streams open in {wall:.1f} s; "
          f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {seconds[-1]:.2f} s; {dict(statuses)}")
    assert not any(status >= 500 for status in statuses), statuses
    assert still_open == STREAMS  # none was cut while the burst ran
    assert p99 < P99_LIMIT_SECONDS, f"p99 {p99:.2f} s"
