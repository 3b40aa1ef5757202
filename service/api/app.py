"""The application factory: settings in, app out; engine and dispatch loop owned by the app's lifespan."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import FrameType
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import Engine, text
from sqlalchemy import exc as db_errors
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

from service.api import access_log, declared, endpoints, errors, exports, pages_auditor, queue_page, submission
from service.api import attestations as attestation_endpoint
from service.api.deps import admitted, bearer, principal_for
from service.api.event_stream import StreamSlots
from service.api.http_metrics import HttpMetrics, HttpMetricsMiddleware
from service.api.limits import BodyLimitMiddleware
from service.api.login_throttle import LoginThrottle
from service.api.ui_sessions import UiSessions
from service.auth import OPERATE
from service.callbacks_loop import CallbackLoop
from service.config import Settings
from service.metrics import make_registry
from service.persistence.db import (
    READ_ONLY,
    async_session_factory,
    make_async_engine,
    make_engine,
    request_unit,
    session_factory,
)
from service.schemas import ListQuery, SubmitRequest
from service.ticker import Ticker

log = logging.getLogger(__name__)


def create_app(settings: Settings, *, loops: Loops | None = None) -> FastAPI:
    """The API, and beside it the background `loops` this process runs (default: `every_loop`; an API-only
    process of `serve --workers`, whose parent runs them, is given `no_loops`)."""
    busy = settings.sqlite_busy_timeout_seconds
    engine = make_engine(settings.database_url, threads=settings.api_threads, busy_timeout_seconds=busy)
    factory = session_factory(engine)
    async_engine = make_async_engine(settings.database_url, busy_timeout_seconds=busy)
    lifespan = _lifespan(settings, factory, engine, async_engine, loops or every_loop)
    app = FastAPI(title="convgate", version="0.1.0", lifespan=lifespan,
                  description="Verifies Hugging Face -> GGUF conversions before they ship.")
    app.state.settings = settings
    app.state.session_factory = factory
    app.state.engine = engine
    app.state.async_engine = async_engine
    app.state.async_session_factory = async_session_factory(async_engine)
    app.state.login_throttle = LoginThrottle()
    app.state.ui_sessions = UiSessions(settings)
    app.state.stream_slots = StreamSlots(settings.max_streams, settings.max_streams_per_principal)
    app.state.stopping = threading.Event()  # set when the server is told to stop: open streams end
    for module in (submission, endpoints, access_log, queue_page, exports, pages_auditor, attestation_endpoint):
        app.include_router(module.router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    errors.install(app)
    app.openapi = declared.documented(app, SubmitRequest, queries=(ListQuery,))  # type: ignore[method-assign]
    registry = make_registry(factory, pool=settings.concurrency if settings.dispatcher == "local" else None)
    app.state.http_metrics = http_metrics = HttpMetrics(registry)
    app.add_middleware(HttpMetricsMiddleware, metrics=http_metrics)  # outermost: every answer is timed
    for unavailable in (db_errors.OperationalError, db_errors.TimeoutError):  # locked, refused, pool exhausted
        app.add_exception_handler(unavailable, database_unavailable)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        """On the event loop: liveness must not queue behind requests waiting on the database in the pool."""
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse)
    def readyz() -> Response:
        """A read (on SQLite it never waits for the write lock): one pool thread, nothing held after it."""
        try:
            with engine.connect().execution_options(**{READ_ONLY: True}) as connection:
                connection.execute(text("SELECT 1 FROM verifications LIMIT 1"))
        except Exception as exc:  # any database failure means not ready
            return PlainTextResponse(f"database not ready: {type(exc).__name__}", status_code=503)
        return PlainTextResponse("ready")

    @app.get("/metrics", response_class=PlainTextResponse, responses={
        401: errors.ERRORS[401], 403: errors.ERRORS[403]})
    def metrics(request: Request) -> Response:
        """Prometheus text format; with metrics_public off, an operator's or admin's bearer token (looked up
        and its unit committed before the collectors read, in this one pool thread)."""
        if not settings.metrics_public:
            with request_unit(factory) as session:
                admitted(principal_for(session, bearer(request)), OPERATE)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


# What runs beside the API in one process, not yet started: made from the settings and the session factory
Loops = Callable[[Settings, sessionmaker[Session]], list[Ticker]]


def every_loop(settings: Settings, factory: sessionmaker[Session]) -> list[Ticker]:
    """The dispatch loop and the completion-callback loop (callbacks go out where the dispatch loop runs);
    none on an API-only replica (`dispatcher=none`: another replica dispatches)."""
    if settings.dispatcher == "none":
        return []
    from service.dispatch.loop import DispatchLoop

    return [DispatchLoop.for_settings(settings, factory), CallbackLoop(factory, settings)]


def no_loops(settings: Settings, factory: sessionmaker[Session]) -> list[Ticker]:
    """An API-only process: another process runs the loops (the parent of `serve --workers`)."""
    return []


def end_streams_on_exit_signals(stopping: threading.Event) -> Callable[[], None]:
    """SIGTERM and SIGINT also set `stopping` (every open event stream ends at its next poll), then do what
    they did before (uvicorn's graceful shutdown); returns what puts the previous handlers back. Signals reach
    only the main thread: a server run in another thread (a test's) keeps its handlers as they are."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, Any] = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}

    def handler(number: int, frame: FrameType | None) -> None:
        stopping.set()
        then = previous[number]
        if callable(then):
            then(number, frame)
        else:  # the default action (or none): as if this handler had not been installed
            signal.signal(number, then)
            signal.raise_signal(number)

    def restore() -> None:
        for number, then in previous.items():
            signal.signal(number, then)

    for number in previous:
        signal.signal(number, handler)
    return restore


def _lifespan(settings: Settings, factory: sessionmaker[Session], engine: Engine, async_engine: AsyncEngine,
              make_loops: Loops) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the dispatch and callback loops started and stopped, exit signals made to end the
    open event streams, the engines disposed."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads  # a connection each
        loops = app.state.loops = make_loops(settings, factory)
        for loop in loops:
            loop.start()
        restore_signals = end_streams_on_exit_signals(app.state.stopping)
        try:
            yield
        finally:
            restore_signals()
            for loop in reversed(loops):
                loop.stop()
            engine.dispose()
            await async_engine.dispose()
    return lifespan


RETRY_AFTER_SECONDS = 5


async def database_unavailable(request: Request, exc: Exception) -> Response:
    """A locked, refusing or exhausted database is the service's temporary state, not a fault in the
    request: 503 and when to retry, never a 500 (the driver's message stays in the server log)."""
    log.warning("database unavailable: %s", type(exc).__name__)
    request.app.state.http_metrics.database_unavailable.inc()  # what the database alert counts
    return JSONResponse({"detail": "the database is unavailable; retry later", "code": "database.unavailable"},
                        status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
