"""The access log: every read of a verification, its report or events, and every list query is
recorded with who made it (token name and role), when and by which path, in the request's own unit
of work, so a read that failed is not recorded as done. Auditors and admins read it back."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session

from service.api.deps import Principal, caller
from service.api.errors import ERRORS
from service.api.units import json_response, one_trip
from service.auth import AUDIT
from service.persistence import access_log
from service.persistence.clock import as_utc, now
from service.persistence.cursors import decode_before_id, encode_before_id
from service.persistence.db import writing
from service.schemas import PRINTABLE, UUID_PATTERN, AccessLogEntry, AccessLogPage, Moment

Action = Literal["read_verification", "read_report", "read_events", "list_verifications", "read_access_log",
                 "export_verdicts", "read_attestation", "read_model_signature", "read_callbacks"]
router = APIRouter(prefix="/v1", responses=ERRORS)


def record(session: Session, request: Request, principal: Principal, action: Action,
           verification_id: str | None = None) -> None:
    """Log one read, in the request's unit after what it read (`writing`: on SQLite the unit's read ends
    and this row takes the write lock until the unit commits, in the same thread)."""
    writing(session)
    access_log.record_access(session, entry(request, principal, action, now(session), verification_id))


def entry(request: Request, principal: Principal, action: Action, at: datetime,
          verification_id: str | None = None) -> dict[str, Any]:
    """One read's row, for `record` or for a statement that writes it itself (`reading.logged_page_on_driver`):
    `access_log.entry` keeps only the query values that hold no secret (a source_uri filter may carry a
    presigned URL, any other parameter a pasted token)."""
    return access_log.entry(at=at, principal=principal.name, role=principal.role.value, action=action,
                            path=request.url.path, query=dict(request.query_params.items()),
                            verification_id=verification_id)


@router.get("/access-log", response_model=AccessLogPage)
async def read_access_log(
    request: Request, principal: Annotated[Principal, caller(AUDIT)],
    principal_name: Annotated[str | None, Query(alias="principal", max_length=128, pattern=PRINTABLE)] = None,
    verification_id: Annotated[str | None, Query(pattern=UUID_PATTERN)] = None,
    action: Action | None = None,
    since: Moment | None = None,
    until: Moment | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=256)] = None,
) -> Response:
    """Newest first. Reading the log is itself logged."""
    filters = access_log.AccessFilters(principal_name, verification_id, action, since, until)

    def read(session: Session) -> Response:
        rows, before = access_log.access_log(session, filters, limit=limit, before_id=decode_before_id(cursor))
        items = [AccessLogEntry(id=row.id, at=as_utc(row.at), principal=row.principal, role=row.role,
                                action=row.action, verification_id=row.verification_id, path=row.path,
                                query=row.query) for row in rows]
        record(session, request, principal, "read_access_log")
        return json_response(AccessLogPage(items=items, next_cursor=None if before is None
                                           else encode_before_id(before)))
    return await one_trip(request, read)
