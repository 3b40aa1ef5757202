"""The auditor's list of verifications: its filters, their WHERE clause, and a page newest first, read through
the ORM or, on Postgres, as one statement on the driver that also appends the read to the access log.

Why the filters are named parameters (`list_values`, then `where` over the names): the statement's text
depends only on WHICH filters are set, so the driver compiles each shape once (`driver.compiled`) and binds
the values of each request, as the submission's insert is run (scripts/bench_api.py: the auditor query spent
more CPU in SQLAlchemy's execution and ORM loading than in its two statements). The ORM page, the export
(`service.persistence.exports`) and the driver's page build their WHERE from the same two functions."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import Select, Table, bindparam, insert, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from service.persistence import driver
from service.persistence.clock import as_utc
from service.persistence.cursors import decode_verification_cursor, encode_verification_cursor
from service.persistence.models import AccessLogRecord, Verification
from service.persistence.repository import instant

if TYPE_CHECKING:
    import psycopg

Keyset = tuple[datetime, str]  # (created_at, id) of the last row shown: where the next page starts
_VERIFICATIONS = cast(Table, Verification.__table__)
_ACCESS_LOG = cast(Table, AccessLogRecord.__table__)
_CONFIGURED = "configured:%"  # every configured policy's origin: "configured:<name>" (no LIKE wildcard in it)


@dataclass(frozen=True)
class ListFilters:
    artifact_sha256: str | None = None
    source_uri: str | None = None
    verdict: str | None = None
    state: str | None = None
    submitted_by: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    policy_origin: str | None = None  # "configured", "inline" or "unrecorded" (policy origin, revision 0005)
    policy: str | None = None  # a configured policy's name


class Listed(NamedTuple):
    """A verification as the list shows it, read on the driver: the columns its answer needs and no ORM object
    (making one cost more than rendering it)."""

    id: str
    state: str
    attempt: int
    failed_attempts: int | None
    max_attempts: int
    submitted_by: str
    source_uri: str
    artifact_uri: str
    artifact_sha256: str
    policy_sha256: str
    policy_origin: str | None
    policy: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: dict[str, Any] | None
    reason: str | None
    reason_code: str | None
    cluster_status: str | None
    queue_position: int | None
    verdict_result: str | None
    reused_from: str | None


_EQUAL = {"artifact_sha256": Verification.artifact_sha256, "source_uri": Verification.source_uri,
          "verdict": Verification.verdict_result, "state": Verification.state,
          "submitted_by": Verification.submitted_by}
_NEWEST_FIRST = (Verification.created_at.desc(), Verification.id.desc())
_LOGGED = ("at", "principal", "role", "action", "path", "query")  # a list read names no verification


def decode_cursor(cursor: str) -> Keyset:
    """Raises InvalidCursorError for a cursor this service did not issue."""
    return decode_verification_cursor(cursor)


def encode_cursor(row: Verification | Listed) -> str:
    return encode_verification_cursor(as_utc(row.created_at), row.id)


def list_values(filters: ListFilters, after: Keyset | None = None) -> dict[str, Any]:
    """The filters, and the keyset to continue after, as the values of the list's named parameters; which
    names are present is the statement's shape (`where`)."""
    values: dict[str, Any] = {name: getattr(filters, name) for name in _EQUAL if getattr(filters, name) is not None}
    if filters.since is not None:
        values["since"] = instant(filters.since)
    if filters.until is not None:
        values["until"] = instant(filters.until)
    if filters.policy_origin == "configured":
        values["configured"] = _CONFIGURED
    elif filters.policy_origin is not None:
        values["policy_origin"] = filters.policy_origin
    if filters.policy is not None:
        values["policy"] = f"configured:{filters.policy}"
    if after is not None:
        values["after_created"], values["after_id"] = after
    return values


def where(values: Mapping[str, Any]) -> list[ColumnElement[bool]]:
    """The WHERE conditions over `values`' names, each against its named parameter holding its value.

    The keyset (after_created, after_id) is the rows after that (created_at, id) in the newest-first order:
    `created_at <= x` bounds the index range; the OR only sorts out the rows at x. (The OR alone is a filter,
    not a range: Postgres then walks every newer row, page after page.)"""
    def value(name: str) -> BindParameter[Any]:
        return bindparam(name, values[name])

    conditions = [column == value(name) for name, column in _EQUAL.items() if name in values]
    if "since" in values:
        conditions.append(Verification.created_at >= value("since"))
    if "until" in values:
        conditions.append(Verification.created_at < value("until"))
    if "configured" in values:
        conditions.append(Verification.policy_origin.like(value("configured")))
    for name in ("policy_origin", "policy"):  # an origin ("inline"), one configured policy's own origin
        if name in values:
            conditions.append(Verification.policy_origin == value(name))
    if "after_created" in values:
        after = value("after_created")
        conditions += [Verification.created_at <= after,
                       or_(Verification.created_at < after, Verification.id < value("after_id"))]
    return conditions


def newest_first(query: Select[Any], values: Mapping[str, Any]) -> Select[Any]:
    """`query` under the conditions of `values`, in the list's order: (created_at, id) descending, so pages
    never skip or repeat a row."""
    return query.where(*where(values)).order_by(*_NEWEST_FIRST)


def _page_of(rows: list[Any], limit: int) -> tuple[list[Any], str | None]:
    """The first `limit` of `limit + 1` rows read, and the next page's cursor when there was one more."""
    return rows[:limit], encode_cursor(rows[limit - 1]) if len(rows) > limit else None


def page(session: Session, filters: ListFilters, *, limit: int,
         cursor: str | None = None) -> tuple[list[Verification], str | None]:
    """A page of verifications newest first, and the next page's cursor (InvalidCursorError for a cursor this
    service did not make)."""
    values = list_values(filters, None if cursor is None else decode_cursor(cursor))
    return _page_of(list(session.scalars(newest_first(select(Verification), values).limit(limit + 1))), limit)


async def logged_page_on_driver(connection: psycopg.AsyncConnection[Any], filters: ListFilters, *, limit: int,
                                cursor: str | None, logged: Mapping[str, Any]) -> tuple[list[Listed], str | None]:
    """`page` on Postgres's driver with its access-log row (`logged`: the values of `_LOGGED`) in ONE statement,
    the row appended by a data-modifying WITH: committed when the statement returns (the connection is in
    autocommit), before the answer, and never when the statement fails (the read and the row are one)."""
    values = list_values(filters, None if cursor is None else decode_cursor(cursor))
    statement = _logged_page(tuple(values))
    bound = {**values, "rows": limit + 1, **{f"log_{name}": logged[name] for name in _LOGGED}}
    read = await connection.execute(statement.sql, statement.parameters(bound))
    return _page_of([Listed._make(row) for row in await read.fetchall()], limit)


@functools.cache  # one statement per set of filters given: 1,536 shapes at most, a handful in practice
def _logged_page(names: tuple[str, ...]) -> driver.Compiled:
    logged = insert(_ACCESS_LOG).values({name: bindparam(f"log_{name}", type_=_ACCESS_LOG.c[name].type)
                                         for name in _LOGGED}).cte("logged")
    listed = select(*(_VERIFICATIONS.c[name] for name in Listed._fields))
    return driver.compiled(newest_first(listed, dict.fromkeys(names)).limit(bindparam("rows")).add_cte(logged))
