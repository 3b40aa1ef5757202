"""Verification states and the only transitions allowed between them."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    QUEUED = "queued"  # stored, waiting for a dispatcher
    DISPATCHED = "dispatched"  # handed to a worker (process or Job) that has not started yet
    RUNNING = "running"  # a worker claimed an attempt and is heartbeating
    COMPLETED = "completed"  # a verdict (GO or NO-GO) is stored
    FAILED = "failed"  # no verdict: attempts exhausted or not runnable
    CANCELLED = "cancelled"


TERMINAL = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED})
TRANSITIONS: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.DISPATCHED, State.RUNNING, State.CANCELLED, State.FAILED}),
    State.DISPATCHED: frozenset({State.RUNNING, State.QUEUED, State.FAILED, State.CANCELLED}),
    State.RUNNING: frozenset({State.RUNNING, State.COMPLETED, State.QUEUED, State.FAILED, State.CANCELLED}),
    State.COMPLETED: frozenset(),
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
}


class IllegalTransitionError(ValueError):
    """A state change the lifecycle does not allow (e.g. anything after a verdict)."""


def check_transition(current: str, target: State) -> None:
    if target not in TRANSITIONS[State(current)]:
        raise IllegalTransitionError(f"{current} -> {target} is not allowed")
