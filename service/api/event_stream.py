"""A verification's events as server-sent events, for clients that would rather wait on a stream than poll.

Each event is `id: <event id>`, `event: <state it moved to>`, `data: <the event as JSON>`; a client that
reconnects sends `Last-Event-ID` and gets only what came after. The stream ends once the verification is
terminal and its last event was sent. Between events it polls the database (a short transaction each
time, so no connection or SQLite lock is held while waiting) and sends a comment line now and then so
that proxies keep the connection open.

A plain `StreamingResponse` is enough for this: the format is three lines per event, the stream ends by
itself, and Starlette already stops the generator when the client goes away. sse-starlette would add a
dependency for a ping and shutdown handling we do not need.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.lifecycle import TERMINAL
from service.persistence.db import transaction
from service.persistence.models import Verification, VerificationEvent
from service.persistence.repository import as_utc

MEDIA_TYPE = "text/event-stream"
KEEPALIVE_SECONDS = 15.0
BATCH = 500


def _read(factory: sessionmaker[Session], verification_id: str, after: int) -> tuple[str | None, list[bytes]]:
    """The state, then the events after `after`: read in that order, so a terminal state's own event
    (committed with it) is always among them."""
    with transaction(factory) as session:
        state = session.scalar(select(Verification.state).where(Verification.id == verification_id))
        events = session.scalars(select(VerificationEvent).where(
            VerificationEvent.verification_id == verification_id, VerificationEvent.id > after)
            .order_by(VerificationEvent.id).limit(BATCH))
        return state, [_frame(event) for event in events]


def _frame(event: VerificationEvent) -> bytes:
    data = {"id": event.id, "at": as_utc(event.at).isoformat(), "from_state": event.from_state,
            "to_state": event.to_state, "attempt": event.attempt, "message": event.message,
            "reason_code": event.reason_code}
    return f"id: {event.id}\nevent: {event.to_state}\ndata: {json.dumps(data)}\n\n".encode()


def _last_id(frame: bytes) -> int:
    return int(frame.split(b"\n", 1)[0].removeprefix(b"id: "))


async def _events(factory: sessionmaker[Session], verification_id: str, after: int,
                  poll_seconds: float) -> AsyncIterator[bytes]:
    quiet = 0.0
    while True:
        state, frames = await run_in_threadpool(_read, factory, verification_id, after)
        for frame in frames:
            yield frame
        if frames:
            after, quiet = _last_id(frames[-1]), 0.0
            if len(frames) == BATCH:
                continue  # more are waiting
        if state is None or state in TERMINAL:
            return
        await anyio.sleep(poll_seconds)
        quiet += poll_seconds
        if quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield b": keep-alive\n\n"


def event_stream(factory: sessionmaker[Session], verification_id: str, after: int,
                 poll_seconds: float) -> StreamingResponse:
    return StreamingResponse(_events(factory, verification_id, after, poll_seconds), media_type=MEDIA_TYPE,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
