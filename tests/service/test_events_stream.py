"""GET /v1/verifications/{id}/events as server-sent events (Accept: text/event-stream), on a live server
over SQLite and Postgres: the events in order, each with its id, the stream ending after the terminal
state, resumed after Last-Event-ID; without that Accept header the same path still answers JSON."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from service.auth import Role, digest
from service.persistence import repository, tokens
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.conftest import LiveServer, add_token, settings_for, start_server

SHA = "9" * 64
STREAM = {"Accept": "text/event-stream"}


@pytest.fixture(params=["sqlite", "postgres"])
def live(request, tmp_path) -> Iterator[tuple[LiveServer, httpx.Client, dict[str, str]]]:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")
    settings = settings_for(url, tmp_path, file_roots=(tmp_path,))
    suffix = uuid.uuid4().hex[:6]
    who = {name: add_token(url, Role.SUBMITTER, f"{name}-{suffix}") for name in ("one", "two")}
    with contextlib.contextmanager(start_server)(settings) as server, \
            httpx.Client(base_url=server.url, timeout=15, trust_env=False) as client:
        yield server, client, who


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submitted(client: httpx.Client, token: str, tmp_path) -> str:
    body = {"source_uri": (tmp_path / "m").as_uri(), "artifact_uri": (tmp_path / "m.gguf").as_uri(),
            "artifact_sha256": SHA}
    response = client.post("/v1/verifications", json=body, headers=auth(token))
    assert response.status_code == 202, response.text
    return response.json()["id"]


def parse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Server-sent events as dicts of their fields (comment lines, starting with ':', are skipped)."""
    event: dict[str, Any] = {}
    for line in lines:
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            event[field] = value.removeprefix(" ")


def run_to_verdict(server: LiveServer, verification_id: str) -> None:
    engine = make_engine(server.settings.database_url)
    try:
        with transaction(session_factory(engine)) as session:
            attempt = repository.claim(session, verification_id, "test").attempt
        with transaction(session_factory(engine)) as session:
            assert repository.start_attempt(session, verification_id, "test", attempt=attempt) is not None
        report = {"verdict": "GO", "blockers": [], "gates": {}, "policy": {}, "artifact": None, "files": [],
                  "not_verified": [], "environment": {}, "timings": {}}
        with transaction(session_factory(engine)) as session:
            assert repository.record_verdict(session, verification_id, attempt, report, worker="test")
    finally:
        engine.dispose()


def _statements_on(engine: Any) -> list[str]:
    """Every statement `engine` runs from now on (the streams' polls among them)."""
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: seen.append(statement))
    return seen


def test_the_stream_yields_the_events_in_order_and_ends_at_the_terminal_state(live, tmp_path):
    server, client, who = live
    verification_id = submitted(client, who["one"], tmp_path)
    started = time.monotonic()
    with client.stream("GET", f"/v1/verifications/{verification_id}/events", headers=auth(who["one"]) | STREAM) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        events = parse(r.iter_lines())
        first = next(events)  # the stream is live before the verification moves on
        run_to_verdict(server, verification_id)
        rest = list(events)  # ends by itself once the terminal event was sent
    assert time.monotonic() - started < 10
    seen = [first, *rest]
    data = [json.loads(event["data"]) for event in seen]
    assert [d["to_state"] for d in data] == ["queued", "dispatched", "running", "completed"]
    assert [event["event"] for event in seen] == ["queued", "dispatched", "running", "completed"]
    ids = [int(event["id"]) for event in seen]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert data[-1]["message"].startswith("verdict GO")
    plain = client.get(f"/v1/verifications/{verification_id}/events", headers=auth(who["one"]))
    assert [e["to_state"] for e in plain.json()] == [d["to_state"] for d in data]  # JSON as before


def test_the_stream_resumes_after_last_event_id(live, tmp_path):
    server, client, who = live
    verification_id = submitted(client, who["one"], tmp_path)
    run_to_verdict(server, verification_id)
    path = f"/v1/verifications/{verification_id}/events"
    with client.stream("GET", path, headers=auth(who["one"]) | STREAM) as r:
        everything = list(parse(r.iter_lines()))
    second = everything[1]["id"]
    with client.stream("GET", path, headers=auth(who["one"]) | STREAM | {"Last-Event-ID": second}) as r:
        resumed = list(parse(r.iter_lines()))
    assert [e["id"] for e in resumed] == [e["id"] for e in everything[2:]]
    with client.stream("GET", path, headers=auth(who["one"]) | STREAM | {"Last-Event-ID": everything[-1]["id"]}) as r:
        assert list(parse(r.iter_lines())) == []  # nothing after the terminal event: it ends at once
    bad = client.get(path, headers=auth(who["one"]) | STREAM | {"Last-Event-ID": "x"})
    assert bad.status_code == 422


def test_another_submitters_stream_is_not_found(live, tmp_path):
    _, client, who = live
    verification_id = submitted(client, who["one"], tmp_path)
    response = client.get(f"/v1/verifications/{verification_id}/events", headers=auth(who["two"]) | STREAM)
    assert response.status_code == 404


def _open_stream(server: LiveServer, token: str, verification_id: str, opened: list[httpx.Response],
                 stop: threading.Event) -> None:
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client, \
            client.stream("GET", f"/v1/verifications/{verification_id}/events",
                          headers=auth(token) | STREAM) as response:
        opened.append(response)
        if response.status_code == 200:
            stop.wait(30)


