"""Completion callbacks: what is checked at submission, what is sent, how it is signed, when it is retried.

A submission may name a `callback_url`. It passes the artifacts' own URI policy (`edge.uri_policy`):
https only, to public addresses, metadata hosts refused; plain http only to an origin the operator lists
in `callback_http_origins`. The connection is made by the same policy transport as every fetch, so the
address is checked again when the callback is sent, and redirects are not followed.

On a terminal state the service's background loop (`service.callbacks_loop`) POSTs

    {"delivery": <id>, "timestamp": <unix seconds>, "verification": <the GET /v1/verifications/{id} body>}

with `X-Convgate-Signature: sha256=<hex HMAC-SHA256 of the body with the submitter's secret>`,
`X-Convgate-Delivery` (one id per verification, the same on every retry: receivers deduplicate on it)
and `X-Convgate-Timestamp` (also inside the signed body, so a receiver can refuse old replays). A 2xx
answer delivers it; anything else (another status, a connection error, a refused address) is retried
after `callback_backoff_seconds`, doubling, at most `callback_max_backoff_seconds`, for at most
`callback_attempts` attempts. Delivery is at least once: a process that dies between sending and
recording sends again after the delivery's lease.

The secret is per submitter (the API token's name): `POST /v1/callback-secret` makes one and shows it
once; calling it again replaces it (deliveries after that are signed with the new one). The service
keeps it in plain text in the database, since it must sign with it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from edge.uri_policy import UriPolicy
from engine.errors import ConvgateError
from service.config import Settings
from service.persistence import callbacks as callback_store
from service.persistence.callbacks import CallbackState, secret_for
from service.persistence.clock import as_utc

DELIVERY_NAMESPACE = uuid.UUID("6f1c1f0e-4b7a-5d2e-9a51-0c6e8a1d2b3f")
SECRET_PREFIX = "cgcb_"


def http_origins(settings: Settings) -> frozenset[str]:
    return frozenset(origin.lower().rstrip("/") for origin in settings.callback_http_origins)


def check_callback_url(checker: UriPolicy, settings: Settings, url: str) -> None:
    """Raises UriRefusedError unless the URI policy admits `url` as a callback (resolved and checked now;
    the transport checks the address again when it sends)."""
    checker.addresses(checker.check_url(url, allowed_origins=http_origins(settings)))


class CallbackRefusedError(ConvgateError, ValueError):
    """The callback cannot be accepted: no secret to sign it with yet (a refused URL is refused at
    admission, `service.verifications.admit`): HTTP 422."""

    code = "callback.refused"


def submission_columns(session: Session, submitter: str, url: str | None) -> dict[str, str]:
    """The verification's callback columns for a submission whose callback URL was admitted
    (`service.verifications.admit`); none without a callback."""
    if url is None:
        return {}
    if secret_for(session, submitter) is None:
        raise CallbackRefusedError("callback_url: no callback secret to sign with yet; "
                                   "create one with POST /v1/callback-secret first")
    return {"callback_url": url, "callback_state": CallbackState.PENDING}


def replace_secret(session: Session, submitter: str) -> tuple[str, datetime]:
    """A new HMAC key for `submitter`'s callbacks, replacing the previous one; shown once, when made."""
    row = callback_store.replace_secret(session, submitter, new_secret())
    return row.secret, as_utc(row.created_at)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def delivery_id(verification_id: str) -> str:
    """One id per verification's callback, repeated on every retry."""
    return str(uuid.uuid5(DELIVERY_NAMESPACE, verification_id))


def signed_request(secret: str, summary: dict[str, Any], delivery: str, timestamp: int) -> tuple[bytes, dict[str, str]]:
    """The body and the headers of one delivery."""
    body = json.dumps({"delivery": delivery, "timestamp": timestamp, "verification": summary}, sort_keys=True,
                      separators=(",", ":")).encode()
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {"Content-Type": "application/json", "User-Agent": "convgate-callbacks",
                  "X-Convgate-Signature": f"sha256={signature}", "X-Convgate-Delivery": delivery,
                  "X-Convgate-Timestamp": str(timestamp)}


def retry_delay(settings: Settings, attempt: int) -> timedelta | None:
    """How long after failed attempt `attempt` (1-based) the next one runs; None when none is left."""
    if attempt >= settings.callback_attempts:
        return None
    seconds = settings.callback_backoff_seconds * 2 ** (attempt - 1)
    return timedelta(seconds=min(seconds, settings.callback_max_backoff_seconds))
