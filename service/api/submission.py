"""POST /v1/verifications, the busiest write, without FastAPI's dependency machinery.

Declared parameters cost more than the work they guard on this route: resolving the session, the principal
and the settings as dependencies (an exit stack for the session's teardown, a nested dependency per level)
was 10% of a submission's CPU and opening a second session for the token twice that
(`scripts/bench_api.py`, py-spy). So the endpoint takes the request and does, in this order, what the
declarations did:

1. the body is read (before any connection is taken: a slow upload holds none), and a request without a
   bearer token is a 401;
2. the Idempotency-Key header and the body are validated by the same pydantic types (the body read as JSON
   only under a JSON media type, FastAPI's strict content type), and refused as FastAPI refuses them
   (`service.api.declared`), but only once the token has been looked up: a bad token is a 401 first;
3. the submission is admitted and stored, committed before the answer. On Postgres a plain one
   (`verifications.plain`) that any role's caller would be admitted with is ONE statement on the driver
   (`service.persistence.driver`), which looks the token up, checks its role and writes the row as its
   holder's (`verifications.insert_plain_by_token`): one round trip where the token's own lookup was a
   second. Any other has its token looked up first and is stored in an async session; no connection is held
   while a pool thread is waited for (an admission that may block gives its connection back first).

The body's schema is still the API's: `openapi_extra` names SubmitRequest, which `declared.documented` adds to
the document's components.
"""

from __future__ import annotations

import email.message
import functools
from typing import Annotated

from fastapi import APIRouter, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import Field, TypeAdapter, ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from engine.errors import ConvgateError
from engine.policy import Policy
from service import verifications
from service.api import declared
from service.api.deps import Principal, admitted, bearer, get_caller, principal_on, unauthenticated
from service.api.errors import ERRORS
from service.api.units import on_loop
from service.auth import AUTHOR_POLICIES, OWN_ONLY, SUBMIT, Role, digest
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
    mount): that, and only that, goes to a pool thread, with no connection held. On Postgres a submission
    whose storing is its insert alone (`verifications.plain`) and whose admission does not depend on the
    caller's role is one statement on the driver (`service.persistence.driver`) that looks the token up and
    writes the row as its holder's; a refusal of the body waits for the token's lookup, so a bad token is
    still a 401 first. Any other, and every one on SQLite, has its token looked up first and is stored by
    its ORM code in the async session's greenlet, which renders the answer's JSON there too (returning the
    model would have FastAPI validate it again)."""
    raw = await request.body()
    engine = request.app.state.async_engine
    if not driver.available(engine):
        principal = admitted(await get_caller(request), SUBMIT)
        idempotency_key, body = _idempotency_key(request), _body(raw, request.headers.get("content-type"))
        return await _store_on_loop(request, principal, await _prepared(request, principal, body, idempotency_key))
    if not (secret := bearer(request)):
        raise unauthenticated()  # before any connection is taken for nothing to look up
    settings: Settings = request.app.state.settings
    async with driver.borrowed(engine) as connection:
        try:
            idempotency_key, body = _idempotency_key(request), _body(raw, request.headers.get("content-type"))
            submission = verifications.admit(settings, body) if _admitted_as_anyone(body) else None
        except (RequestValidationError, ConvgateError):
            admitted(await principal_on(connection, secret), SUBMIT)  # a bad token's 401 or 403 comes first
            raise
        prepared = None if submission is None else verifications.prepare(settings, verifications.BY_TOKEN,
                                                                          submission, idempotency_key)
        if prepared is not None and verifications.plain(prepared):  # committed when it returns: before the answer
            clock = factory_clock(request.app.state.async_session_factory)
            found = await verifications.insert_plain_by_token(connection, prepared, digest(secret), SUBMIT,
                                                              clock.now())
            principal = admitted(None if found is None else Principal(found.name, Role(found.role)), SUBMIT)
            if found is not None and found.row is not None:
                return _answer(verifications.queued_out(found.row), created=True)
        else:
            principal = admitted(await principal_on(connection, secret), SUBMIT)
    # A used key (200 or 409), or a submission that reads first or is admitted by its role or in a pool thread
    if prepared is None:
        return await _store_on_loop(request, principal, await _prepared(request, principal, body, idempotency_key))
    return await _store_on_loop(request, principal, prepared.by(principal.name))


def _admitted_as_anyone(body: SubmitRequest) -> bool:
    """Whether `body` is admitted on the loop whatever the caller's role: no admission that may block (those go
    to a pool thread, with no connection held) and no inline policy (whose author's role decides)."""
    return not verifications.may_block(body) and not isinstance(body.policy, Policy)


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
