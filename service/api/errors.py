"""Error responses: one documented body for every 4xx, and a validation error that never becomes a
500 (the default handler echoes the input, and an unpaired surrogate in it cannot be encoded)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from service.persistence.cursors import InvalidCursorError
from service.schemas import ErrorOut

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": description} for code, description in (
        (400, "malformed request (e.g. an invalid cursor)"), (401, "missing or invalid bearer token"),
        (403, "the caller's role may not do this"), (404, "no such resource, or not the caller's"),
        (413, "request body too large"), (422, "invalid input"))}


async def validation_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [{key: value for key, value in error.items() if key != "input"} for error in exc.errors()]
    body = json.dumps({"detail": jsonable_encoder(errors)}, ensure_ascii=True, default=str)
    return Response(body, status_code=422, media_type="application/json")


async def invalid_cursor(_request: Request, exc: Exception) -> Response:
    return Response(json.dumps({"detail": str(exc)}), status_code=400, media_type="application/json")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(InvalidCursorError, invalid_cursor)
