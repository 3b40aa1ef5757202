"""On Postgres the auditor's page is one statement on psycopg itself (`listing.logged_page_on_driver`): the page
and its access-log row. What it answers must be exactly what the ORM page answers, for every filter and page,
and its row must be written when, and only when, the page is read."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import bindparam, func, select
from sqlalchemy import exc as db_errors
from sqlalchemy.orm import Session, sessionmaker

from service import verifications
from service.persistence import access_log, driver, listing
from service.persistence.cursors import InvalidCursorError
from service.persistence.db import make_async_engine, make_engine, session_factory, transaction
from service.persistence.models import AccessLogRecord, Verification

START = datetime(2026, 3, 1, 12, tzinfo=UTC)
SHA_A, SHA_B = "a" * 64, "b" * 64
SOURCE = "hf://org/src@" + "0" * 40
# One row per way a verification can look in the list: every column the answer shows, set and unset.
SHAPES: list[dict[str, Any]] = [
    {"policy": {"version": "v1"}},
    {"state": "running", "attempt": 1, "started_at": START, "progress": {"phase": "runtime", "fraction": 0.5},
     "worker": "w-1", "queue_position": None},
    {"state": "completed", "attempt": 1, "verdict_result": "GO", "finished_at": START, "policy_origin": "inline",
     "policy": {"version": "inline:abc"}, "submitted_by": "other"},
    {"state": "failed", "attempt": 3, "failed_attempts": 3, "reason": "the worker was lost",
     "reason_code": "worker_lost", "cluster_status": "evicted", "artifact_sha256": SHA_B},
    {"state": "completed", "verdict_result": "NO-GO", "reused_from": "0" * 36, "policy": {"version": 7},
     "policy_origin": "configured:strict", "source_uri": "hf://org/other@" + "1" * 40},
    {"queue_position": 3, "policy_origin": "unrecorded", "policy": {}},
    {"created_tie": True},  # the same moment as the next: the keyset's id order decides
    {"created_tie": True, "artifact_sha256": SHA_B},
]
FILTERS = [
    {}, {"artifact_sha256": SHA_A}, {"artifact_sha256": SHA_B}, {"source_uri": "hf://org/other@" + "1" * 40},
    {"verdict": "GO"}, {"verdict": "NO-GO"}, {"state": "queued"}, {"submitted_by": "other"},
    {"since": START + timedelta(minutes=3)}, {"until": START + timedelta(minutes=3)},
    {"since": START + timedelta(minutes=2), "until": START + timedelta(minutes=6, hours=2)},
    {"since": (START + timedelta(minutes=3)).astimezone(datetime.now().astimezone().tzinfo)},
    {"policy_origin": "configured"}, {"policy_origin": "inline"}, {"policy_origin": "unrecorded"},
    {"policy": "strict"}, {"policy_origin": "configured", "policy": "default"}, {"policy": "unknown"},
    {"artifact_sha256": SHA_A, "state": "queued", "policy_origin": "configured"},
]


@contextmanager
def _sessions(url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(url)
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()


def _seed(url: str) -> None:
    with _sessions(url) as factory, transaction(factory) as session:
        for index, seeded in enumerate(SHAPES):
            shape = dict(seeded)
            tied = shape.pop("created_tie", False)
            moment = START + timedelta(minutes=6 if tied else index)
            session.add(Verification(**{
                "id": f"{index:08d}-0000-4000-8000-000000000000", "submitted_by": "auditor-seen",
                "request_sha256": "c" * 64, "source_uri": SOURCE,
                "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf", "artifact_sha256": SHA_A, "request": {},
                "policy": {"version": "v0"}, "policy_sha256": "d" * 64, "policy_origin": "configured:default",
                "state": "queued", "attempt": 0, "failed_attempts": 0, "max_attempts": 3, "created_at": moment,
                "updated_at": moment, **shape}))


def _logged(action: str = "list_verifications", role: str = "auditor") -> dict[str, Any]:
    return access_log.entry(at=START, principal="auditor-1", role=role, action=action, path="/v1/verifications",
                            query={"limit": "2"})


def _access_rows(url: str) -> int:
    with _sessions(url) as factory, factory() as session:
        return session.scalar(select(func.count()).select_from(AccessLogRecord))


def _pages_on_driver(url: str, filters: listing.ListFilters, limit: int) -> list[tuple[list[dict], str | None]]:
    async def read() -> list[tuple[list[dict], str | None]]:
        engine = make_async_engine(url)
        pages, cursor = [], None
        try:
            async with driver.borrowed(engine) as connection:
                while True:
                    rows, cursor = await listing.logged_page_on_driver(connection, filters, limit=limit,
                                                                       cursor=cursor, logged=_logged())
                    pages.append(([verifications.listed_out(row).model_dump() for row in rows], cursor))
                    if cursor is None:
                        return pages
        finally:
            await engine.dispose()
    return asyncio.run(read())


def _pages_on_orm(url: str, filters: listing.ListFilters, limit: int) -> list[tuple[list[dict], str | None]]:
    pages, cursor = [], None
    with _sessions(url) as factory, factory() as session:
        while True:
            rows, cursor = listing.page(session, filters, limit=limit, cursor=cursor)
            pages.append(([verifications.to_out(session, row, with_blockers=False).model_dump() for row in rows],
                          cursor))
            if cursor is None:
                return pages


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f) or "none")
def test_the_driver_page_answers_what_the_orm_page_answers_page_after_page(pg, filters):
    _seed(pg)
    chosen = listing.ListFilters(**filters)
    for limit in (2, 50):
        on_orm = _pages_on_orm(pg, chosen, limit)
        assert _pages_on_driver(pg, chosen, limit) == on_orm
    assert sum(len(items) for items, _ in on_orm) == len([shape for shape in SHAPES if _matches(shape, filters)])


def _matches(shape: dict[str, Any], filters: dict[str, Any]) -> bool:
    """Whether a seeded row passes the filters, decided without SQL: the test's own count of what a page holds."""
    index = SHAPES.index(shape)
    created = START + timedelta(minutes=6 if shape.get("created_tie") else index)
    origin = shape.get("policy_origin", "configured:default")
    columns = {"artifact_sha256": shape.get("artifact_sha256", SHA_A), "source_uri": shape.get("source_uri", SOURCE),
               "verdict": shape.get("verdict_result"), "state": shape.get("state", "queued"),
               "submitted_by": shape.get("submitted_by", "auditor-seen")}
    if any(columns[name] != filters[name] for name in columns if name in filters):
        return False
    wanted_origin = filters.get("policy_origin")
    return (("since" not in filters or created >= filters["since"])
            and ("until" not in filters or created < filters["until"])
            and (wanted_origin != "configured" or origin.startswith("configured:"))
            and (wanted_origin in (None, "configured") or origin == wanted_origin)
            and ("policy" not in filters or origin == f"configured:{filters['policy']}"))


