"""The application factory: settings in, app out; engine and dispatch loop owned by the app's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.api import endpoints, queue_page
from service.config import Settings
from service.metrics import make_registry
from service.persistence.db import make_engine, session_factory


def create_app(settings: Settings, *, run_dispatcher: bool = True) -> FastAPI:
    engine = make_engine(settings.database_url)
    factory = session_factory(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = None
        if run_dispatcher and settings.dispatcher != "none":
            from service.dispatch.loop import DispatchLoop

            loop = DispatchLoop.for_settings(settings, factory)
            loop.start()
        app.state.dispatch_loop = loop
        try:
            yield
        finally:
            if loop is not None:
                loop.stop()
            engine.dispose()

    app = FastAPI(title="convgate", version="0.1.0", lifespan=lifespan,
                  description="Verifies Hugging Face -> GGUF conversions before they ship.")
    app.state.settings = settings
    app.state.session_factory = factory
    app.state.engine = engine
    app.include_router(endpoints.router)
    app.include_router(queue_page.router)
    registry = make_registry(factory)

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse)
    def readyz() -> Response:
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1 FROM verifications LIMIT 1"))
        except Exception as exc:  # any database failure means not ready
            return PlainTextResponse(f"database not ready: {type(exc).__name__}", status_code=503)
        return PlainTextResponse("ready")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
