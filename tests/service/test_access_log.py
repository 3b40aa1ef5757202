"""The access log: who (token name and role) read which verification, report, events or list query,
when and by which path, kept in the database like the events (append-only), readable by auditors
and admins through GET /v1/access-log. Run on SQLite and on Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy
from sqlalchemy import text

from service.auth import Role
from service.persistence.access_log import AccessFilters, access_log
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.models import AccessLogRecord

SHA = "a" * 64


@pytest.fixture
def api(api_per_role):
    return api_per_role


def call(api, who: Role, path: str, **kwargs):
    return api.get(path, headers={"Authorization": f"Bearer {api.tokens[who]}"} | kwargs.pop("headers", {}),
                   **kwargs)


def submitted(api) -> str:
    body = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "artifact_sha256": SHA}
    response = api.post("/v1/verifications", json=body,
                        headers={"Authorization": f"Bearer {api.tokens[Role.SUBMITTER]}"})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def log(api, **params) -> list[dict]:
    response = call(api, Role.AUDITOR, "/v1/access-log", params=params)
    assert response.status_code == 200, response.text
    return response.json()["items"]


def test_every_read_is_logged_with_who_what_and_when(api):
    verification_id = submitted(api)
    assert call(api, Role.OPERATOR, f"/v1/verifications/{verification_id}").status_code == 200
    assert call(api, Role.SUBMITTER, f"/v1/verifications/{verification_id}/events").status_code == 200
    assert call(api, Role.AUDITOR, f"/v1/verifications/{verification_id}/report").status_code == 404  # no verdict
    assert call(api, Role.ADMIN, "/v1/verifications", params={"artifact_sha256": SHA, "limit": 5}).status_code == 200
    entries = log(api, verification_id=verification_id)
    assert [(e["principal"], e["role"], e["action"]) for e in entries] == [
        (api.names[Role.SUBMITTER], "submitter", "read_events"),
        (api.names[Role.OPERATOR], "operator", "read_verification"),
    ]  # newest first; the refused report read returned nothing, so nothing was read
    assert entries[1]["path"] == f"/v1/verifications/{verification_id}"
    assert entries[0]["at"] >= entries[1]["at"]
    (listing,) = log(api, principal=api.names[Role.ADMIN])
    assert listing["action"] == "list_verifications" and listing["verification_id"] is None
    assert listing["query"] == {"artifact_sha256": SHA, "limit": "5"}
    assert log(api, action="read_events")[0]["verification_id"] == verification_id


def test_the_list_of_reads_is_itself_logged_and_paged(api):
    verification_id = submitted(api)
    for _ in range(3):
        call(api, Role.OPERATOR, f"/v1/verifications/{verification_id}")
    first = call(api, Role.AUDITOR, "/v1/access-log", params={"limit": 2, "verification_id": verification_id}).json()
    second = call(api, Role.AUDITOR, "/v1/access-log",
                  params={"limit": 2, "verification_id": verification_id, "cursor": first["next_cursor"]}).json()
    assert len(first["items"]) == 2 and len(second["items"]) == 1 and second["next_cursor"] is None
    assert {e["id"] for e in first["items"]}.isdisjoint(e["id"] for e in second["items"])
    audits = log(api, principal=api.names[Role.AUDITOR], action="read_access_log")
    assert len(audits) >= 2  # the two pages just read (this read is the third)
    assert call(api, Role.AUDITOR, "/v1/access-log", params={"cursor": "MQ=="}).status_code == 400


@pytest.mark.parametrize("who", [Role.SUBMITTER, Role.POLICY_AUTHOR, Role.OPERATOR])
def test_only_auditors_and_admins_read_the_log(api, who):
    assert call(api, who, "/v1/access-log").status_code == 403
    assert call(api, Role.ADMIN, "/v1/access-log").status_code == 200
    assert api.get("/v1/access-log").status_code == 401


def test_the_log_is_append_only(api):
    call(api, Role.OPERATOR, f"/v1/verifications/{submitted(api)}")
    engine = make_engine(api.url)
    try:
        for statement in ("UPDATE access_log SET principal = 'someone-else'", "DELETE FROM access_log"):
            with pytest.raises(sqlalchemy.exc.DatabaseError, match="immutable"), engine.begin() as connection:
                connection.execute(text(statement))
    finally:
        engine.dispose()


# --- the query itself: time bounds and pages, on both databases ------------------------------------

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def reads(request):
    """Four reads by bob, one a minute from T0 (ids 1..4, oldest first), and the session factory."""
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")
    engine = make_engine(url)
    factory = session_factory(engine)
    with transaction(factory) as session:
        for minute in range(4):
            session.add(AccessLogRecord(at=T0 + timedelta(minutes=minute), principal="bob", role="auditor",
                                        action="read_verification", path="/v1/verifications", query={}))
    yield factory
    engine.dispose()


def page(factory, limit: int = 10, before_id: int | None = None, **filters) -> tuple[list[int], int | None]:
    with factory() as session:
        rows, before = access_log(session, AccessFilters(**filters), limit=limit, before_id=before_id)
        return [row.id for row in rows], before


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def test_since_is_inclusive_and_until_exclusive(reads):
    assert page(reads, since=at(1)) == ([4, 3, 2], None)  # the read at exactly `since` is in
    assert page(reads, until=at(2)) == ([2, 1], None)  # the read at exactly `until` is out
    assert page(reads, since=at(1), until=at(3)) == ([3, 2], None)
    assert page(reads, since=at(1) + timedelta(seconds=1), until=at(3) - timedelta(seconds=1)) == ([3], None)
    assert page(reads, since=at(4)) == ([], None) and page(reads, until=at(0)) == ([], None)


@pytest.mark.parametrize("offset", [timedelta(hours=2), timedelta(hours=-5, minutes=-30), timedelta(hours=14)])
def test_time_bounds_are_instants_in_any_offset(reads, offset):
    """Before: SQLite compared the stored UTC text with the bound's own wall time (+02:00 read as UTC)."""
    zone = timezone(offset)
    assert page(reads, since=at(1).astimezone(zone), until=at(3).astimezone(zone)) == ([3, 2], None)