@pytest.fixture
def sqlite_live(sqlite_url, tmp_path) -> Iterator[tuple[LiveServer, httpx.Client, dict[str, str]]]:
    settings = settings_for(sqlite_url, tmp_path, file_roots=(tmp_path,), dispatcher="none", max_streams=12,
                            max_streams_per_principal=5)
    who = {name: add_token(sqlite_url, Role.SUBMITTER, f"{name}-{uuid.uuid4().hex[:6]}") for name in
           ("one", "two", "three")}
    with contextlib.contextmanager(start_server)(settings) as server, \
            httpx.Client(base_url=server.url, timeout=15, trust_env=False) as client:
        yield server, client, who


def test_fifty_streams_open_and_hold_no_connection(sqlite_url, tmp_path):
    """Before: of 50 held-open streams on one verification only 7 opened and the rest hung until they
    failed: each request's token lookup took SQLite's write lock (BEGIN IMMEDIATE) and held it while
    waiting for a pool thread for its endpoint, and every pool thread was waiting for that lock."""
    settings = settings_for(sqlite_url, tmp_path, file_roots=(tmp_path,), dispatcher="none", max_streams=64,
                            max_streams_per_principal=64)
    token = add_token(sqlite_url, Role.SUBMITTER, "watcher")
    stop = threading.Event()
    opened: list[httpx.Response] = []
    with contextlib.contextmanager(start_server)(settings) as server, \
            httpx.Client(base_url=server.url, timeout=15, trust_env=False) as client:
        verification_id = submitted(client, token, tmp_path)
        threads = [threading.Thread(target=_open_stream, args=(server, token, verification_id, opened, stop))
                   for _ in range(50)]
        try:
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 20
            while len(opened) < len(threads) and time.monotonic() < deadline:
                time.sleep(0.05)
            started = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            assert time.perf_counter() - started < 1.0
            held = []
            for _ in range(20):  # fifty streams polling every 0.1 s: a few polls are in flight at any moment
                held.append(server.app.state.engine.pool.checkedout())
                time.sleep(0.05)
            assert min(held) <= 2, held  # between polls none is held (before: all 15 of the pool's, for good)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
    assert [response.status_code for response in opened] == [200] * 50


def test_streams_are_capped_per_principal_and_in_total(sqlite_live, tmp_path):
    """Beyond the caps, 429 with Retry-After; a slot is given back when its stream ends."""
    server, client, who = sqlite_live
    stop = threading.Event()
    opened: dict[str, list[httpx.Response]] = {name: [] for name in who}
    ids = {name: submitted(client, token, tmp_path) for name, token in who.items()}
    threads = [threading.Thread(target=_open_stream, args=(server, who[name], ids[name], opened[name], stop))
               for name in who for _ in range(7)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while sum(map(len, opened.values())) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.perf_counter()
        assert client.get("/healthz").status_code == 200
        assert time.perf_counter() - started < 1.0
        polls = _statements_on(server.app.state.engine)
        seen = len(polls)
        deadline = time.monotonic() + 30
        while len(polls) < seen + 2 * 12 and time.monotonic() < deadline:  # each open stream polls twice more
            time.sleep(0.05)
        assert len(polls) >= seen + 2 * 12
        # between polls no stream holds a connection: 12 streams holding theirs would never let this reach 0
        pool = server.app.state.engine.pool
        released = False
        while not released and time.monotonic() < deadline:
            released = pool.checkedout() == 0
            time.sleep(0.001)
        assert released
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    codes = sorted(response.status_code for responses in opened.values() for response in responses)
    assert 500 not in codes and codes.count(200) == 12 and codes.count(429) == 21 - 12, codes
    assert all(sum(r.status_code == 200 for r in responses) <= 5 for responses in opened.values())
    assert all(int(r.headers["Retry-After"]) > 0 for rs in opened.values() for r in rs if r.status_code == 429)
    slots = server.app.state.stream_slots
    deadline = time.monotonic() + 5
    while slots.held() and time.monotonic() < deadline:  # the server notices each client leave
        time.sleep(0.05)
    assert slots.held() == 0  # every slot given back


def test_a_revoked_token_ends_its_streams(live, tmp_path):
    server, client, who = live
    verification_id = submitted(client, who["one"], tmp_path)
    with client.stream("GET", f"/v1/verifications/{verification_id}/events",
                       headers=auth(who["one"]) | STREAM) as response:
        lines = response.iter_lines()
        assert next(parse(lines))["event"] == "queued"
        engine = make_engine(server.settings.database_url)
        with transaction(session_factory(engine)) as session:
            name = tokens.active_name_and_role(session, digest(who["one"]))[0]
            assert tokens.revoke_token(session, name)
        engine.dispose()
        started = time.monotonic()
        assert list(parse(lines)) == []  # the stream ends: no event after the revocation
        assert time.monotonic() - started < 5


def test_a_stream_outlives_a_database_that_refuses_for_a_while(sqlite_live, tmp_path, monkeypatch):
    """Before: a poll that met a refusing database ended the stream mid-response (the soak run's
    Postgres refusal broke 6 open streams). Now the poll is retried after the poll interval, with a
    comment line, and the events follow. The refusal is injected: SQLite has no way to refuse a reader."""
    from sqlalchemy.exc import OperationalError

    from service.api import event_stream

    _server, client, who = sqlite_live
    verification_id = submitted(client, who["one"], tmp_path)
    real_read, failures = event_stream._read, []

    def flaky(*args: Any) -> Any:
        if len(failures) < 2:
            failures.append(1)
            raise OperationalError("SELECT", {}, Exception("the database system is shutting down"))
        return real_read(*args)

    monkeypatch.setattr(event_stream, "_read", flaky)
    with client.stream("GET", f"/v1/verifications/{verification_id}/events",
                       headers=auth(who["one"]) | STREAM) as response:
        assert response.status_code == 200
        first = next(parse(response.iter_lines()))
    assert first["event"] == "queued" and len(failures) == 2
