"""The verification lifecycle: its states, every transition allowed between them and the guards each
one needs, in one table. The repository turns a row of this table into one conditional UPDATE
(``WHERE id = ? AND state = <read> AND <guards>``) whose row count says whether the caller won, plus
the transition's event; nothing else writes a verification's state.

Fences, as Kueue fences status writes with resourceVersion:

- ``attempt`` numbers every claim: the dispatcher's CLAIM sets ``attempt := attempt + 1`` (and
  resets the heartbeat, so a retried verification is not stale the moment it is dispatched) and
  launches the worker *for that number*. START succeeds only from DISPATCHED with exactly that
  number, so a late pod of an older attempt gets nothing, and two starts of one attempt have one
  winner. Numbers are never given back (UNDISPATCH keeps it): a Job that was created after all
  can only start an attempt nobody will dispatch again.
- ``worker`` names the process that started the attempt. Heartbeats, the verdict and the worker's
  own ending are fenced by attempt *and* worker, so two pods of the same attempt cannot both write.
- A Kueue eviction of a running attempt (the dispatcher sees the Workload evicted) puts it back to
  DISPATCHED with the same attempt number and no failure counted (EVICT); the Job's next pod then
  starts that attempt afresh, and the evicted pod's writes no longer match (state and worker).
- A pod disrupted without a Kueue eviction (the Eviction API, a node drain) is replaced by its Job:
  the new pod has the same attempt and a new name (``<job>-<random suffix>``) and finds the attempt
  RUNNING. It takes the attempt over (TAKEOVER): same attempt, a *different* worker, the one it
  replaces named in the UPDATE, no failure counted, an event. The replaced pod's writes then miss
  (worker fence). A pod of another attempt cannot take over (attempt fence), and the Job's
  podFailurePolicy makes the controller create the replacement only once the old pod has stopped.
- ``failed_attempts`` (not ``attempt``) is what ``max_attempts`` limits: CLAIM requires
  ``failed_attempts < max_attempts``, and an attempt that ends without a verdict either retries
  (``failed_attempts + 1 < max_attempts``) or fails for good. Evictions and refused creates are
  not failures.
- Terminal states have no way out. Cancel, the verdict and the ending of an attempt are all
  conditional writes on the state: whichever commits first wins and the others change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from engine.errors import ConvgateError


class State(StrEnum):
    QUEUED = "queued"  # stored, waiting for a dispatcher
    DISPATCHED = "dispatched"  # an attempt number is assigned; its worker has not started yet
    RUNNING = "running"  # the attempt's worker started and is heartbeating
    COMPLETED = "completed"  # a verdict (GO or NO-GO) is stored
    FAILED = "failed"  # no verdict: attempts exhausted or not runnable
    CANCELLED = "cancelled"


TERMINAL = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED})
ACTIVE = frozenset({State.QUEUED, State.DISPATCHED, State.RUNNING})
IN_FLIGHT = frozenset({State.DISPATCHED, State.RUNNING})


class Reason(StrEnum):
    """Why a verification is where it is: stored beside the free-text message, for operators."""

    SUBMITTED = "submitted"
    DISPATCHED = "dispatched"
    STARTED = "started"
    VERDICT = "verdict"
    WORKER_ERROR = "worker_error"  # the worker caught an error and ended its own attempt
    WORKER_EXITED = "worker_exited"  # the worker process or Job ended without recording an outcome
    HEARTBEAT_LOST = "heartbeat_lost"  # no heartbeat for a lease
    DISPATCHER_RESTARTED = "dispatcher_restarted"  # the dispatcher that ran it is gone, and so is its worker
    JOB_LOST = "job_lost"  # the attempt's Job was deleted outside convgate, or never appeared
    DISPATCH_FAILED = "dispatch_failed"  # the worker could not be started (e.g. the API server refused)
    DISPATCH_REFUSED = "dispatch_refused"  # ... and never will be: refused for good, repeatedly
    EVICTED = "evicted"  # Kueue evicted the running attempt; it waits for re-admission
    TAKEN_OVER = "taken_over"  # the Job replaced a disrupted pod; the new pod runs the same attempt
    SOURCE_UNAVAILABLE = "source_unavailable"  # no verdict is possible: not retried
    CANCELLED = "cancelled"


class Guard(StrEnum):
    """A condition a transition's UPDATE adds to its WHERE clause."""

    ATTEMPT = "attempt"  # the caller's attempt number is the current one
    WORKER = "worker"  # the caller is the worker that started the attempt
    REPLACES = "replaces"  # the attempt's worker is the one the caller replaces, and is not the caller
    ATTEMPTS_LEFT = "attempts_left"  # failed_attempts < max_attempts
    RETRY_LEFT = "retry_left"  # failed_attempts + 1 < max_attempts: this failure still leaves one
    NO_RETRY_LEFT = "no_retry_left"  # failed_attempts + 1 >= max_attempts: this failure is the last
    LEASE_EXPIRED = "lease_expired"  # the last heartbeat is older than the lease


