"""Guards on what a request costs (issue 12, item 6): the round trips and threadpool crossings of a
submission, and a connection pool that keeps its connections under the API's own concurrency. Each
was a measured share of submit latency (scripts/bench_api.py under py-spy); these keep it from creeping back."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from service.api.app import create_app
from service.auth import Role
from service.persistence import db
from tests.service.conftest import add_token, settings_for

BODY = {"source_uri": "hf://org/src@" + "0" * 40, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf",
        "artifact_sha256": "e" * 64}


@pytest.fixture
def client(pg, tmp_path):
    app = create_app(settings_for(pg, tmp_path, file_roots=(Path("/models"),)), run_dispatcher=False)
    token = add_token(pg, Role.ADMIN, "latency")
    with TestClient(app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def _statements(client: TestClient) -> list[str]:
    seen: list[str] = []
    event.listen(client.app.state.engine, "before_cursor_execute",
                 lambda _c, _cur, statement, *_rest: seen.append(statement.split()[0].upper()))
    return seen


def test_a_new_submission_is_one_insert_per_row_and_no_update(client):
    client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "warm"})
    seen = _statements(client)
    response = client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "new"})
    assert response.status_code == 202 and response.json()["policy_origin"] == "configured:default"
    assert seen == ["SELECT", "INSERT", "INSERT"]  # the token; the verification (or nothing); its event


def test_a_repeated_key_writes_nothing_and_answers_with_the_stored_row(client):
    first = client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "k"})
    again = client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "k"})
    other = client.post("/v1/verifications", json=BODY | {"artifact_sha256": "f" * 64},
                        headers={"Idempotency-Key": "k"})
    assert (first.status_code, again.status_code, other.status_code) == (202, 200, 409)
    assert again.json() == first.json()
    with client.app.state.engine.connect() as connection:
        rows = connection.execute(text("SELECT (SELECT count(*) FROM verifications), "
                                       "(SELECT count(*) FROM verification_events)")).one()
    assert tuple(rows) == (1, 1)


@pytest.mark.parametrize("call", [
    lambda c: c.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "counted"}),
    lambda c: c.get("/v1/verifications", params={"artifact_sha256": BODY["artifact_sha256"]}),
], ids=["submit", "auditor-query"])
def test_a_request_crosses_to_the_threadpool_at_most_twice(client, monkeypatch, call):
    """Every sync dependency, sync endpoint, its response validation and a teardown that commits is one
    wake-up of a pool thread; on a loaded CPU each crossing queues behind the GIL. The token lookup and
    the endpoint's own database work need one each; nothing else should."""
    client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "warm"})
    crossings: list[str] = []
    original = anyio.to_thread.run_sync

    async def counting(func, *args, **kwargs):
        crossings.append(getattr(func, "__qualname__", repr(func)))
        return await original(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    response = call(client)
    assert response.status_code in (200, 202) and response.json()
    assert len(crossings) <= 2, crossings


def test_the_pool_keeps_its_connections_under_the_apis_own_concurrency(pg):
    """Connections the pool cannot keep are closed on return and opened again by the next request:
    a Postgres backend fork and a SCRAM handshake each time. Up to API_THREADS requests at once,
    none is closed."""
    threads = db.API_THREADS
    engine = db.make_engine(pg)
    counts = Counter[str]()
    event.listen(engine, "connect", lambda *_: counts.update(["connect"]))
    event.listen(engine.pool, "close", lambda *_: counts.update(["close"]))
    barrier = threading.Barrier(threads)

    def hold_one() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            barrier.wait(timeout=30)

    for _ in range(2):
        holders = [threading.Thread(target=hold_one) for _ in range(threads)]
        for holder in holders:
            holder.start()
        for holder in holders:
            holder.join()
    kept = dict(counts)
    engine.dispose()
    assert kept == {"connect": threads}, kept
