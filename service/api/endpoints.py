"""HTTP endpoints: thin. What a caller may do is decided in `service.verifications`, what it may read in
`service.reading`; the repository is theirs, not the endpoints'."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request, Response, status
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from service import callbacks, queue, reading, verifications
from service.api import access_log
from service.api.deps import AsyncSessionDep, Principal, SettingsDep, bearer, caller, require_on_loop
from service.api.errors import ERRORS
from service.api.event_stream import MEDIA_TYPE, event_stream
from service.api.units import json_response, one_trip
from service.auth import CANCEL, OPERATE, OWN_ONLY, READ_OWN_OR_ANY, SUBMIT, digest
from service.lifecycle import State
from service.persistence.db import begin_read
from service.persistence.models import Verification
from service.report_render import to_html, to_markdown
from service.schemas import (
    PRINTABLE,
    SHA256,
    UUID_PATTERN,
    CallbackSecretOut,
    CallbacksOut,
    EventOut,
    Moment,
    QueueOut,
    VerificationList,
    VerificationOut,
)

router = APIRouter(prefix="/v1", responses=ERRORS)
VerificationId = Annotated[str, Path(pattern=UUID_PATTERN, description="a verification's id (a UUID)")]
FilterText = Annotated[str | None, Query(max_length=4096, pattern=PRINTABLE)]
STREAM_RETRY_SECONDS = 5
REPORT_TYPES = {"application/json": {"schema": {"type": "object"}}, "text/markdown": {"schema": {"type": "string"}},
                "text/html": {"schema": {"type": "string"}}}


def _visible(session: Session, verification_id: str, principal: Principal) -> Verification:
    verification = reading.visible(session, verification_id,
                                   only_of=principal.name if principal.role in OWN_ONLY else None)
    if verification is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such verification")
    return verification


@router.get("/verifications/{verification_id}", response_model=VerificationOut)
async def read_verification(verification_id: VerificationId, request: Request,
                            principal: Annotated[Principal, caller(READ_OWN_OR_ANY)]) -> Response:
    def read(session: Session) -> Response:
        verification = _visible(session, verification_id, principal)
        answer = json_response(verifications.to_out(session, verification))
        access_log.record(session, request, principal, "read_verification", verification.id)
        return answer
    return await one_trip(request, read)


@router.get("/verifications", response_model=VerificationList)
async def list_verifications(
    request: Request, session: AsyncSessionDep, principal: Annotated[Principal, require_on_loop(READ_OWN_OR_ANY)],
    artifact_sha256: Annotated[str | None, Query(pattern=SHA256)] = None,
    source_uri: FilterText = None,
    verdict: Literal["GO", "NO-GO"] | None = None,
    state: State | None = None,
    submitted_by: Annotated[str | None, Query(max_length=128, pattern=PRINTABLE)] = None,
    policy_origin: Annotated[Literal["configured", "inline", "unrecorded"] | None, Query(
        description="configured: held to a policy the operator configured; inline: to a caller's own")] = None,
    policy: Annotated[str | None, Query(max_length=63, pattern=PRINTABLE,
                                        description="the name of a configured policy")] = None,
    since: Moment | None = None,
    until: Moment | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=256)] = None,
) -> Response:
    """The auditor's query, on the event loop like the submission: the page read, its access-log row and
    the JSON rendered in the async session's greenlet (returning the model would have FastAPI validate every
    item again), the access-log row committed before the answer."""
    if principal.role in OWN_ONLY:
        submitted_by = principal.name
    filters = reading.ListFilters(artifact_sha256, source_uri, verdict, state, submitted_by, since, until,
                                     policy_origin=policy_origin, policy=policy)
    page = await session.run_sync(_list_page, request, principal, filters, limit, cursor)
    await session.commit()
    return page


def _list_page(session: Session, request: Request, principal: Principal, filters: reading.ListFilters,
               limit: int, cursor: str | None) -> Response:
    begin_read(session)
    rows, next_cursor = reading.page(session, filters, limit=limit, cursor=cursor)
    items = [verifications.to_out(session, row, with_blockers=False) for row in rows]
    access_log.record(session, request, principal, "list_verifications")
    return json_response(VerificationList(items=items, next_cursor=next_cursor))


@router.get("/verifications/{verification_id}/report", response_model=None,
            responses={200: {"description": "the report: JSON, or by Accept text/markdown or text/html",
                             "content": REPORT_TYPES}})
async def read_report(verification_id: VerificationId, request: Request,
                      principal: Annotated[Principal, caller(READ_OWN_OR_ANY)]) -> Response:
    accept = request.headers.get("accept", "application/json")

    def read(session: Session) -> Response:
        verification = _visible(session, verification_id, principal)
        verdict = reading.verdict_of(session, verification)
        if verdict is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no verdict yet (state {verification.state})")
        origin = verification.policy_origin
        if "text/markdown" in accept:
            answer: Response = PlainTextResponse(to_markdown(verification.id, verdict.report, origin),
                                                 media_type="text/markdown")
        elif "text/html" in accept:
            answer = HTMLResponse(to_html(verification.id, verdict.report, origin))
        else:
            answer = JSONResponse(reading.served_report(verification, verdict.report))
        access_log.record(session, request, principal, "read_report", verification.id)
        return answer
    return await one_trip(request, read)


EVENTS_JSON = TypeAdapter(list[EventOut])
EVENT_TYPES: dict[int | str, dict[str, Any]] = {200: {
    "description": "the events as JSON, or with Accept: text/event-stream as server-sent events (ending after the "
                   "terminal state or when the token is revoked; Last-Event-ID resumes)",
    "content": {MEDIA_TYPE: {"schema": {"type": "string"}}}},
    429: {**ERRORS[400], "description": "too many event streams open (per caller, or on this server)"}}


@router.get("/verifications/{verification_id}/events", response_model=list[EventOut], responses=EVENT_TYPES)
async def read_events(verification_id: VerificationId, request: Request, settings: SettingsDep,
                      principal: Annotated[Principal, caller(READ_OWN_OR_ANY)],
                      last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=0, le=2**62)] = None
                      ) -> Response:
    streamed = MEDIA_TYPE in request.headers.get("accept", "")

    def read(session: Session) -> Response:
        _visible(session, verification_id, principal)
        events = None if streamed else reading.events_of(session, verification_id)
        access_log.record(session, request, principal, "read_events", verification_id)
        if events is not None:
            return Response(EVENTS_JSON.dump_json(events), media_type="application/json")
        session.commit()  # before a slot is taken: a commit that fails leaves none taken
        slots = request.app.state.stream_slots
        if not slots.take(principal.name):
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, f"too many open event streams (at most "
                                f"{slots.per_principal} each, {slots.total} in all): poll the JSON form, or retry",
                                headers={"Retry-After": str(STREAM_RETRY_SECONDS)})
        # the stream holds no transaction: each poll is a read of its own
        return event_stream(request.app.state.session_factory, verification_id, last_event_id or 0,
                            settings.poll_seconds, token_sha256=digest(bearer(request) or ""),
                            done=lambda: slots.give_back(principal.name), stopping=request.app.state.stopping)
    return await one_trip(request, read)


@router.get("/verifications/{verification_id}/callbacks", response_model=CallbacksOut)
async def read_callbacks(verification_id: VerificationId, request: Request,
                         principal: Annotated[Principal, caller(READ_OWN_OR_ANY)]) -> Response:
    """The completion callback (URL redacted) and every delivery attempt so far."""
    def read(session: Session) -> Response:
        verification = _visible(session, verification_id, principal)
        answer = json_response(reading.callbacks_of(session, verification))
        access_log.record(session, request, principal, "read_callbacks", verification.id)
        return answer
    return await one_trip(request, read)


@router.post("/callback-secret", status_code=status.HTTP_201_CREATED, response_model=CallbackSecretOut)
async def create_callback_secret(request: Request, principal: Annotated[Principal, caller(SUBMIT)]) -> Response:
    """A new HMAC key for this submitter's callbacks, shown only now; it replaces the previous one."""
    def replace(session: Session) -> Response:
        secret, created_at = callbacks.replace_secret(session, principal.name)
        return json_response(CallbackSecretOut(secret=secret, created_at=created_at), status.HTTP_201_CREATED,
                             {"Cache-Control": "no-store"})
    return await one_trip(request, replace)


@router.post("/verifications/{verification_id}/cancel", response_model=VerificationOut)
async def cancel_verification(verification_id: VerificationId, request: Request,
                              principal: Annotated[Principal, caller(CANCEL)]) -> Response:
    def cancel(session: Session) -> Response:
        verification = _visible(session, verification_id, principal)
        return json_response(verifications.to_out(session, verifications.cancel(session, verification,
                                                                                principal.name)))
    return await one_trip(request, cancel)


@router.get("/queue", response_model=QueueOut)
async def read_queue(request: Request, settings: SettingsDep,
                     _principal: Annotated[Principal, caller(OPERATE)]) -> Response:
    return await one_trip(request, lambda session: json_response(queue.snapshot(session, settings)))
