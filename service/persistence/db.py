"""Engines and sessions. SQLite (the embedded default) gets real transactions: pysqlite's own
transaction handling is switched off and every transaction starts with BEGIN IMMEDIATE (the recipe
in SQLAlchemy's pysqlite notes), so the write lock is held from a transaction's first statement
and a read-then-write inside it is fenced; plus foreign keys, WAL and a busy timeout, so writers
wait for each other instead of failing at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
API_THREADS = 40  # the API's threadpool for sync endpoints and dependencies (anyio's default; app.py sets it)


def _sqlite_engine(url: str, busy_timeout_seconds: float) -> Engine:
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": busy_timeout_seconds, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy, not pysqlite, says when a transaction starts
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_engine(url: str, *, busy_timeout_seconds: float = SQLITE_BUSY_TIMEOUT_SECONDS) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url, busy_timeout_seconds)
    # As many kept connections as the API has threads: a connection the pool cannot keep is closed on
    # return and reopened by the next request (a backend fork and a SCRAM handshake; with 10 kept, ~15%
    # of submissions under 32 concurrent clients opened one); the overflow covers requests that hold a
    # connection while waiting for their next thread.
    return create_engine(url, pool_size=API_THREADS, max_overflow=10, pool_pre_ping=True)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work outside a request: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