class Action(StrEnum):
    CLAIM = "claim"  # dispatcher: assign the next attempt number
    START = "start"  # worker: take exactly the attempt it was launched for
    TAKEOVER = "takeover"  # worker: a replacement pod of the same Job takes its running attempt over
    HEARTBEAT = "heartbeat"  # worker: liveness and progress (no state change, no event)
    VERDICT = "verdict"  # worker: store GO / NO-GO
    GIVE_UP = "give_up"  # worker: no verdict is possible, do not retry
    WORKER_RETRY = "worker_retry"  # worker: its attempt errored, another one is left
    WORKER_EXHAUSTED = "worker_exhausted"  # worker: its attempt errored and was the last
    LOST_RETRY = "lost_retry"  # dispatcher: the attempt's worker is gone, another attempt is left
    LOST_EXHAUSTED = "lost_exhausted"  # dispatcher: ... and it was the last
    EXPIRED_RETRY = "expired_retry"  # dispatcher: no heartbeat for a lease, another attempt is left
    EXPIRED_EXHAUSTED = "expired_exhausted"  # dispatcher: ... and it was the last
    EVICT = "evict"  # dispatcher: Kueue evicted the running attempt, wait for re-admission
    UNDISPATCH = "undispatch"  # dispatcher: the worker could not be started
    REFUSE = "refuse"  # dispatcher: the worker can never be started (its Job is refused for good)
    CANCEL = "cancel"  # anyone allowed to cancel, while not terminal


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    sources: frozenset[State]
    target: State
    guards: frozenset[Guard] = frozenset()
    counts_failure: bool = False  # failed_attempts += 1
    event: bool = True


_Q, _D, _R, _F = State.QUEUED, State.DISPATCHED, State.RUNNING, State.FAILED
_A, _W = Guard.ATTEMPT, Guard.WORKER
_FLIGHT = frozenset({_D, _R})
_BY_ITS_WORKER = frozenset({_A, _W})

# Plain data (no helper call builds it): every row is what the repository's one UPDATE enforces.
TRANSITIONS: Mapping[Action, Transition] = MappingProxyType({
    Action.CLAIM: Transition(sources=frozenset({_Q}), target=_D, guards=frozenset({Guard.ATTEMPTS_LEFT})),
    Action.START: Transition(sources=frozenset({_D}), target=_R, guards=frozenset({_A})),
    Action.TAKEOVER: Transition(sources=frozenset({_R}), target=_R, guards=frozenset({_A, Guard.REPLACES})),
    Action.HEARTBEAT: Transition(sources=frozenset({_R}), target=_R, guards=_BY_ITS_WORKER, event=False),
    Action.VERDICT: Transition(sources=frozenset({_R}), target=State.COMPLETED, guards=_BY_ITS_WORKER),
    Action.GIVE_UP: Transition(sources=frozenset({_R}), target=_F, guards=_BY_ITS_WORKER),
    Action.WORKER_RETRY: Transition(sources=frozenset({_R}), target=_Q, guards=_BY_ITS_WORKER | {Guard.RETRY_LEFT},
                                    counts_failure=True),
    Action.WORKER_EXHAUSTED: Transition(sources=frozenset({_R}), target=_F,
                                        guards=_BY_ITS_WORKER | {Guard.NO_RETRY_LEFT}, counts_failure=True),
    Action.LOST_RETRY: Transition(sources=_FLIGHT, target=_Q, guards=frozenset({_A, Guard.RETRY_LEFT}),
                                  counts_failure=True),
    Action.LOST_EXHAUSTED: Transition(sources=_FLIGHT, target=_F, guards=frozenset({_A, Guard.NO_RETRY_LEFT}),
                                      counts_failure=True),
    Action.EXPIRED_RETRY: Transition(sources=_FLIGHT, target=_Q,
                                     guards=frozenset({_A, Guard.LEASE_EXPIRED, Guard.RETRY_LEFT}),
                                     counts_failure=True),
    Action.EXPIRED_EXHAUSTED: Transition(sources=_FLIGHT, target=_F,
                                         guards=frozenset({_A, Guard.LEASE_EXPIRED, Guard.NO_RETRY_LEFT}),
                                         counts_failure=True),
    Action.EVICT: Transition(sources=frozenset({_R}), target=_D, guards=frozenset({_A})),
    Action.UNDISPATCH: Transition(sources=frozenset({_D}), target=_Q, guards=frozenset({_A})),
    Action.REFUSE: Transition(sources=frozenset({_Q}), target=_F),
    Action.CANCEL: Transition(sources=ACTIVE, target=State.CANCELLED),
})

# An attempt that ends without a verdict: (retry, last) for who noticed it.
ENDINGS: Mapping[str, tuple[Action, Action]] = MappingProxyType({
    "worker": (Action.WORKER_RETRY, Action.WORKER_EXHAUSTED),
    "lost": (Action.LOST_RETRY, Action.LOST_EXHAUSTED),
    "expired": (Action.EXPIRED_RETRY, Action.EXPIRED_EXHAUSTED),
})


class IllegalTransitionError(ConvgateError, ValueError):
    """A state change the lifecycle does not allow (e.g. anything after a verdict)."""

    code = "lifecycle.illegal_transition"


def successors(current: State) -> frozenset[State]:
    """Every state one transition can reach from `current`."""
    return frozenset(t.target for t in TRANSITIONS.values() if current in t.sources)


def check_transition(current: str, target: State) -> None:
    if target not in successors(State(current)):
        raise IllegalTransitionError(f"{current} -> {target} is not allowed")
