"""Opaque page cursors, made and read in one place and read strictly: anything a client made up raises
`InvalidCursorError` (the API's 400), never a query built from garbage (a cursor of `MQ==` used to
reach the database as the number 1)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime
from typing import Any

from engine.errors import ConvgateError

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MAX_CURSOR_CHARS = 256


class InvalidCursorError(ConvgateError, ValueError):
    """The cursor is not one this service issued."""

    code = "request.cursor_invalid"


def _invalid() -> InvalidCursorError:
    return InvalidCursorError("invalid cursor")


def _payload(cursor: str) -> Any:
    if not cursor or len(cursor) > MAX_CURSOR_CHARS or not cursor.isascii():
        raise _invalid()
    try:
        return json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (binascii.Error, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _invalid() from exc


def encode_verification_cursor(created_at: datetime, verification_id: str) -> str:
    """A cursor of GET /v1/verifications: [aware ISO time, verification id] of the last row shown."""
    return base64.urlsafe_b64encode(json.dumps([created_at.isoformat(), verification_id]).encode()).decode()


def decode_verification_cursor(cursor: str) -> tuple[datetime, str]:
    payload = _payload(cursor)
    if not (isinstance(payload, list) and len(payload) == 2 and all(isinstance(p, str) for p in payload)):
        raise _invalid()
    created, ident = payload
    try:
        moment = datetime.fromisoformat(created)
    except ValueError as exc:
        raise _invalid() from exc
    if moment.tzinfo is None or not UUID.fullmatch(ident):
        raise _invalid()
    return moment, ident


def encode_before_id(row_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"before": row_id}).encode()).decode()


def decode_before_id(cursor: str | None) -> int | None:
    """A cursor of GET /v1/access-log: the id to continue before."""
    if cursor is None:
        return None
    payload = _payload(cursor)
    before = payload.get("before") if isinstance(payload, dict) else None
    if type(before) is not int or not 0 < before < 1 << 63:
        raise _invalid()
    return before
