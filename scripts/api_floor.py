"""The floor under POST /v1/verifications, for scripts/bench_api.py: the least a durable submission can
cost on this machine, measured next to the real endpoint in the same run.

A bare ASGI app (no framework, no authentication, no validation, no policy) served by the same uvicorn
(httptools, uvloop, no access log) as `convgate serve`. Its POST parses the JSON body and writes the same
two rows the real endpoint writes (the queued verification and its "submitted" event, one statement)
through async psycopg, committed before it answers 201; its GET /v1/verifications?artifact_sha256=
reads the same page the auditor query reads and appends the same access-log row, committed before it
answers; its GET /healthz answers from memory. Whatever this app's ratios to its own /healthz are, no
implementation of the real endpoints that keeps a submission, and an auditor's read, durable before
answering can beat them on the same cores.

Run by bench_api.py: `uvicorn api_floor:app` with CONVGATE_FLOOR_DSN naming the benchmark's database.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg

CONNECTIONS = 32  # the benchmark's concurrency: no request waits for a connection
SUBMIT = """
WITH new AS (
    INSERT INTO verifications (id, submitted_by, idempotency_key, request_sha256, source_uri, artifact_uri,
        artifact_sha256, request, policy, policy_sha256, policy_origin, state, attempt, failed_attempts,
        max_attempts, created_at, updated_at)
    VALUES (%(id)s, 'floor', %(key)s, %(request_sha256)s, %(source_uri)s, %(artifact_uri)s, %(artifact_sha256)s,
        %(request)s, '{}', %(request_sha256)s, 'configured:default', 'queued', 0, 0, 3, now(), now())
    ON CONFLICT DO NOTHING RETURNING id)
INSERT INTO verification_events (verification_id, at, from_state, to_state, attempt, message, reason_code)
SELECT id, now(), NULL, 'queued', 0, 'submitted', 'submitted' FROM new RETURNING verification_id"""

AUDIT_PAGE = """
SELECT id, state, submitted_by, source_uri, artifact_uri, artifact_sha256, policy_sha256, verdict_result, created_at
FROM verifications WHERE artifact_sha256 = %s ORDER BY created_at DESC, id DESC LIMIT 51"""
AUDIT_LOG = """
INSERT INTO access_log (at, principal, role, action, verification_id, path, query)
VALUES (now(), 'floor', 'auditor', 'list_verifications', NULL, '/v1/verifications', %s)"""
POOL: dict[str, asyncio.Queue[psycopg.AsyncConnection[Any]]] = {}  # "idle": opened at startup


async def _lifespan(receive, send) -> None:
    """Open the connections before the first request and close them at shutdown (ASGI lifespan)."""
    await receive()  # lifespan.startup
    idle: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for _ in range(CONNECTIONS):
        idle.put_nowait(await psycopg.AsyncConnection.connect(os.environ["CONVGATE_FLOOR_DSN"]))
    POOL["idle"] = idle
    await send({"type": "lifespan.startup.complete"})
    await receive()  # lifespan.shutdown
    while not idle.empty():
        await idle.get_nowait().close()
    await send({"type": "lifespan.shutdown.complete"})


@asynccontextmanager
async def _transaction() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An idle connection inside a transaction committed on exit, given back to the pool afterwards."""
    idle = POOL["idle"]
    connection = await idle.get()
    try:
        async with connection.transaction():
            yield connection
    finally:
        idle.put_nowait(connection)


async def _body(receive) -> bytes:
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send) -> None:
    """GET /healthz from memory; POST /v1/verifications: one durable insert; GET /v1/verifications: the
    auditor's page and its durable access-log row; anything else 404."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["method"] == "GET" and scope["path"] == "/healthz":
        await _answer(send, 200, b'{"status":"ok"}')
        return
    if scope["method"] == "GET" and scope["path"] == "/v1/verifications":
        await _answer(send, 200, await _audit(scope["query_string"].decode()))
        return
    if scope["method"] != "POST" or scope["path"] != "/v1/verifications":
        await _answer(send, 404, b"{}")
        return
    raw = await _body(receive)
    request = json.loads(raw)
    key = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
    row = {"id": str(uuid.uuid4()), "key": key or None, "request_sha256": hashlib.sha256(raw).hexdigest(),
           "source_uri": request["source_uri"], "artifact_uri": request["artifact_uri"],
           "artifact_sha256": request["artifact_sha256"], "request": raw.decode()}
    async with _transaction() as connection:
        created = await (await connection.execute(SUBMIT, row)).fetchone()
    await _answer(send, 201 if created else 200, json.dumps({"id": row["id"], "state": "queued"}).encode())


async def _audit(query_string: str) -> bytes:
    """The auditor's page by artifact digest and its access-log row, in one committed transaction."""
    query = dict(urllib.parse.parse_qsl(query_string))
    async with _transaction() as connection:
        rows = await (await connection.execute(AUDIT_PAGE, (query.get("artifact_sha256", ""),))).fetchall()
        await connection.execute(AUDIT_LOG, (json.dumps(query),))
    names = ("id", "state", "submitted_by", "source_uri", "artifact_uri", "artifact_sha256", "policy_sha256",
             "verdict", "created_at")
    items = [dict(zip(names, (*row[:-1], row[-1].isoformat()), strict=True)) for row in rows[:50]]
    return json.dumps({"items": items, "next_cursor": None}).encode()
