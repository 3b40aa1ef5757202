"""A verification's events as server-sent events, for clients that would rather wait on a stream than poll.

Each event is `id: <event id>`, `event: <state it moved to>`, `data: <the event as JSON>`; a client that
reconnects sends `Last-Event-ID` and gets only what came after. The stream ends once the verification is
terminal and its last event was sent. Between events it polls the database (a short transaction each
time, a read that takes no SQLite write lock, so no connection or lock is held while waiting) and sends a
comment line now and then so that proxies keep the connection open. Streams are capped per principal and
in total (`StreamSlots`: beyond the cap, 429), and each poll re-checks the caller's token, so revoking a
token ends its streams. When the server is told to stop (SIGTERM), every open stream ends at its next
poll with a comment saying so, so shutdown never waits on a client that would wait forever: the client
reconnects (to another replica) with `Last-Event-ID` and misses nothing.

A plain `StreamingResponse` is enough for this: the format is three lines per event, the stream ends by
itself, and Starlette already stops the generator when the client goes away. sse-starlette would add a
dependency for a ping and shutdown handling we do not need.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable

import anyio
from fastapi.responses import StreamingResponse
from sqlalchemy import exc as db_errors
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.lifecycle import TERMINAL
from service.persistence import tokens
from service.persistence.clock import as_utc
from service.persistence.db import read_transaction
from service.persistence.models import Verification, VerificationEvent

MEDIA_TYPE = "text/event-stream"
KEEPALIVE_SECONDS = 15.0
BATCH = 500


class StreamSlots:
    """Open streams per principal and in all. Taken in a pool thread (the endpoint), given back on the
    event loop (the stream's end): hence the lock."""

    def __init__(self, total: int, per_principal: int) -> None:
        self.total, self.per_principal = total, per_principal
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, principal: str) -> bool:
        with self._lock:
            if self._open.total() >= self.total or self._open[principal] >= self.per_principal:
                return False
            self._open[principal] += 1
            return True

    def held(self) -> int:
        with self._lock:
            return self._open.total()

    def give_back(self, principal: str) -> None:
        with self._lock:
            self._open[principal] -= 1
            if self._open[principal] <= 0:
                del self._open[principal]


def _read(factory: sessionmaker[Session], verification_id: str, after: int,
          token_sha256: str) -> tuple[str | None, list[bytes]]:
    """The state, then the events after `after`: read in that order, so a terminal state's own event
    (committed with it) is always among them. A revoked token reads nothing (state None ends the stream)."""
    with read_transaction(factory) as session:
        if tokens.active_name_and_role(session, token_sha256) is None:
            return None, []
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


STOPPING = b": the server is stopping: reconnect with Last-Event-ID\n\n"


async def _events(factory: sessionmaker[Session], verification_id: str, after: int, poll_seconds: float,
                  token_sha256: str, done: Callable[[], None], stopping: threading.Event) -> AsyncIterator[bytes]:
    try:
        async for frame in _frames(factory, verification_id, after, poll_seconds, token_sha256, stopping):
            yield frame
    finally:
        done()


async def _frames(factory: sessionmaker[Session], verification_id: str, after: int, poll_seconds: float,
                  token_sha256: str, stopping: threading.Event) -> AsyncIterator[bytes]:
    quiet = 0.0
    while True:
        if stopping.is_set():
            yield STOPPING
            return
        try:
            state, frames = await run_in_threadpool(_read, factory, verification_id, after, token_sha256)
        except (db_errors.OperationalError, db_errors.TimeoutError):
            # the database refuses for a while (a restart, a failover, an exhausted pool): the stream
            # waits for it, saying so, rather than ending mid-response
            yield b": database unavailable, retrying\n\n"
            await anyio.sleep(poll_seconds)
            continue
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


def event_stream(factory: sessionmaker[Session], verification_id: str, after: int, poll_seconds: float, *,
                 token_sha256: str, done: Callable[[], None], stopping: threading.Event) -> StreamingResponse:
    """The stream; `done` runs once it ends (the slot it holds is given back); it ends when `stopping` is set."""
    return StreamingResponse(_events(factory, verification_id, after, poll_seconds, token_sha256, done, stopping),
                             media_type=MEDIA_TYPE,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
