"""GET /v1/verdicts/export: the export of `service.exports` streamed as the response, its status and
headers sent before the first row is read."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from service.api import access_log
from service.api.deps import Principal, SettingsDep, caller
from service.api.errors import ERRORS
from service.api.units import one_trip
from service.attestations import KeyFileError, active_signing_key
from service.auth import OWN_ONLY, READ_OWN_OR_ANY
from service.config import Settings
from service.exports import MEDIA_TYPES, Format, verdict_chunks
from service.lifecycle import State
from service.reading import ListFilters
from service.schemas import PRINTABLE, SHA256, Moment

router = APIRouter(prefix="/v1", responses=ERRORS)
EXPORT_TYPES = {"application/x-ndjson": {"schema": {"type": "string"}}, "text/csv": {"schema": {"type": "string"}}}


async def export_filters(
    artifact_sha256: Annotated[str | None, Query(pattern=SHA256)] = None,
    source_uri: Annotated[str | None, Query(max_length=4096, pattern=PRINTABLE)] = None,
    verdict: Literal["GO", "NO-GO"] | None = None,
    state: State | None = None,
    submitted_by: Annotated[str | None, Query(max_length=128, pattern=PRINTABLE)] = None,
    policy_origin: Literal["configured", "inline", "unrecorded"] | None = None,
    policy: Annotated[str | None, Query(max_length=63, pattern=PRINTABLE,
                                        description="the name of a configured policy")] = None,
    since: Moment | None = None,
    until: Moment | None = None,
) -> ListFilters:
    """The filters of GET /v1/verifications (without its page size and cursor)."""
    return ListFilters(artifact_sha256, source_uri, verdict, state, submitted_by, since, until,
                       policy_origin=policy_origin, policy=policy)


@router.get("/verdicts/export", response_class=StreamingResponse, response_model=None,
            responses={200: {"description": "every matching verdict, newest first: JSON Lines, or CSV with a "
                             "header row (format=csv or Accept: text/csv). A stored row that cannot be exported "
                             "is a marker in its place ({\"id\", \"skipped\"}; in CSV the reason in the verdict "
                             "column), and a last line counts them ({\"skipped_rows\": n})",
                             "content": EXPORT_TYPES},
                       503: {**ERRORS[400], "description": "attestation=true, and the signing key cannot be loaded"}})
async def export_verdicts(
    request: Request, settings: SettingsDep, principal: Annotated[Principal, caller(READ_OWN_OR_ANY)],
    filters: Annotated[ListFilters, Depends(export_filters)],
    format: Format | None = None,
    attestation: Annotated[bool, Query(description="add each verdict's signed DSSE envelope (`attestation`) and its "
                                                   "signed SLSA verification summary (`vsa`)")] = False,
) -> Response:
    """Streamed: the status and headers go out before the first row is read. Submitters export only
    their own verdicts; the export is one entry in the access log."""
    chosen = format or ("csv" if "text/csv" in request.headers.get("accept", "") else "jsonl")
    return await one_trip(request, lambda session: stream_export(
        request, session, settings, principal, filters, chosen, attestation))


def stream_export(request: Request, session: Session, settings: Settings, principal: Principal,
                  filters: ListFilters, fmt: Format, with_attestation: bool) -> StreamingResponse:
    """Log the export in the caller's request unit, which commits before the stream starts: the rows are read
    in short transactions of their own, and the request holds no connection (on SQLite, no write lock) while
    the download runs."""
    if principal.role in OWN_ONLY:
        filters = replace(filters, submitted_by=principal.name)
    if with_attestation:
        try:  # now, while a status can still say so, not after the first rows went out
            active_signing_key(settings)
        except KeyFileError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"attestation signing key: {exc}") from exc
    access_log.record(session, request, principal, "export_verdicts")
    chunks = verdict_chunks(request.app.state.session_factory, settings, filters, fmt,
                            with_attestation=with_attestation)
    extension = "csv" if fmt == "csv" else "jsonl"
    return StreamingResponse(chunks, media_type=MEDIA_TYPES[fmt],
                             headers={"Content-Disposition": f'attachment; filename="verdicts.{extension}"'})