def test_pages_continue_before_the_last_id_and_the_last_page_has_no_cursor(reads):
    assert page(reads, limit=3) == ([4, 3, 2], 2)
    assert page(reads, limit=3, before_id=2) == ([1], None)
    assert page(reads, limit=2) == ([4, 3], 3)
    assert page(reads, limit=2, before_id=3) == ([2, 1], None)  # exactly `limit` left: no further page
    assert page(reads, limit=4) == ([4, 3, 2, 1], None)
    assert page(reads, limit=1, before_id=1) == ([], None)


def test_filters_and_pages_combine(reads):
    with transaction(reads) as session:
        session.add(AccessLogRecord(at=at(2), principal="eve", role="admin", action="read_report",
                                    path="/v1/verifications/x/report", query={}))
    assert page(reads, principal="eve") == ([5], None)
    assert page(reads, action="read_verification", since=at(2), limit=1) == ([4], 4)
    assert page(reads, action="read_verification", since=at(2), limit=1, before_id=4) == ([3], None)
    assert page(reads, principal="bob", until=at(1), limit=1) == ([1], None)


def test_query_values_are_stored_redacted_with_their_names(api):
    """A client may paste a presigned URL into a filter or a token into any parameter: the log keeps every
    name, a URI filter redacted like a stored URI, closed-shape values as sent and everything else hidden."""
    params = {"source_uri": "https://u:SEC'ONE@h.example/m?sig=abc SECTWO", "submitted_by": "SECTHREE",
              "token": "SECFOUR", "policy": "SECFIVE", "artifact_sha256": SHA, "limit": "7"}
    assert call(api, Role.ADMIN, "/v1/verifications", params=params).status_code == 200
    engine = make_engine(api.url)
    with engine.connect() as connection:
        stored = [row[0] for row in connection.execute(text("SELECT query FROM access_log"))]
    engine.dispose()
    (listing,) = log(api, principal=api.names[Role.ADMIN])
    assert "SEC" not in str(stored) + str(listing)
    assert listing["query"] == {"source_uri": "https://REDACTED@h.example/m?sig=REDACTED", "submitted_by": "REDACTED",
                                "token": "REDACTED", "policy": "REDACTED", "artifact_sha256": SHA, "limit": "7"}
