"""The server process: uvicorn with the C HTTP parser and event loop, deadlines for slow clients, and one
process or several.

Slow clients. uvicorn times out an idle keep-alive connection, but not one that sends its request slowly: a
connection that sent part of its headers, or part of its body, was held for as long as the client liked
(a red team held 3,000 connections with partial headers and 1,000 with partial bodies for as long as it
tried). `TimedHttpToolsProtocol` gives uvicorn's own httptools protocol two deadlines, counted from the
request's first byte and from its headers, not renewed by each byte that trickles in: the request line
and headers within `header_timeout_seconds` (else 408 and the connection closed), the whole body within
`body_timeout_seconds` of the headers (else the connection is closed and the application sees the client
go). An ingress in front (nginx's `client_header_timeout` and `client_body_timeout`) does the same for its
own connections; these hold for whatever reaches the process directly, the embedded default included.

Processes. One process serves the API and runs the background loops (dispatch, callbacks). With `workers`
above one, uvicorn's supervisor runs that many API-only processes on one listening socket (the kernel
spreads connections over them) and this process runs the loops: the API's Python, bound to one core per
process, is what limits a replica's throughput (scripts/bench_api.py).

Shutdown (SIGTERM) is the app's: open event streams end at once (`app.py`, the lifespan), and uvicorn gives
the requests in flight `shutdown_grace_seconds` before it cancels them.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.supervisors import Multiprocess

from service.config import Settings

REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
GC_THRESHOLDS = (100_000, 50, 1_000)


class ServeConfig(uvicorn.Config):
    """uvicorn's configuration and the request deadlines its protocol reads (picklable, as uvicorn's
    supervisor hands the configuration to each worker process)."""

    def __init__(self, app: Any, *, header_seconds: float, body_seconds: float, **options: Any) -> None:
        super().__init__(app, http=TimedHttpToolsProtocol, **options)
        self.header_seconds = header_seconds
        self.body_seconds = body_seconds


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request's headers and one for its body."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        defaults = Settings.model_fields
        self.header_seconds: float = getattr(config, "header_seconds", defaults["header_timeout_seconds"].default)
        self.body_seconds: float = getattr(config, "body_seconds", defaults["body_timeout_seconds"].default)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_request = False  # between a request's first byte and the end of its body

    def _arm(self, seconds: float, expired: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_seconds, self._headers_late)  # a connection that never sends a request too

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._deadline is None:
            self._arm(self.header_seconds, self._headers_late)  # the first byte of a keep-alive's next request
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._in_request = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._arm(self.body_seconds, self._body_late)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_request = False
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

    def _body_late(self) -> None:
        """The application is running and waits for the rest of the body: closing tells it the client went."""
        self._deadline = None
        self._in_request = False
        if not self.transport.is_closing():
            self.transport.close()


def settle_the_collector() -> None:
    """Everything imported and built so far (FastAPI, SQLAlchemy, pydantic's schemas: hundreds of thousands
    of objects that live as long as the process) is frozen out of the cyclic collector's sight, and its
    collections made rarer. Under load each full collection walked that heap: a submission's p99 was
    3-4x its p50, and 1.5x after this (scripts/bench_api.py). Requests make little cyclic garbage."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def server_config(app: Any, settings: Settings, *, host: str, port: int, **options: Any) -> ServeConfig:
    """The C HTTP parser and event loop (less server CPU per request than h11 on asyncio's loop,
    scripts/bench_api.py), the deadlines above, and no access log (below the server's log level anyway:
    not computed at all)."""
    return ServeConfig(app, host=host, port=port, log_level="warning", loop="uvloop", access_log=False,
                       header_seconds=settings.header_timeout_seconds, body_seconds=settings.body_timeout_seconds,
                       timeout_graceful_shutdown=round(settings.shutdown_grace_seconds), **options)


def api_replica() -> FastAPI:
    """A worker process's app (uvicorn's factory): the API only; the parent runs the background loops."""
    from service.api.app import create_app, no_loops

    app = create_app(Settings(), loops=no_loops)
    settle_the_collector()
    return app


def serve(settings: Settings, *, host: str, port: int, workers: int = 1) -> None:
    """Serve the API: in this process (and its background loops), or in `workers` API processes while this
    one runs the loops."""
    from service.api.app import create_app, every_loop
    from service.persistence.db import make_engine, session_factory

    if workers == 1:
        app = create_app(settings)
        settle_the_collector()
        uvicorn.Server(server_config(app, settings, host=host, port=port)).run()
        return
    config = server_config(f"{__name__}:api_replica", settings, host=host, port=port, factory=True,
                           workers=workers)
    engine = make_engine(settings.database_url, busy_timeout_seconds=settings.sqlite_busy_timeout_seconds)
    loops = every_loop(settings, session_factory(engine))  # as in one process: here, beside the API processes
    for loop in loops:
        loop.start()
    try:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    finally:
        for loop in reversed(loops):
            loop.stop()
        engine.dispose()
