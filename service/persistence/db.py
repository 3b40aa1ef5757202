"""Engines and sessions. SQLite (the embedded default) gets real transactions: pysqlite's own
transaction handling is switched off and every transaction starts with BEGIN IMMEDIATE (the recipe
in SQLAlchemy's pysqlite notes), so the write lock is held from a transaction's first statement
and a read-then-write inside it is fenced; plus foreign keys, WAL and a busy timeout, so writers
wait for each other instead of failing at once.

A request's unit of work (`request_unit`) is the exception: it begins as a read (on SQLite a deferred
transaction, which in WAL mode neither takes nor waits for the write lock) and becomes a write only
when it is about to write (`writing`), in the same thread that then commits. A request that took the
write lock at its first read held it while it waited for anything else (a thread for its response, a
slow client), and under load every other request waited for it."""

from __future__ import annotations

import select
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from service.persistence.clock import CLOCK, SYSTEM_CLOCK, Clock

if TYPE_CHECKING:  # the asyncio side is the API's alone (its extra installs greenlet and aiosqlite)
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
READ_ONLY = "convgate_read_only"  # an execution option: this transaction only reads (SQLite: no write lock)
API_THREADS = 40  # the API's threadpool for request units and streams' polls (anyio's default; app.py sets it)
BACKGROUND_CONNECTIONS = 10  # beyond one per API thread: the dispatch and callback loops and their workers
ASYNC_CONNECTIONS = 16  # kept by the async engine (and as many more opened under a burst)


def _sqlite_file(url: str) -> None:
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_transactions(engine: Engine, busy_timeout_seconds: float) -> None:
    """Real transactions on `engine` (a sync engine, or an async engine's `sync_engine`): see the module."""
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
        deferred = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")


def _replace_connections_the_server_closed(engine: Engine) -> None:
    """A pooled Postgres connection the server ended while it sat idle (a restart, a failover,
    pg_terminate_backend) is replaced at checkout, never handed to a request that would answer 503 with it.
    The server's goodbye (its FATAL message, then end of file) makes an idle connection's socket readable,
    and nothing else does while no statement is running: a poll with no wait, not SQLAlchemy's pre-ping
    round trip, which cost ~0.15 ms of CPU on every request (scripts/bench_api.py). A peer that vanished
    without a word is not seen here; its request fails with a 503 and the pool is recycled, as before (on the
    driver's statements too: `driver.borrowed`)."""
    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if _closed_by_server(getattr(dbapi_connection, "driver_connection", dbapi_connection)):
            raise DisconnectionError("the server closed this idle connection")  # the pool opens another


def _closed_by_server(connection: Any) -> bool:
    """Whether psycopg's idle `connection` is closed, broken, or has bytes (the server's goodbye) waiting."""
    if connection.closed or connection.broken:
        return True
    try:
        descriptor = connection.pgconn.socket
    except psycopg.OperationalError:  # no socket left to poll: closed
        return True
    poller = select.poll()  # not select(): a busy server's connections sit on descriptors past its 1024
    poller.register(descriptor, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))  # readable, or hung up or in error (reported whatever was asked)


def make_engine(url: str, *, busy_timeout_seconds: float = SQLITE_BUSY_TIMEOUT_SECONDS,
                threads: int = API_THREADS) -> Engine:
    """As many kept connections as the API has threads (`threads`), on SQLite too: a request uses one
    connection in one thread (`request_unit`), so no thread ever waits for a connection another request
    holds. On Postgres a connection the pool cannot keep is closed on return and reopened by the next
    request (a backend fork and a SCRAM handshake; with 10 kept, ~15% of submissions under 32 concurrent
    clients opened one). SQLite's default pool kept 5 and opened at most 15: 25 of 40 threads waited
    for one while the holders waited for threads. The overflow is the background loops'."""
    pool = {"pool_size": threads, "max_overflow": BACKGROUND_CONNECTIONS}
    if url.startswith("sqlite"):
        _sqlite_file(url)
        engine = create_engine(url, connect_args={"timeout": busy_timeout_seconds, "check_same_thread": False},
                               **pool)
        _sqlite_transactions(engine, busy_timeout_seconds)
        return engine
    engine = create_engine(url, **pool)
    _replace_connections_the_server_closed(engine)
    return engine


