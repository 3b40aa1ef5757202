"""On Postgres a plain submission is stored by its one statement on psycopg itself
(`service.persistence.driver`, `verifications.insert_plain_by_token`): what it writes must be exactly what the ORM
path writes, every other submission must still take that path, and the borrowed connection must go back to
the pool as it was lent, or be discarded when the driver broke it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import bindparam, select, text
from sqlalchemy import exc as db_errors

from service import verifications
from service.api.app import create_app, no_loops
from service.auth import Role
from service.persistence import driver, tokens
from service.persistence.db import make_async_engine, make_engine, session_factory, transaction
from service.persistence.models import Verification, VerificationEvent
from tests.service.conftest import add_token, settings_for

SHA = "d" * 64
HF_SOURCE = "hf://org/src@" + "0" * 40
IDENTITY_FREE = {"id", "idempotency_key", "created_at", "updated_at"}  # what differs between two submissions


def body(**overrides: Any) -> dict[str, Any]:
    return {"source_uri": HF_SOURCE, "artifact_uri": HF_SOURCE + "/m.gguf", "artifact_sha256": SHA, **overrides}


def client_for(url: str, tmp_path, **overrides: Any) -> TestClient:
    settings = settings_for(url, tmp_path, allow_private_addresses=True, **({"dispatcher": "none"} | overrides))
    client = TestClient(create_app(settings, loops=no_loops))
    client.headers["Authorization"] = f"Bearer {add_token(url, Role.SUBMITTER, 'submitter-1')}"
    client.settings = settings
    return client


@pytest.fixture
def api(pg, tmp_path):
    with client_for(pg, tmp_path) as client:
        yield client


@pytest.fixture
def inserted_plain(monkeypatch) -> list[str]:
    """The ids `verifications.insert_plain_by_token` stored: which submissions the driver wrote."""
    ids: list[str] = []
    insert_plain = verifications.insert_plain_by_token

    async def spied(*args: Any, **kwargs: Any) -> Any:
        found = await insert_plain(*args, **kwargs)
        ids.extend([] if found is None or found.row is None else [found.row["id"]])
        return found

    monkeypatch.setattr(verifications, "insert_plain_by_token", spied)
    return ids


def stored(url: str, verification_id: str) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The verification's columns and its events (state, attempt, message, reason), as the database holds them."""
    engine = make_engine(url)
    try:
        with transaction(session_factory(engine)) as session:
            row = session.get(Verification, verification_id)
            assert row is not None
            columns = {column.name: getattr(row, column.key) for column in Verification.__mapper__.columns}
            events = [(event.from_state, event.to_state, event.attempt, event.message, event.reason_code,
                       event.at == row.created_at)
                      for event in session.scalars(select(VerificationEvent)
                                                   .where(VerificationEvent.verification_id == verification_id))]
        return columns, events
    finally:
        engine.dispose()


@pytest.mark.parametrize(("dispatcher", "fresh"), [("none", False), ("local", True)],
                         ids=["no-reuse-key", "fresh-with-a-reuse-key"])
def test_a_plain_submission_on_the_driver_is_stored_as_the_orm_stores_it(pg, tmp_path, inserted_plain,
                                                                          dispatcher, fresh):
    """A local pool knows its verifier, so a pinned submission has a reuse key: written by both paths when
    `fresh` was asked (none is looked up), and none at all on an API-only replica."""
    with client_for(pg, tmp_path, dispatcher=dispatcher) as api:
        answer = api.post("/v1/verifications", json=body(fresh=fresh), headers={"Idempotency-Key": "driver"})
        assert answer.status_code == 202
        assert inserted_plain == [answer.json()["id"]]  # the driver wrote it
        assert answer.headers["Location"] == f"/v1/verifications/{answer.json()['id']}"
        engine = make_engine(pg)
        with transaction(session_factory(engine)) as session:  # the same request, stored by the ORM path
            submission = verifications.SubmitRequest.model_validate(body(fresh=fresh))
            orm, created = verifications.submit(session, api.settings, "submitter-1",
                                                verifications.admit(api.settings, submission), "orm")
            assert created
        engine.dispose()
        on_driver, driver_events = stored(pg, answer.json()["id"])
        by_orm, orm_events = stored(pg, orm.id)
        assert (on_driver["reuse_key"] is None) == (dispatcher == "none")
        assert {k: v for k, v in on_driver.items() if k not in IDENTITY_FREE} == \
            {k: v for k, v in by_orm.items() if k not in IDENTITY_FREE}
        assert on_driver["created_at"] == on_driver["updated_at"]
        assert driver_events == orm_events == [(None, "queued", 0, "submitted", "submitted", True)]
        shown = api.get(answer.headers["Location"]).json()
    assert {k: v for k, v in shown.items() if k not in {"queue_position", "cluster_status"}} == \
        {k: v for k, v in answer.json().items() if k not in {"queue_position", "cluster_status"}}


