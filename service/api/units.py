"""A request's database work in one trip to the threadpool: the caller looked up, admitted or refused,
the work done, the unit committed and its connection returned, and the answer rendered, all in one pool
thread; the event loop then only sends bytes.

Why one trip: a request that held a transaction (on SQLite, the write lock; on Postgres, a pooled
connection) while it waited for a second thread (FastAPI validates a sync endpoint's returned model in
another pool thread, and a sync dependency's teardown ran after the response was sent) could wait behind
requests that were themselves waiting for what it held. Under ~50 concurrent reads every thread waited
for the lock or a connection and nothing committed until the busy or pool timeout gave way (issue 34). A
unit here holds nothing while it waits for a thread, and needs only the one it runs in.

Every route that touches the database is `async def`: its caller is looked up on the loop (`deps.caller`,
an async session closed at once) and its work is `one_trip`; the submission and the auditor's query do
all of theirs on the loop (the async session). `tests/service/test_concurrency.py` audits the routes for
it and measures 200 concurrent clients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response, status
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.persistence.db import request_unit

T = TypeVar("T")


async def one_trip(request: Request, work: Callable[[Session], T]) -> T:
    """`work` in one pool thread, inside a request unit (`db.request_unit`) committed in that thread."""
    factory = request.app.state.session_factory

    def run() -> T:
        with request_unit(factory) as session:
            return work(session)

    return await run_in_threadpool(run)


async def on_loop(request: Request, work: Callable[..., T], *args: Any) -> T:
    """`work(session, *args)` in an async session's greenlet on the event loop, committed before it returns
    (before the answer), whatever it left undone rolled back and its connection returned even when the
    request is cancelled."""
    async with request.app.state.async_session_factory() as session:
        try:
            done = await session.run_sync(work, *args)
            await session.commit()
            return done
        finally:
            with anyio.CancelScope(shield=True):
                await session.close()


def json_response(model: BaseModel, status_code: int = status.HTTP_200_OK,
                  headers: dict[str, str] | None = None) -> Response:
    """`model` as the JSON answer, rendered in the unit's thread: returning the model would have FastAPI
    validate it again, in another pool thread."""
    return Response(model.model_dump_json().encode(), status_code, headers, media_type="application/json")
