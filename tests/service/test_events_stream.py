"""GET /v1/verifications/{id}/events as server-sent events (Accept: text/event-stream), on a live server
over SQLite and Postgres: the events in order, each with its id, the stream ending after the terminal
state, resumed after Last-Event-ID; without that Accept header the same path still answers JSON."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.auth import Role
from service.persistence import repository
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