def test_a_repeated_key_on_the_driver_is_the_same_verification_or_a_409(api, inserted_plain):
    first = api.post("/v1/verifications", json=body(), headers={"Idempotency-Key": "again"})
    repeat = api.post("/v1/verifications", json=body(), headers={"Idempotency-Key": "again"})
    other = api.post("/v1/verifications", json=body(artifact_sha256="e" * 64), headers={"Idempotency-Key": "again"})
    assert (first.status_code, repeat.status_code, other.status_code) == (202, 200, 409)
    assert repeat.json()["id"] == first.json()["id"]
    assert inserted_plain == [first.json()["id"]]  # the repeats fell back to the ORM path, which answered them


def test_a_submission_that_reads_first_is_not_plain(api, inserted_plain):
    """A callback's secret is read before its insert: the ORM path refuses it without one."""
    answer = api.post("/v1/verifications", json=body(callback_url="https://127.0.0.1:9/hook"))
    assert answer.status_code == 422
    assert "callback secret" in answer.json()["detail"]
    assert inserted_plain == []


def test_a_bad_token_on_the_driver_is_a_401(api):
    answer = api.post("/v1/verifications", json=body(), headers={"Authorization": "Bearer nope"})
    assert answer.status_code == 401


def test_a_connection_the_driver_broke_is_an_operational_error_and_is_not_pooled_again(pg):
    """A lost connection is SQLAlchemy's OperationalError (the API's 503), and neither it nor the pool's other
    connections, which a failover may have lost as silently, is lent again."""
    async def scenario() -> set[int]:
        engine = make_async_engine(pg)
        try:
            async with driver.borrowed(engine) as first, driver.borrowed(engine) as second:
                pids = {(await (await c.execute("SELECT pg_backend_pid()")).fetchone())[0] for c in (first, second)}
            with pytest.raises(db_errors.OperationalError) as lost:
                async with driver.borrowed(engine) as connection:
                    await connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            assert lost.value.connection_invalidated  # as SQLAlchemy marks a disconnect its execution saw
            async with driver.borrowed(engine) as first, driver.borrowed(engine) as second:
                return pids & {(await (await c.execute("SELECT pg_backend_pid()")).fetchone())[0]
                               for c in (first, second)}
        finally:
            await engine.dispose()
    assert asyncio.run(scenario()) == set()


def test_a_json_column_given_none_is_json_null_as_sqlalchemy_writes_it():
    statement = driver.compiled(select(Verification.id).where(Verification.progress == bindparam("progress")))
    assert statement.parameters({"progress": None}) == {"progress": "null"}


def test_a_borrowed_connection_is_given_back_and_lent_again(pg):
    """A healthy connection goes back to the pool, not closed: the next borrow is the same backend."""
    async def scenario() -> set[int]:
        engine = make_async_engine(pg)
        try:
            pids = set()
            for _ in range(3):
                async with driver.borrowed(engine) as connection:
                    pids.add((await (await connection.execute("SELECT pg_backend_pid()")).fetchone())[0])
            return pids
        finally:
            await engine.dispose()
    assert len(asyncio.run(scenario())) == 1


def test_a_borrowed_connection_goes_back_to_the_pool_out_of_autocommit(pg):
    """After the driver's autocommit, SQLAlchemy's transactions on the same pooled connection still roll back."""
    async def scenario() -> int:
        engine = make_async_engine(pg)
        try:
            async with driver.borrowed(engine) as connection:
                assert connection.autocommit
            async with engine.connect() as connection:
                await connection.execute(text("INSERT INTO api_tokens (name, role, token_sha256, created_at) "
                                              "VALUES ('rolled-back', 'auditor', 'x', now())"))
                await connection.rollback()
                return len((await connection.execute(text("SELECT 1 FROM api_tokens WHERE name = 'rolled-back'")))
                           .all())
        finally:
            await engine.dispose()
    assert asyncio.run(scenario()) == 0


def test_a_database_that_refuses_the_driver_is_a_503(tmp_path):
    """No Postgres listens on port 9: the borrow fails as every other database access does, 503 and a retry."""
    settings = settings_for("postgresql+psycopg://convgate:none@127.0.0.1:9/convgate", tmp_path, dispatcher="none")
    with TestClient(create_app(settings, loops=no_loops)) as client:
        answer = client.post("/v1/verifications", json=body(), headers={"Authorization": "Bearer any"})
    assert answer.status_code == 503
    assert answer.json()["code"] == "database.unavailable"
    assert answer.headers["Retry-After"]


