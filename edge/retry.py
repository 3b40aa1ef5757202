"""Bounded exponential backoff for transient fetch failures (a server's `Retry-After` is honoured
when it fits the bound; a longer one is given up on at once: the dispatcher retries much later)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from edge.errors import TransientFetchError

T = TypeVar("T")


class RetryLaterError(TransientFetchError):
    """Transient, with the delay the server asked for (`Retry-After`), when it gave one."""

    code = "fetch.retry_later"

    def __init__(self, why: str, retry_after: float | None = None) -> None:
        super().__init__(why)
        self.retry_after = retry_after


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    attempts: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def delay(self, failures: int, retry_after: float | None) -> float | None:
        """Seconds to wait after the `failures`-th failure, or None to stop retrying."""
        if failures >= self.attempts:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_backoff_s else None
        return min(self.backoff_s * 2 ** (failures - 1), self.max_backoff_s)

    def run(self, call: Callable[[], T]) -> T:
        """`call()`, retried while it raises RetryLaterError and the bound allows."""
        for failures in itertools.count(1):
            try:
                return call()
            except RetryLaterError as exc:
                wait = self.delay(failures, exc.retry_after)
                if wait is None:
                    raise TransientFetchError(f"{exc.why} (gave up after {failures} tries)") from exc
                self.sleep(wait)
        raise AssertionError("unreachable: itertools.count never ends")


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds (an HTTP date is treated as absent: the bounded backoff applies)."""
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None
