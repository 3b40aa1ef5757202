"""Kubernetes client errors, translated in one place and classified by behaviour, not status alone.

Three behaviours (cf. Kueue's `IsUnretryableError`):
- transient (`retryable`): 408, 429, 5xx, timeouts and connection errors; trying again can help.
- refused (`refused`): the API server looked at this Job and said no, and will say it again: 400
  (an admission webhook denied it), 403 (a quota, RBAC, pod security), 422 (an invalid spec). The
  dispatcher tries a bounded number of times, then fails the verification with the server's reason.
- anything else (e.g. 401, 404): neither; the verification goes back to the queue as before.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from service.dispatch.base import LaunchError

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
REFUSED_STATUS = frozenset({400, 403, 422})


class KubeError(LaunchError):
    """A Kubernetes API call failed. `retryable` says whether trying again can help, `refused` that the
    API server refused this object for good; `status_reason` is the API server's typed reason (its
    Status `reason`: Forbidden, Invalid, BadRequest, ...); `cluster_status` is the short form
    operators see next to the verification."""

    code = "kubernetes.api_error"

    cluster_status: str  # always set, by status

    def __init__(self, message: str, *, status: int | None, retryable: bool, status_reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.refused = status in REFUSED_STATUS
        self.status_reason = status_reason or _phrase(status)
        if self.refused:
            self.cluster_status = f"job refused: {self.status_reason}"
        else:
            self.cluster_status = f"API error: HTTP {status}" if status is not None else "API server unreachable"


def _phrase(status: int | None) -> str | None:
    try:
        return HTTPStatus(status).phrase.replace(" ", "") if status is not None else None
    except ValueError:
        return None


def _status_body(exc: ApiException) -> dict[str, Any]:
    """The Status body the API server sent (its `message` says e.g. which quota or webhook refused)."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def translate(exc: Exception, action: str) -> KubeError:
    if isinstance(exc, ApiException):
        body = _status_body(exc)
        message = body.get("message") if isinstance(body.get("message"), str) else None
        reason = body.get("reason") if isinstance(body.get("reason"), str) and body.get("reason") else None
        error = KubeError(f"{action}: HTTP {exc.status} {exc.reason}" + (f": {message}" if message else ""),
                          status=exc.status, retryable=exc.status in RETRYABLE_STATUS, status_reason=reason)
        if message and "failed calling webhook" in message:
            webhook = "Kueue's admission webhook" if "kueue" in message else "an admission webhook"
            error.cluster_status = f"job not created: {webhook} is unavailable"
        return error
    if isinstance(exc, Urllib3Error | TimeoutError | ConnectionError):
        return KubeError(f"{action}: {type(exc).__name__}: {exc}", status=None, retryable=True)
    raise exc


def is_already_exists(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def is_not_found(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404
