"""Guards on what a request costs (issue 12, item 6): the round trips and threadpool crossings of a
submission, and a connection pool that keeps its connections under the API's own concurrency. Each
was a measured share of submit latency (scripts/bench_api.py under py-spy); these keep it from creeping back."""

from __future__ import annotations

import gc
import threading
from collections import Counter
from pathlib import Path

import anyio.to_thread
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from service.api.app import create_app, no_loops
from service.auth import Role
from service.persistence import db, repository
from tests.service.conftest import add_token, settings_for

BODY = {"source_uri": "hf://org/src@" + "0" * 40, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf",
        "artifact_sha256": "e" * 64}


@pytest.fixture
def client(pg, tmp_path):
    app = create_app(settings_for(pg, tmp_path, file_roots=(Path("/models"),), dispatcher="none"),
                     loops=no_loops)  # an API-only replica: no verdict reuse to look up
    token = add_token(pg, Role.ADMIN, "latency")
    with TestClient(app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def _statements(client: TestClient, monkeypatch) -> tuple[list[str], list[str]]:
    """Every statement the server sends from now on: through SQLAlchemy, and on psycopg itself (the
    submission's, `service.persistence.driver`, in autocommit: no BEGIN or COMMIT is sent there)."""
    through_sqlalchemy: list[str] = []
    on_driver: list[str] = []
    for engine in (client.app.state.engine, client.app.state.async_engine.sync_engine):
        event.listen(engine, "before_cursor_execute",
                     lambda _c, _cur, statement, *_rest: through_sqlalchemy.append(statement.split()[0].upper()))
    execute = psycopg.AsyncConnection.execute  # SQLAlchemy's own execution goes through a cursor's

    async def counted(self, query, *args, **kwargs):
        on_driver.append(str(query).split()[0].upper())
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted)
    return through_sqlalchemy, on_driver


def test_a_new_submission_is_one_statement_with_its_token_and_no_update(client, monkeypatch):
    client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "warm"})
    through_sqlalchemy, on_driver = _statements(client, monkeypatch)
    response = client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "new"})
    assert response.status_code == 202 and response.json()["policy_origin"] == "configured:default"
    assert on_driver == ["WITH"]  # the token, the verification (or nothing) and its event: one statement
    assert through_sqlalchemy == []


def test_the_auditor_query_is_one_statement_after_the_token(client, monkeypatch):
    """The page and its access-log row are one statement (a data-modifying WITH), on the driver."""
    client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "listed"})
    client.get("/v1/verifications", params={"artifact_sha256": BODY["artifact_sha256"]})
    through_sqlalchemy, on_driver = _statements(client, monkeypatch)
    response = client.get("/v1/verifications", params={"artifact_sha256": BODY["artifact_sha256"]})
    assert response.status_code == 200 and len(response.json()["items"]) == 1
    assert on_driver == ["SELECT", "WITH"]  # the token; the page and its access-log row
    assert through_sqlalchemy == []


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


def _crossings(monkeypatch) -> list[str]:
    crossings: list[str] = []
    original = anyio.to_thread.run_sync

    async def counting(func, *args, **kwargs):
        crossings.append(getattr(getattr(func, "func", func), "__qualname__", repr(func)))  # a partial's own
        return await original(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    return crossings


@pytest.mark.parametrize("call", [
    lambda c: c.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "counted"}),
    lambda c: c.get("/v1/verifications", params={"artifact_sha256": BODY["artifact_sha256"]}),
], ids=["submit", "auditor-query"])
def test_the_busiest_requests_never_cross_to_the_threadpool(client, monkeypatch, call):
    """Each wake-up of a pool thread is a GIL hand-off and a futex wake on both sides: with a pool thread
    for the token lookup and one for the write, they were half of a submission's server CPU
    (scripts/bench_api.py). The submission and the auditor's query run their ORM code on the loop."""
    client.post("/v1/verifications", json=BODY, headers={"Idempotency-Key": "warm"})
    crossings = _crossings(monkeypatch)
    response = call(client)
    assert response.status_code in (200, 202) and response.json()
    assert crossings == []


def test_a_submission_naming_a_host_resolves_it_in_a_pool_thread_never_on_the_loop(client, monkeypatch):
    """DNS may take as long as a resolver likes, and any caller with a token can name a host: that lookup
    (and only that) crosses to a pool thread, so the event loop never waits on it."""
    crossings = _crossings(monkeypatch)
    response = client.post("/v1/verifications", json=BODY | {"callback_url": "https://callback.invalid/hook"})
    assert response.status_code == 422 and "callback.invalid" in response.json()["detail"]
    assert crossings == ["admit"]


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


