"""Single statements on Postgres run by psycopg itself, on a connection borrowed from the async engine's pool:
for the API's busiest write, where SQLAlchemy's asyncio execution (a greenlet per call, the execution context,
the ORM session's transaction) cost more CPU than the statements (scripts/bench_api.py: 0.55 ms of a
submission's 1.1 ms). The statements are still SQLAlchemy's: each is a Core statement compiled once for
psycopg's dialect, so the SQL is written once for both paths; only its execution is the driver's.

Each statement runs in autocommit, as its own transaction: a single INSERT is atomic and durable when it
returns, and a read needs no BEGIN and COMMIT around it (two round trips fewer per submission). The pool, its
size, its check of connections the server closed and the engine's disposal stay SQLAlchemy's. A driver error
is raised as SQLAlchemy raises it (`sqlalchemy.exc.OperationalError` for a refused or lost connection), so the
API answers it as it answers every other database error; a lost connection recycles the pool, as SQLAlchemy
does when its own execution loses one (a failover's silent peers would otherwise fail a request each)."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import anyio
import psycopg
from sqlalchemy import JSON
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import greenlet_spawn

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine
    from sqlalchemy.pool import PoolProxiedConnection

_DIALECT = psycopg_dialect.dialect()


class JsonText(str):
    """A JSON parameter's value already encoded as its text, bound as it is: a value every submission shares
    (the configured policy, 3 KB of thresholds whose encoding cost a submission ~50 us) is encoded once."""


def available(engine: AsyncEngine) -> bool:
    """Whether `engine`'s statements can run on the driver here: Postgres through psycopg (SQLite keeps
    SQLAlchemy's execution, whose transactions fence its single writer)."""
    return engine.dialect.name == "postgresql"  # make_async_engine's Postgres driver is psycopg


@dataclass(frozen=True)
class Compiled:
    """A Core statement as psycopg runs it: its SQL text, the values SQLAlchemy bound into it (its literals),
    and which parameters are JSON-typed (psycopg is given their text)."""

    sql: str
    fixed: Mapping[str, Any]
    json_parameters: frozenset[str]

    def parameters(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` as psycopg binds them: JSON parameters as their text (None too: JSON's null, as SQLAlchemy's
        JSON type writes it; a `JsonText` is that text already). The rest as they are: a state or reason is a
        StrEnum, which psycopg binds as the string it is."""
        bound = dict(self.fixed)
        for name, value in values.items():
            encode = name in self.json_parameters and not isinstance(value, JsonText)
            bound[name] = json.dumps(value) if encode else value
        return bound


@functools.cache  # statements are module constants, or cached per shape by their builders
def compiled(statement: ClauseElement) -> Compiled:
    """`statement` compiled once for psycopg. Its JSON parameters are known by their type (a parameter compared
    with, or written to, a JSON column takes the column's), not by their name: a filter named `policy` compares
    a text column."""
    result = cast(SQLCompiler, statement.compile(dialect=_DIALECT))
    if result.escaped_bind_names:  # psycopg is given values by the names callers use, which must be in the SQL
        raise ValueError(f"driver statements bind plain names only: {sorted(result.escaped_bind_names)}")
    json_parameters = frozenset(name for name in result.params if isinstance(result.binds[name].type, JSON))
    fixed = {name: value for name, value in result.params.items() if value is not None}
    return Compiled(str(result), fixed, json_parameters)


@asynccontextmanager
async def borrowed(engine: AsyncEngine) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A psycopg connection from `engine`'s pool, in autocommit while it is borrowed (every statement its own
    transaction); a driver error comes out as SQLAlchemy's, and a connection it broke is discarded. The pool's
    own connection, not an `AsyncConnection` around it: that wrapper cost as much CPU as the lookup of the
    token it would run (scripts/bench_api.py)."""
    try:
        pooled = await engine.raw_connection()  # the pool's checkout: a refused connection is the driver's error
    except psycopg.Error as exc:
        raise _as_sqlalchemy(exc, invalidated=False) from exc
    connection = cast(psycopg.AsyncConnection[Any], pooled.driver_connection)
    try:
        await connection.set_autocommit(True)
        yield connection
    except psycopg.Error as exc:
        raise _as_sqlalchemy(exc, invalidated=connection.broken) from exc
    finally:
        with anyio.CancelScope(shield=True):  # given back, or discarded, even when the request is cancelled
            await _give_back(engine, pooled, connection)


async def _give_back(engine: AsyncEngine, pooled: PoolProxiedConnection,
                     connection: psycopg.AsyncConnection[Any]) -> None:
    """`connection` back to the pool as it was lent (out of autocommit: SQLAlchemy begins its own
    transactions), or discarded when it cannot be; a lost one recycles the whole pool."""
    if not (connection.broken or connection.closed):
        try:
            await connection.set_autocommit(False)
            await greenlet_spawn(pooled.close)
            return
        except psycopg.Error:
            pass  # not idle (a statement still in flight): discarded below, never lent in that state
    await greenlet_spawn(pooled.invalidate)
    if connection.broken:
        await engine.dispose()  # the others may be as dead: each is reopened at its next checkout


def _as_sqlalchemy(exc: psycopg.Error, *, invalidated: bool) -> BaseException:
    """`exc` as SQLAlchemy raises a driver's error (OperationalError, IntegrityError, ...), with no statement
    or parameters attached: a submission's carry the URIs it names."""
    return DBAPIError.instance(None, None, exc, psycopg.Error, connection_invalidated=invalidated)


async def first_row(connection: psycopg.AsyncConnection[Any], statement: Compiled,
                    values: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The first row `statement` returns with `values`, or None."""
    cursor = await connection.execute(statement.sql, statement.parameters(values))
    return await cursor.fetchone()
