"""Error responses: one body for every error, `{"detail": ..., "code": ...}`, where `code` is the stable
dotted code of the convgate error behind it (the blocker table's style) or of the HTTP refusal, so a
client branches on `code`, never on the message. A validation error never becomes a 500 (the default
handler echoes the input, and an unpaired surrogate in it cannot be encoded)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from engine.errors import ConvgateError
from service.attestations.keys import KeyFileError
from service.persistence.cursors import InvalidCursorError
from service.schemas import ErrorOut
from service.verifications import IdempotencyConflictError, PolicyRefusedError, SubmissionError

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": description} for code, description in (
        (400, "malformed request (e.g. an invalid cursor)"), (401, "missing or invalid bearer token"),
        (403, "the caller's role may not do this"), (404, "no such resource, or not the caller's"),
        (413, "request body too large"), (422, "invalid input"))}

# The status each convgate error the API lets through answers with; any other is a bug: a 500.
STATUS_OF: dict[type[ConvgateError], int] = {
    InvalidCursorError: 400, PolicyRefusedError: 403, IdempotencyConflictError: 409, SubmissionError: 422,
    KeyFileError: 503}  # a key the operator configured cannot be read: the server's to fix, retry later
# The code of a refusal the API makes itself (an HTTPException), by status.
HTTP_CODES = {400: "request.malformed", 401: "auth.unauthenticated", 403: "auth.forbidden", 404: "not_found",
              405: "request.method_not_allowed", 409: "conflict", 413: "request.too_large",
              422: "request.invalid", 429: "rate_limited", 503: "unavailable"}
VALIDATION_CODE = "request.invalid"


def body(detail: object, code: str) -> bytes:
    return json.dumps({"detail": detail, "code": code}, ensure_ascii=True, default=str).encode()


async def validation_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [{key: value for key, value in error.items() if key != "input"} for error in exc.errors()]
    return Response(body(jsonable_encoder(errors), VALIDATION_CODE), status_code=422, media_type="application/json")


async def http_refusal(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = HTTP_CODES.get(exc.status_code, f"http.{exc.status_code}")
    return Response(body(exc.detail, code), status_code=exc.status_code, headers=exc.headers,
                    media_type="application/json")


async def convgate_error(_request: Request, exc: Exception) -> Response:
    """A convgate error an endpoint let through: its own code, the status its class answers with."""
    assert isinstance(exc, ConvgateError)
    status = next((STATUS_OF[kind] for kind in type(exc).__mro__ if kind in STATUS_OF), None)
    if status is None:
        raise exc  # not a refusal of the request: the server's own failure, a 500
    return Response(body(str(exc), exc.code), status_code=status, media_type="application/json")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_refusal)
    app.add_exception_handler(ConvgateError, convgate_error)
