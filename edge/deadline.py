"""A total deadline for one exchange over the policy transport: connect, TLS, the request, the status line,
the headers and whatever body is read, together.

httpx's timeouts are per operation: a read times out only when no byte arrives for that long. A peer that
sends one byte every few seconds never trips them, and held a callback delivery (and the thread sending it)
for 90 s against a 10 s timeout. Inside `deadline(seconds)` every socket operation the transport's streams
make is given at most the time left, and one started after the deadline fails at once with the timeout
of its kind; outside one, nothing changes.

The deadline lives in a context variable read by each operation, not in the connection: a pooled
connection serves exchanges with different deadlines (or none), and each sees its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpcore

_ENDS_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("convgate_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every transport operation inside the block ends by `seconds` from now (sockets keep real time)."""
    token = _ENDS_AT.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _ENDS_AT.reset(token)


def remaining(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """The timeout an operation may use: `timeout`, cut to the time left before the deadline; `expired`
    raised when none is left."""
    ends_at = _ENDS_AT.get()
    if ends_at is None:
        return timeout
    left = ends_at - time.monotonic()
    if left <= 0:
        raise expired("the exchange's total deadline passed")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation keeps to the current deadline (see the module)."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self.stream = stream  # the socket's own stream, which this one times

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.stream.read(max_bytes, remaining(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.stream.write(buffer, remaining(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return DeadlineStream(self.stream.start_tls(ssl_context, server_hostname,
                                                     remaining(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)