def test_a_submission_loads_no_orm_object(pg):
    """The new row is built from the values just written: asking the database for it back (RETURNING
    every column into an ORM object) was a third of a submission's CPU in the server."""
    engine = db.make_engine(pg)
    session = db.session_factory(engine)()
    try:
        verification = repository.insert_unless_known(
            session, submitted_by="s", idempotency_key="k", request_sha256="a" * 64,
            request={"source_uri": "hf://o/s@x", "artifact_uri": "hf://o/m@x/m.gguf", "artifact_sha256": "e" * 64},
            policy={"version": "1"}, policy_sha256="b" * 64, max_attempts=3, policy_origin="configured:default")
        assert verification is not None and len(session.identity_map) == 0
        session.commit()
        stored = repository.get_verification(session, verification.id)
        assert stored is not None and (stored.state, stored.attempt, stored.failed_attempts, stored.policy_origin) == (
            verification.state, verification.attempt, 0, "configured:default")
    finally:
        session.close()
        engine.dispose()


def test_serve_uses_the_c_http_parser_and_event_loop_without_access_log(monkeypatch, tmp_path):
    """uvicorn's pure-Python h11 parser and asyncio's loop cost the server CPU on every request; its
    access log is below the server's log level anyway, so it is only work. The parser is httptools, in the
    protocol class that times out slow clients (service/api/serving.py)."""
    import uvicorn
    from typer.testing import CliRunner
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from service.cli import app as cli

    seen: dict[str, object] = {}
    monkeypatch.setattr(uvicorn.Server, "run", lambda server: seen.update(config=server.config))
    monkeypatch.setattr(gc, "freeze", lambda: seen.update(frozen=True))  # this test process's collector stays
    monkeypatch.setattr(gc, "set_threshold", lambda *thresholds: seen.update(thresholds=thresholds))
    monkeypatch.setenv("CONVGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'c.db'}")
    result = CliRunner().invoke(cli, ["serve", "--no-migrate"])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert issubclass(config.http, HttpToolsProtocol), config.http  # type: ignore[attr-defined]
    assert (config.loop, config.access_log) == ("uvloop", False), seen  # type: ignore[attr-defined]
    # The collector: the heap the imports and the app built moved out of its way, and collections made
    # rarer (a full collection walked that heap under load: the p99 of a submission was 3x its p50)
    assert seen.get("frozen") is True and seen.get("thresholds") == (100_000, 50, 1_000), seen


@pytest.mark.parametrize("database", ["pg", "sqlite_url"])
def test_insert_unless_known_writes_the_row_and_its_event_once_per_key(database, request):
    """One round trip on Postgres (the event inserted from the verification's RETURNING), two on
    SQLite (no INSERT inside WITH); a taken key writes nothing on both."""
    engine = db.make_engine(request.getfixturevalue(database))
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_rest: statements.append(sql.split()[0]))
    columns = dict(submitted_by="s", idempotency_key="k", request_sha256="a" * 64, policy={"version": "1"},
                   request={"source_uri": "hf://o/s@x", "artifact_uri": "hf://o/m@x/m.gguf",
                            "artifact_sha256": "e" * 64}, policy_sha256="b" * 64, max_attempts=3)
    try:
        with db.transaction(db.session_factory(engine)) as session:
            first = repository.insert_unless_known(session, **columns)
            for_first = [sql for sql in statements if sql != "BEGIN"]  # SQLite's BEGIN IMMEDIATE
            again = repository.insert_unless_known(session, **columns)
            for_again = [sql for sql in statements if sql != "BEGIN"][len(for_first):]
        with engine.connect() as connection:
            written = connection.execute(text(
                "SELECT v.id, v.state, e.to_state, e.message, e.reason_code, e.attempt, e.at = v.created_at "
                "FROM verifications v JOIN verification_events e ON e.verification_id = v.id")).all()
    finally:
        engine.dispose()
    assert first is not None and again is None
    assert [tuple(row) for row in written] == [(first.id, "queued", "queued", "submitted", "submitted", 0, True)]
    assert for_first == (["WITH"] if database == "pg" else ["INSERT", "INSERT"])
    assert for_again == (["WITH"] if database == "pg" else ["INSERT"])
