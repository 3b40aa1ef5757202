"""POST /v1/verifications, the busiest write, without FastAPI's dependency machinery.

Declared parameters cost more than the work they guard on this route: resolving the session, the principal
and the settings as dependencies (an exit stack for the session's teardown, a nested dependency per level)
was 10% of a submission's CPU and opening a second session for the token twice that
(`scripts/bench_api.py`, py-spy). So the endpoint takes the request and does, in this order, what the
declarations did:

1. the body is read (before any connection is taken: a slow upload holds none);
2. the bearer token is looked up (on Postgres on the driver, `service.persistence.driver`, on the connection
   the plain insert then uses; on SQLite in an async session of its own, closed at once): a bad token is a
   401 before the body or a header is looked at;
3. the Idempotency-Key header and the body are validated by the same pydantic types (the body read as JSON
   only under a JSON media type, FastAPI's strict content type), and refused as FastAPI refuses them
   (`service.api.declared`);
4. the submission is admitted, then stored and committed before the answer: on Postgres a plain one
   (`verifications.plain`) by its one INSERT on the driver, any other in an async session. No connection
   is held while a pool thread is waited for: a submission whose admission may block gives its connection
   back first.

The body's schema is still the API's: `openapi_extra` names SubmitRequest, which `declared.documented` adds to
the document's components.
"""

from __future__ import annotations

import email.message
import functools
from typing import Annotated

from fastapi import APIRouter, Request, Response, status
from pydantic import Field, TypeAdapter, ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service import verifications
from service.api import declared
from service.api.deps import Principal, admitted, bearer, get_caller, principal_on
from service.api.errors import ERRORS
from service.api.units import on_loop
from service.auth import AUTHOR_POLICIES, OWN_ONLY, SUBMIT
from service.config import Settings
from service.persistence import driver
from service.persistence.db import factory_clock
from service.schemas import PRINTABLE, SubmitRequest, VerificationOut

router = APIRouter(prefix="/v1", responses=ERRORS)
IDEMPOTENCY_KEY = "Idempotency-Key"
_KEY_TEXT = TypeAdapter(Annotated[str, Field(max_length=200, pattern=PRINTABLE)])
_DOCUMENTED = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": {
        "$ref": declared.SCHEMA_REF.format(model=SubmitRequest.__name__)}}}},
    "parameters": [{"name": IDEMPOTENCY_KEY, "in": "header", "required": False, "schema": {
        "anyOf": [_KEY_TEXT.json_schema(), {"type": "null"}], "title": IDEMPOTENCY_KEY}}],
}


@functools.lru_cache(maxsize=64)  # clients send a handful of spellings; parsing one was 5% of a submission's CPU
def _declared_json(content_type: str | None) -> bool:
    """Whether the body is declared JSON (application/json or application/*+json), as FastAPI's strict content
    type requires before it parses a body: a form or text/plain POST, which a browser sends cross-site without
    a preflight, is never read as JSON."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _body(raw: bytes, content_type: str | None) -> SubmitRequest:
    try:
        if _declared_json(content_type):
            return SubmitRequest.model_validate_json(raw)
        return SubmitRequest.model_validate(raw)  # bytes are not an object: refused as FastAPI refuses them
    except ValidationError as exc:
        raise declared.refused("body", exc) from exc


def _idempotency_key(request: Request) -> str | None:
    value = request.headers.get(IDEMPOTENCY_KEY)
    if value is None:
        return None
    try:
        return _KEY_TEXT.validate_python(value)
    except ValidationError as exc:
        raise declared.refused("header", exc, IDEMPOTENCY_KEY) from exc


@router.post("/verifications", status_code=status.HTTP_202_ACCEPTED, response_model=VerificationOut,
             openapi_extra=_DOCUMENTED,
             responses={200: {"model": VerificationOut, "description": "a repeat of an Idempotency-Key"},
                        409: {"model": ERRORS[400]["model"], "description": "Idempotency-Key used for another"}})
async def create_verification(request: Request) -> Response:
    """The submission, on the event loop. Admitting a body that names a host or a file may block (DNS, a
    mount): that, and only that, goes to a pool thread, with no connection held. On Postgres the token's
    lookup and, for a submission whose storing is its insert alone (`verifications.plain`) and whose
    admission does not block, that one statement run on one connection on the driver
    (`service.persistence.driver`); any other, and every one on SQLite, is stored by its ORM code in the async
    session's greenlet, which renders the answer's JSON there too (returning the model would have FastAPI
    validate it again)."""
    raw = await request.body()
    engine = request.app.state.async_engine
    if not driver.available(engine):
        principal = admitted(await get_caller(request), SUBMIT)
        idempotency_key, body = _idempotency_key(request), _body(raw, request.headers.get("content-type"))
        return await _store_on_loop(request, principal, await _prepared(request, principal, body, idempotency_key))
    if not (secret := bearer(request)):
        admitted(None, SUBMIT)  # the 401, before any connection is taken for nothing to look up
    async with driver.borrowed(engine) as connection:
        principal = admitted(await principal_on(connection, secret), SUBMIT)
        idempotency_key, body = _idempotency_key(request), _body(raw, request.headers.get("content-type"))
        prepared: verifications.Prepared | None = None  # one whose admission may block: below, connection given back
        if not verifications.may_block(body):
            prepared = await _prepared(request, principal, body, idempotency_key)
            if verifications.plain(prepared):  # committed when it returns: before the answer
                clock = factory_clock(request.app.state.async_session_factory)
                if (inserted := await verifications.insert_plain(connection, prepared, clock.now())) is not None:
                    return _answer(verifications.queued_out(inserted), created=True)
    if prepared is None:
        prepared = await _prepared(request, principal, body, idempotency_key)
    return await _store_on_loop(request, principal, prepared)


async def _prepared(request: Request, principal: Principal, body: SubmitRequest,
                    idempotency_key: str | None) -> verifications.Prepared:
    """`body` admitted (in a pool thread when that may block, `verifications.may_block`) and prepared."""
    settings: Settings = request.app.state.settings
    may_author = principal.role in AUTHOR_POLICIES  # a refusal is its error's status and code (api/errors)
    if verifications.may_block(body):
        submission = await run_in_threadpool(verifications.admit, settings, body, may_author_policies=may_author)
    else:
        submission = verifications.admit(settings, body, may_author_policies=may_author)
    return verifications.prepare(settings, principal.name, submission, idempotency_key)


async def _store_on_loop(request: Request, principal: Principal, prepared: verifications.Prepared) -> Response:
    """Committed before answering: concurrent duplicates wait on this row's unique-index lock."""
    return await on_loop(request, _store, prepared, request.app.state.settings, principal)


def _store(session: Session, prepared: verifications.Prepared, settings: Settings,
           principal: Principal) -> Response:
    verification, created = verifications.store(session, settings, prepared,
                                                may_read_all=principal.role not in OWN_ONLY)
    return _answer(verifications.to_out(session, verification), created=created)


def _answer(out: VerificationOut, *, created: bool) -> Response:
    return Response(out.model_dump_json().encode(), status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK,
                    headers={"Location": f"/v1/verifications/{out.id}"}, media_type="application/json")