def test_each_page_read_appends_its_row_to_the_access_log(pg):
    _seed(pg)
    assert _access_rows(pg) == 0
    pages = _pages_on_driver(pg, listing.ListFilters(), limit=3)
    assert len(pages) == 3 and _access_rows(pg) == 3
    with _sessions(pg) as factory, factory() as session:
        row = session.scalars(select(AccessLogRecord)).first()
    assert (row.principal, row.role, row.action, row.path, row.query, row.verification_id) == (
        "auditor-1", "auditor", "list_verifications", "/v1/verifications", {"limit": "2"}, None)


async def _one_page(url: str, *, limit: int, logged: dict[str, Any], cursor: str | None = None) -> None:
    engine = make_async_engine(url)
    try:
        async with driver.borrowed(engine) as connection:
            await listing.logged_page_on_driver(connection, listing.ListFilters(), limit=limit, cursor=cursor,
                                                logged=logged)
    finally:
        await engine.dispose()


def test_a_page_that_fails_to_be_read_is_not_logged_as_read(pg):
    """The read and its row are one statement: a read Postgres refuses (a negative LIMIT) writes no row."""
    _seed(pg)
    with pytest.raises(Exception, match="LIMIT must not be negative"):
        asyncio.run(_one_page(pg, limit=-2, logged=_logged()))
    assert _access_rows(pg) == 0


def test_a_row_that_fails_to_be_written_fails_the_read(pg):
    """A read whose access-log row cannot be written is not answered (the role is longer than its column)."""
    _seed(pg)
    with pytest.raises(Exception, match="too long"):
        asyncio.run(_one_page(pg, limit=5, logged=_logged(role="r" * 40)))
    assert _access_rows(pg) == 0


def test_a_cursor_this_service_did_not_make_is_refused_before_any_statement(pg):
    _seed(pg)
    with pytest.raises(InvalidCursorError):
        asyncio.run(_one_page(pg, limit=5, logged=_logged(), cursor="MQ=="))
    assert _access_rows(pg) == 0


def test_a_parameter_is_json_by_its_type_not_its_name():
    """The list binds its `policy` filter against a text column; the verification's `policy` column is JSON.
    A parameter's type says which it is: the filter must reach psycopg as the text it is, not as JSON."""
    text_filter = driver.compiled(select(Verification.id).where(Verification.policy_origin == bindparam("policy")))
    json_value = driver.compiled(select(Verification.id).where(Verification.policy == bindparam("policy")))
    assert text_filter.parameters({"policy": "configured:x"}) == {"policy": "configured:x"}
    assert json_value.parameters({"policy": {"a": 1}}) == {"policy": '{"a": 1}'}


def test_a_parameter_name_the_dialect_would_escape_is_refused_when_compiled():
    """psycopg is given values by the names the caller uses; an escaped name in the SQL would never be bound."""
    with pytest.raises(ValueError, match="plain names"):
        driver.compiled(select(Verification.id).where(Verification.state == bindparam("state.now")))


def test_every_shape_of_the_list_compiles_once(pg):
    """The driver's statement is cached per set of filters given, not per request: values never reach its SQL."""
    _seed(pg)
    listing._logged_page.cache_clear()
    for filters in ({"artifact_sha256": SHA_A}, {"artifact_sha256": SHA_B}):
        _pages_on_driver(pg, listing.ListFilters(**filters), limit=2)
    assert listing._logged_page.cache_info().misses == 2  # the first page, then the pages after a cursor
    assert SHA_A not in listing._logged_page(("artifact_sha256",)).sql


def test_psycopg_errors_leave_the_driver_as_sqlalchemy_errors(pg):
    _seed(pg)
    with pytest.raises(db_errors.DBAPIError) as refused:
        asyncio.run(_one_page(pg, limit=-2, logged=_logged()))
    assert isinstance(refused.value.orig, psycopg.Error)
