"""When will a waiting verification start? Kueue gives a position, not a time; this turns positions
into times from what the service has seen.

The model, and why it is this simple: every verification is assumed to take the median run time of
the last finished ones (a median, because one huge model must not move every estimate), and as many
run at once as run now (the quota Kueue enforces, as the service observes it) or as the local pool
has workers. Running ones are assumed to need the median minus what they have run. Waiting ones start
in queue order as slots free up. With no finished run to learn from there is no estimate, rather than
a made-up one. An estimate is a forecast: the queue page and `GET /v1/queue` show its basis beside it."""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from service.lifecycle import State


@dataclass(frozen=True, slots=True)
class Basis:
    """What the estimates stand on, shown with them."""

    runs: int  # finished runs the median is taken over
    median_run_seconds: float | None
    parallel: int  # how many are assumed to run at once


@dataclass(frozen=True, slots=True)
class Queued:
    """One active verification, as the estimate needs it."""

    id: str
    state: str
    run_seconds: float | None  # how long it has run; None while it waits
    queue_position: int | None  # Kueue's position among those pending admission, when known


def basis(run_seconds: Sequence[float], running: int, pool: int | None) -> Basis:
    """`run_seconds` of recent finished runs; `running` now; `pool` the local workers (None on Kubernetes,
    where the observed parallelism is Kueue's quota at work)."""
    median = statistics.median(run_seconds) if run_seconds else None
    return Basis(runs=len(run_seconds), median_run_seconds=median, parallel=pool or max(1, running))


def start_in_seconds(active: Sequence[Queued], known: Basis) -> dict[str, float]:
    """Seconds from now until each waiting verification is expected to start; empty without a median.
    Started ones are left out: they have started."""
    median = known.median_run_seconds
    if median is None:
        return {}
    running = [item for item in active if item.run_seconds is not None]
    free_at = [max(0.0, median - (item.run_seconds or 0.0)) for item in running][:known.parallel]
    free_at += [0.0] * (known.parallel - len(free_at))
    heapq.heapify(free_at)
    waiting = sorted((item for item in active if item.run_seconds is None and item.state in (
        State.QUEUED, State.DISPATCHED)), key=_queue_order)
    estimates = {}
    for item in waiting:
        start = heapq.heappop(free_at)
        estimates[item.id] = start
        heapq.heappush(free_at, start + median)
    return estimates


def _queue_order(item: Queued) -> tuple[int, int]:
    """Dispatched before queued (they hold a Job already); among pending Jobs, Kueue's position."""
    return (0 if item.state == State.DISPATCHED else 1,
            item.queue_position if item.queue_position is not None else 1 << 30)
