"""The one place the service reads the time for what it stores and compares (leases, retries, event
times): the clock of the session's factory. Production's factories use the system clock; a test gives
its factory a clock it moves by hand, instead of sleeping until a lease runs out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, overload

from sqlalchemy.orm import Session

CLOCK = "convgate_clock"  # the key in a session's `info` (set by its factory, `db.session_factory`)


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that stands still until moved: for tests of leases, backoffs and grace periods."""

    def __init__(self, start: datetime | None = None) -> None:
        self.moment = start or datetime.now(UTC)

    def now(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


def now(session: Session) -> datetime:
    """The time by the clock `session`'s factory was given (the system's by default)."""
    clock: Clock = session.info.get(CLOCK, SYSTEM_CLOCK)
    return clock.now()


@overload
def as_utc(moment: datetime) -> datetime: ...
@overload
def as_utc(moment: None) -> None: ...
def as_utc(moment: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything here is UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def in_utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC time (a naive one is UTC already, as `as_utc` reads it); OverflowError when
    its offset carries it outside year 1..9999 in UTC."""
    return as_utc(moment).astimezone(UTC)
