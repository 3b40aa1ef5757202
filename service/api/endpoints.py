"""HTTP endpoints: thin. What a caller may do is decided in `service.verifications`, what it may read in
`service.reading`; the repository is theirs, not the endpoints'."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Path, Request, Response, status
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from service import callbacks, queue, reading, verifications
from service.api import access_log, declared
from service.api.deps import Principal, SettingsDep, admitted, bearer, caller, get_caller, principal_on, unauthenticated
from service.api.errors import ERRORS
from service.api.event_stream import MEDIA_TYPE, event_stream
from service.api.units import json_response, on_loop, one_trip
from service.auth import CANCEL, OPERATE, OWN_ONLY, READ_OWN_OR_ANY, SUBMIT, digest
from service.persistence import driver
from service.persistence.db import begin_read, factory_clock
from service.persistence.models import Verification
from service.report_render import to_html, to_markdown
from service.schemas import (
    UUID_PATTERN,
    CallbackSecretOut,
    CallbacksOut,
    EventOut,
    ListQuery,
    QueueOut,
    VerificationList,
    VerificationOut,
)

router = APIRouter(prefix="/v1", responses=ERRORS)
VerificationId = Annotated[str, Path(pattern=UUID_PATTERN, description="a verification's id (a UUID)")]
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


@router.get("/verifications", response_model=VerificationList,
            openapi_extra={"parameters": declared.query_parameters(ListQuery)})
async def list_verifications(request: Request) -> Response:
    """The auditor's query, on the event loop like the submission, its access-log row committed before the
    answer. It validates its own query (`service.api.declared`: FastAPI's resolution of its parameters cost a
    third of its CPU) after the caller is looked up. On Postgres the token's lookup, then the page and its row
    in one statement, run on one connection on the driver (`reading.logged_page_on_driver`); on SQLite the
    page is read and the row written in an async session's greenlet, which renders the JSON there too."""
    engine = request.app.state.async_engine
    if not driver.available(engine):
        principal = admitted(await get_caller(request), READ_OWN_OR_ANY)
        query = declared.query(ListQuery, request.query_params)
        return await on_loop(request, _list_page, request, principal, _filters(query, principal), query.limit,
                             query.cursor)
    if not (secret := bearer(request)):
        raise unauthenticated()  # before any connection is taken for nothing to look up
    async with driver.borrowed(engine) as connection:
        principal = admitted(await principal_on(connection, secret), READ_OWN_OR_ANY)
        query = declared.query(ListQuery, request.query_params)
        logged = access_log.entry(request, principal, "list_verifications",
                                  factory_clock(request.app.state.async_session_factory).now())
        rows, next_cursor = await reading.logged_page_on_driver(connection, _filters(query, principal),
                                                                limit=query.limit, cursor=query.cursor,
                                                                logged=logged)
    return json_response(VerificationList(items=[verifications.listed_out(row) for row in rows],
                                          next_cursor=next_cursor))


def _filters(query: ListQuery, principal: Principal) -> reading.ListFilters:
    """The query's filters; a caller that may read only its own is held to them whatever it asked."""
    return reading.ListFilters(query.artifact_sha256, query.source_uri, query.verdict, query.state,
                               principal.name if principal.role in OWN_ONLY else query.submitted_by,
                               query.since, query.until, policy_origin=query.policy_origin, policy=query.policy)


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
