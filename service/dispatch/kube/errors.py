"""Kubernetes client errors, translated in one place and classified by behaviour, not status alone."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from worker.errors import ConvgateError

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class KubeError(ConvgateError):
    """A Kubernetes API call failed. `retryable` says whether trying again can help."""

    def __init__(self, message: str, *, status: int | None, retryable: bool) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


def translate(exc: Exception, action: str) -> KubeError:
    if isinstance(exc, ApiException):
        return KubeError(f"{action}: HTTP {exc.status} {exc.reason}", status=exc.status,
                         retryable=exc.status in RETRYABLE_STATUS)
    if isinstance(exc, Urllib3Error | TimeoutError | ConnectionError):
        return KubeError(f"{action}: {type(exc).__name__}: {exc}", status=None, retryable=True)
    raise exc


def is_already_exists(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def is_not_found(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404
