"""Kubernetes client errors, translated in one place and classified by behaviour, not status alone."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from worker.errors import ConvgateError

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class KubeError(ConvgateError):
    """A Kubernetes API call failed. `retryable` says whether trying again can help; `cluster_status`
    is the short form operators see next to the verification."""

    def __init__(self, message: str, *, status: int | None, retryable: bool) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.cluster_status = f"API error: HTTP {status}" if status is not None else "API server unreachable"


def _status_message(exc: ApiException) -> str | None:
    """The `message` of the Status body the API server sent, e.g. which admission webhook failed."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return None
    return body.get("message") if isinstance(body, dict) else None


def translate(exc: Exception, action: str) -> KubeError:
    if isinstance(exc, ApiException):
        message = _status_message(exc)
        error = KubeError(f"{action}: HTTP {exc.status} {exc.reason}" + (f": {message}" if message else ""),
                          status=exc.status, retryable=exc.status in RETRYABLE_STATUS)
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
