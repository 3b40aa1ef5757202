"""How good are the start estimates? Replay the estimator at each finished run's submission, from
nothing but what the service knew then, and compare its forecast with when the run really started.

At a past moment `t` the database still tells the queue as it was: a verification submitted before `t`
and not finished by `t` was active, running if its worker had started by `t` (for that long), else
waiting, in submission order (Kueue's positions of that moment were not kept); the runs finished by
`t` are the history the estimate learns from. So the replay calls the very estimator the queue page
uses (`queue_estimate.py`) with the inputs it would have had, and the error is its absolute difference
from the observed wait. Two simplifications, both stated where the figures are shown: a retried
verification's start is its last attempt's, and the parallelism is what ran at `t` (or the pool)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from service.lifecycle import State
from service.queue_estimate import Queued, basis, start_in_seconds

HISTORY = 50  # finished runs the estimate learns from, as on the queue page


@dataclass(frozen=True, slots=True)
class Past:
    """One verification as the database remembers it (times in seconds since any fixed origin)."""

    id: str
    created: float
    started: float | None
    finished: float | None
    completed: bool  # ended with a verdict it ran for (not failed, cancelled or reused)
    size: int | None = None


@dataclass(frozen=True, slots=True)
class ReplayError:
    runs: int  # how many finished runs were replayed
    median_abs_seconds: float | None
    p90_abs_seconds: float | None


def predicted_start(history: Sequence[Past], target: Past, pool: int | None) -> float | None:
    """Seconds after its submission that the estimator would have given `target` to start."""
    moment = target.created
    learned = sorted((p for p in history if p.completed and p.started is not None and p.finished is not None
                      and p.finished <= moment), key=lambda p: p.finished or 0.0)[-HISTORY:]
    active = sorted((p for p in history if p.created <= moment and (p.finished is None or p.finished > moment)),
                    key=lambda p: (p.created, p.id))
    queued = []
    for rank, past in enumerate(active):
        started = past.started is not None and past.started <= moment and past.id != target.id
        ran = moment - (past.started or 0.0) if started else None  # the target waits at its own submission
        queued.append(Queued(id=past.id, state=State.RUNNING if ran is not None else State.QUEUED,
                             run_seconds=ran, queue_position=None if ran is not None else rank, size=past.size))
    if target.id not in {item.id for item in queued}:
        queued.append(Queued(id=target.id, state=State.QUEUED, run_seconds=None, queue_position=len(queued),
                             size=target.size))
    known = basis([(p.finished or 0.0) - (p.started or 0.0) for p in learned],
                  sum(1 for item in queued if item.run_seconds is not None), pool, sizes=[p.size for p in learned])
    return start_in_seconds(queued, known).get(target.id)


def replay(history: Sequence[Past], pool: int | None, last: int = 100) -> list[tuple[float, float]]:
    """(predicted, observed) wait of each of the `last` finished runs that had an estimate."""
    finished = sorted((p for p in history if p.completed and p.started is not None), key=lambda p: (p.created, p.id))
    pairs = []
    for target in finished[-last:]:
        predicted = predicted_start(history, target, pool)
        if predicted is not None:
            pairs.append((predicted, (target.started or 0.0) - target.created))
    return pairs


def error_of(pairs: Sequence[tuple[float, float]]) -> ReplayError:
    """Median and 90th percentile (nearest rank) of the absolute errors."""
    errors = sorted(abs(predicted - observed) for predicted, observed in pairs)
    if not errors:
        return ReplayError(runs=0, median_abs_seconds=None, p90_abs_seconds=None)
    middle = len(errors) // 2
    median = errors[middle] if len(errors) % 2 else (errors[middle - 1] + errors[middle]) / 2
    return ReplayError(runs=len(errors), median_abs_seconds=median,
                       p90_abs_seconds=errors[max(0, math.ceil(0.9 * len(errors)) - 1)])


@lru_cache(maxsize=8)
def replayed_error(history: tuple[Past, ...], pool: int | None) -> ReplayError:
    """`error_of(replay(...))`, remembered: the operator page refreshes every two seconds and each scrape
    asks too, while the history changes only when a verification moves (a replay of 100 runs is tens of
    milliseconds of CPU)."""
    return error_of(replay(history, pool))