def make_async_engine(url: str, *, busy_timeout_seconds: float = SQLITE_BUSY_TIMEOUT_SECONDS) -> AsyncEngine:
    """The same database through an asyncio driver (psycopg's, aiosqlite), for the API's busiest endpoints:
    their ORM code runs on the event loop, in a greenlet that waits on the socket, where a pool thread per
    request cost a GIL hand-off and a futex wake-up on each side (half of a submission's server CPU,
    measured with scripts/bench_api.py). Its pool is the event loop's concurrency, not a thread count."""
    from sqlalchemy.ext.asyncio import create_async_engine

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        _sqlite_file(url)
        engine = create_async_engine(parsed.set(drivername="sqlite+aiosqlite"), pool_size=ASYNC_CONNECTIONS,
                                     max_overflow=ASYNC_CONNECTIONS, connect_args={"timeout": busy_timeout_seconds})
        _sqlite_transactions(engine.sync_engine, busy_timeout_seconds)
        return engine
    engine = create_async_engine(parsed.set(drivername="postgresql+psycopg"), pool_size=ASYNC_CONNECTIONS,
                                 max_overflow=ASYNC_CONNECTIONS)
    _replace_connections_the_server_closed(engine.sync_engine)
    return engine


def session_factory(engine: Engine, clock: Clock = SYSTEM_CLOCK) -> sessionmaker[Session]:
    """Sessions that read the time from `clock` (service/persistence/clock.py)."""
    return sessionmaker(engine, expire_on_commit=False, info={CLOCK: clock})


def async_session_factory(engine: AsyncEngine, clock: Clock = SYSTEM_CLOCK) -> async_sessionmaker[AsyncSession]:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    return async_sessionmaker(engine, expire_on_commit=False, info={CLOCK: clock})


def factory_clock(factory: async_sessionmaker[AsyncSession]) -> Clock:
    """The clock `factory`'s sessions read (`async_session_factory`), for a write made beside them."""
    clock: Clock = factory.kw.get("info", {}).get(CLOCK, SYSTEM_CLOCK)
    return clock


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


def begin_read(session: Session) -> None:
    """Begin `session`'s transaction as a read: on SQLite a deferred one, which in WAL mode never waits for
    a writer and never holds the write lock (a read that took it, then crossed to another thread, held
    every other request behind it). `writing` ends it before the unit writes. A transaction already open
    (on Postgres, the one the token was read in) goes on as it is."""
    if not session.in_transaction():
        session.connection(execution_options={READ_ONLY: True})


@contextmanager
def read_transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work that only reads (a stream's poll): no write lock, nothing to commit."""
    with transaction(factory) as session:
        begin_read(session)
        yield session


@contextmanager
def request_unit(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A request's unit of work, from its first statement to its commit in one thread (the caller's): it
    begins as a read, and `writing` makes it a write just before it writes. Committed when the block ends,
    rolled back if it raises; the connection is back in the pool before the caller does anything else."""
    with transaction(factory) as session:
        begin_read(session)
        yield session


def writing(session: Session) -> None:
    """The unit is about to write. On SQLite its read transaction ends here and the next statement begins
    BEGIN IMMEDIATE (waiting for the write lock, if another holds it, for the busy timeout): a deferred
    transaction that writes would fail at once, not wait, if another writer had committed since it began
    reading. What the write depends on must be read after this call, inside the write transaction. On
    Postgres nothing changes: one transaction, row locks taken by the statements that write."""
    if session.get_bind().dialect.name != "sqlite" or not session.in_transaction():
        return
    if session.connection().get_execution_options().get(READ_ONLY, False):
        session.commit()

def read_first(session: Session, query: Callable[[Session], T]) -> T:
    """`query` as a read of its own before the request's unit of work begins (the token lookup): on SQLite
    in a deferred transaction that is ended at once, so the request's write lock is taken only when it
    writes, in the thread that commits; elsewhere inside the request's own transaction (one round trip)."""
    if session.get_bind().dialect.name != "sqlite" or session.in_transaction():
        return query(session)
    begin_read(session)
    try:
        return query(session)
    finally:
        session.commit()
