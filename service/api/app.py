"""The application factory: settings in, app out; engine and dispatch loop owned by the app's lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI, HTTPException, Request, status
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import Engine, text
from sqlalchemy import exc as db_errors
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

from service.api import access_log, endpoints, errors, exports, pages_auditor, queue_page
from service.api import attestations as attestation_endpoint
from service.api.deps import get_principal
from service.api.event_stream import StreamSlots
from service.api.limits import BodyLimitMiddleware
from service.api.login_throttle import LoginThrottle
from service.api.ui_sessions import UiSessions
from service.auth import OPERATE
from service.callbacks_loop import CallbackLoop
from service.config import Settings
from service.metrics import make_registry
from service.persistence.db import (
    API_THREADS,
    async_session_factory,
    make_async_engine,
    make_engine,
    session_factory,
    transaction,
)

log = logging.getLogger(__name__)


def create_app(settings: Settings, *, run_dispatcher: bool = True, run_callbacks: bool | None = None) -> FastAPI:
    """`run_callbacks` (default: wherever the dispatch loop runs) starts the completion-callback loop."""
    engine = make_engine(settings.database_url)
    factory = session_factory(engine)
    async_engine = make_async_engine(settings.database_url)
    background = run_dispatcher and settings.dispatcher != "none"
    lifespan = _lifespan(settings, factory, engine, async_engine, background=background,
                         run_callbacks=background if run_callbacks is None else run_callbacks)
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
    for module in (endpoints, access_log, queue_page, exports, pages_auditor, attestation_endpoint):
        app.include_router(module.router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    errors.install(app)
    for unavailable in (db_errors.OperationalError, db_errors.TimeoutError):  # locked, refused, pool exhausted
        app.add_exception_handler(unavailable, database_unavailable)
    registry = make_registry(factory)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        """On the event loop: liveness must not queue behind requests waiting on the database in the pool."""
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse)
    def readyz() -> Response:
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1 FROM verifications LIMIT 1"))
        except Exception as exc:  # any database failure means not ready
            return PlainTextResponse(f"database not ready: {type(exc).__name__}", status_code=503)
        return PlainTextResponse("ready")

    @app.get("/metrics", response_class=PlainTextResponse, responses={
        401: errors.ERRORS[401], 403: errors.ERRORS[403]})
    def metrics(request: Request) -> Response:
        """Prometheus text format; with metrics_public off, an operator's or admin's bearer token."""
        if not settings.metrics_public:
            with transaction(factory) as session:
                principal = get_principal(request, session)
            if principal.role not in OPERATE:
                raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {principal.role} may not read metrics")
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _lifespan(settings: Settings, factory: sessionmaker[Session], engine: Engine, async_engine: AsyncEngine, *,
              background: bool, run_callbacks: bool) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the dispatch and callback loops started and stopped, the engines disposed."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = API_THREADS  # one connection each
        loop = None
        if background:
            from service.dispatch.loop import DispatchLoop

            loop = DispatchLoop.for_settings(settings, factory)
            loop.start()
        app.state.dispatch_loop = loop
        callback_loop = CallbackLoop(factory, settings) if run_callbacks else None
        app.state.callback_loop = callback_loop
        if callback_loop is not None:
            callback_loop.start()
        try:
            yield
        finally:
            if callback_loop is not None:
                callback_loop.stop()
            if loop is not None:
                loop.stop()
            engine.dispose()
            await async_engine.dispose()
    return lifespan


RETRY_AFTER_SECONDS = 5


async def database_unavailable(_request: Request, exc: Exception) -> Response:
    """A locked, refusing or exhausted database is the service's temporary state, not a fault in the
    request: 503 and when to retry, never a 500 (the driver's message stays in the server log)."""
    log.warning("database unavailable: %s", type(exc).__name__)
    return JSONResponse({"detail": "the database is unavailable; retry later", "code": "database.unavailable"},
                        status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