def test_a_borrow_cancelled_mid_statement_gives_back_a_usable_connection(pg):
    """A request cancelled while its statement runs (the client went away): psycopg cancels the statement on
    the server, the connection goes back to the pool idle (or is discarded), and nothing stays checked out
    for the next request to wait on."""
    async def scenario() -> tuple[list[int], int]:
        engine = make_async_engine(pg)
        try:
            async def slow() -> None:
                async with driver.borrowed(engine) as connection:
                    await connection.execute("SELECT pg_sleep(5)")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(slow(), timeout=0.3)
            async with driver.borrowed(engine) as connection:
                rows = [row[0] for row in await (await connection.execute("SELECT 1")).fetchall()]
            return rows, engine.pool.checkedout()
        finally:
            await engine.dispose()
    assert asyncio.run(scenario()) == ([1], 0)


@pytest.mark.parametrize(("extra", "blocks"), [({"callback_url": "https://127.0.0.1:9/hook"}, True), ({}, False)],
                         ids=["may-block", "pure"])
def test_no_connection_is_held_while_a_submission_is_admitted_in_a_pool_thread(api, monkeypatch, extra, blocks):
    """The token's connection carries on to the plain insert only when admission runs on the loop: one that
    may block (DNS for a callback's host) waits for a pool thread with every connection given back."""
    held: list[int] = []
    admit = verifications.admit

    def counted(*args: Any, **kwargs: Any) -> Any:
        held.append(api.app.state.async_engine.sync_engine.pool.checkedout())
        return admit(*args, **kwargs)

    monkeypatch.setattr(verifications, "admit", counted)
    api.post("/v1/verifications", json=body(**extra))
    assert held == [0 if blocks else 1]


def revoked(url: str, role: Role) -> str:
    secret = add_token(url, role, f"gone-{role.value}")
    engine = make_engine(url)
    with transaction(session_factory(engine)) as session:
        assert tokens.revoke_token(session, f"gone-{role.value}")
    engine.dispose()
    return secret


@pytest.mark.parametrize(("who", "status"), [("none", 401), ("revoked", 401), ("auditor", 403), ("operator", 403),
                                             ("submitter", 202), ("policy-author", 202)])
def test_the_one_statement_writes_only_for_an_active_token_whose_role_may_submit(api, pg, inserted_plain, who,
                                                                                 status):
    """The token is looked up by the statement that writes the row: a revoked token, or a role that may not
    submit, writes nothing (the row is not there to read afterwards) and is the refusal it was before."""
    secret = {"none": "not-a-token", "revoked": revoked(pg, Role.SUBMITTER)}.get(who) or add_token(pg, Role(who), who)
    answer = api.post("/v1/verifications", json=body(), headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == status
    engine = make_engine(pg)
    with transaction(session_factory(engine)) as session:
        written = session.scalars(select(Verification.submitted_by)).all()
    engine.dispose()
    assert written == ([who] if status == 202 else [])
    assert inserted_plain == ([answer.json()["id"]] if status == 202 else [])
    if status == 202:
        assert answer.json()["submitted_by"] == who


@pytest.mark.parametrize(("who", "status"), [("none", 401), ("auditor", 403), ("submitter", 422)])
@pytest.mark.parametrize("refused", [{"artifact_sha256": "not-hex"}, {"policy": "no-such-policy"}],
                         ids=["invalid-body", "refused-admission"])
def test_a_refused_body_is_answered_after_the_token(api, pg, who, status, refused):
    """The body is validated and admitted before the statement that looks the token up, but a refusal of it
    waits for the token's lookup: a bad token is still a 401, and a role that may not submit a 403."""
    secret = "not-a-token" if who == "none" else add_token(pg, Role(who), who)
    answer = api.post("/v1/verifications", json=body(**refused), headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == status


def test_a_submission_with_an_earlier_verdict_to_look_for_is_stored_as_its_callers(pg, tmp_path, inserted_plain):
    """A pinned submission to a local pool has a reuse key: prepared before its caller is known, it is not
    plain, so the ORM stores it, as the token holder's."""
    with client_for(pg, tmp_path, dispatcher="local") as api:
        answer = api.post("/v1/verifications", json=body())
    assert answer.status_code == 202
    assert inserted_plain == []
    assert answer.json()["submitted_by"] == "submitter-1"
    assert stored(pg, answer.json()["id"])[0]["submitted_by"] == "submitter-1"
