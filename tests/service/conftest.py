"""Service fixtures: a throwaway Postgres database (migrated once), SQLite files, a live server."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from engine.policy import Policy
from service.api.app import Loops, create_app, no_loops
from service.auth import Role, digest, new_secret
from service.callbacks_loop import CallbackLoop
from service.config import Settings
from service.persistence import tokens
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.migrate import upgrade
from service.ticker import Ticker
from tests.databases import drop_database

PG_ADMIN = os.environ.get("CONVGATE_TEST_PG", "postgresql://convgate_test:convgate-test-only@127.0.0.1:5432/postgres")
TABLES = ("callback_deliveries, callback_secrets, attestations, access_log, worker_reports, file_digests, "
          "tensor_rows, gate_results, verdicts, verification_events, verifications, api_tokens")


def _pg_available() -> bool:
    try:
        psycopg.connect(PG_ADMIN, connect_timeout=3).close()
    except psycopg.OperationalError:
        return False
    return True


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh database for this test run, migrated to head once, dropped at the end."""
    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail("Postgres is not reachable; .ci/run must start it")
        pytest.skip("Postgres is not reachable")
    name = f"convgate_test_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    upgrade(url)
    yield url
    make_engine(url).dispose()
    drop_database(PG_ADMIN, name)


@pytest.fixture
def pg(pg_url: str) -> Iterator[str]:
    """The Postgres URL with every table emptied before the test (TRUNCATE bypasses row triggers)."""
    engine = make_engine(pg_url)
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    engine.dispose()
    yield pg_url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'convgate.db'}"
    upgrade(url)
    return url


# The service tests' configured default: the suite's policy without the labelled retrieval set (~30 s more
# per MiniLM run), which the engine's own tests exercise (tests/integration/test_labelled_retrieval.py)
SERVICE_POLICIES = {"default": Policy(labelled_retrieval=False)}


@pytest.fixture(params=["sqlite", "postgres"])
def api_per_role(request, tmp_path) -> Iterator[TestClient]:
    """An API-only app on each database, a token per role (`tokens`, `names`) and its database `url`."""
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")
    app = create_app(settings_for(url, tmp_path, file_roots=(Path("/models"),)), loops=no_loops)
    suffix = uuid.uuid4().hex[:6]
    names = {role: f"{role.value}-{suffix}" for role in Role}
    tokens = {role: add_token(url, role, names[role]) for role in Role}
    with TestClient(app) as client:
        client.tokens, client.names, client.url = tokens, names, url
        yield client


def settings_for(url: str, tmp_path, **overrides) -> Settings:
    return Settings(database_url=url, cache_dir=tmp_path / "cache", poll_seconds=0.1,
                    **({"policies": SERVICE_POLICIES} | overrides))


def add_token(url: str, role: Role, name: str | None = None) -> str:
    secret = new_secret()
    engine = make_engine(url)
    with transaction(session_factory(engine)) as session:
        tokens.add_token(session, name or f"{role.value}-{uuid.uuid4().hex[:6]}", role.value, digest(secret))
    engine.dispose()
    return secret


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    app: object
    settings: Settings

    def headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def callback_loop_only(settings: Settings, factory: sessionmaker[Session]) -> list[Ticker]:
    """The loops of a test that finishes verifications itself and watches their callbacks go out."""
    return [CallbackLoop(factory, settings)]


def start_server(settings: Settings, *, loops: Loops = no_loops) -> Iterator[LiveServer]:
    app = create_app(settings, loops=loops)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           limit_concurrency=1000))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", app, settings)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
