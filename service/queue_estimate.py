"""When will a waiting verification start? Kueue gives a position, not a time; this turns positions
into times from what the service has seen.

The model, and why it is this simple: a verification is assumed to run as long as recent finished
runs of its size did, and as many run at once as run now (the quota Kueue enforces, as the service
observes it) or as the local pool has workers. Run time is fitted to the artifact's size (bytes to
verify) as `fixed + per_gib * GiB` with the Theil-Sen estimator: the median of the slopes between every
pair of runs, then the median intercept. Medians, because one huge model or one stalled run must not
move every estimate. With fewer than three sized runs, runs of one size only, or a slope that says
larger is faster, the size is left out and every run is assumed to take the median. Running ones are
assumed to need their expected time minus what they have run; waiting ones start in queue order as
slots free up. With no finished run to learn from there is no estimate, rather than a made-up one. An
estimate is a forecast: the queue page and `GET /v1/queue` show its basis, and how far off it was on a
replay of the latest finished runs (`service/queue_replay.py`), beside it."""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from service.lifecycle import State

GIB = float(1 << 30)
MIN_SIZED_RUNS = 3


@dataclass(frozen=True, slots=True)
class Basis:
    """What the estimates stand on, shown with them."""

    runs: int  # finished runs the median is taken over
    median_run_seconds: float | None
    parallel: int  # how many are assumed to run at once
    fixed_seconds: float | None = None  # with the size: run time = fixed + per_gib * GiB
    seconds_per_gib: float | None = None

    def expected_run_seconds(self, size: int | None) -> float | None:
        """How long a run of `size` bytes (None: unknown) is expected to take."""
        if self.median_run_seconds is None:
            return None
        if size is None or self.seconds_per_gib is None or self.fixed_seconds is None:
            return self.median_run_seconds
        return max(0.0, self.fixed_seconds + self.seconds_per_gib * size / GIB)


@dataclass(frozen=True, slots=True)
class Queued:
    """One active verification, as the estimate needs it."""

    id: str
    state: str
    run_seconds: float | None  # how long it has run; None while it waits
    queue_position: int | None  # Kueue's position among those pending admission, when known
    size: int | None = None  # the artifact's bytes, when known


def size_fit(run_seconds: Sequence[float], sizes: Sequence[int | None]) -> tuple[float, float] | None:
    """(fixed seconds, seconds per GiB) by Theil-Sen over the runs whose size is known; None when the
    runs cannot say how size matters (too few, one size, or a slope that is not positive)."""
    points = [(size / GIB, seconds) for seconds, size in zip(run_seconds, sizes, strict=True) if size is not None]
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in combinations(points, 2) if x1 != x2]
    if len(points) < MIN_SIZED_RUNS or not slopes:
        return None
    slope = statistics.median(slopes)
    if slope <= 0:
        return None
    return statistics.median(y - slope * x for x, y in points), slope


def basis(run_seconds: Sequence[float], running: int, pool: int | None,
          sizes: Sequence[int | None] | None = None) -> Basis:
    """`run_seconds` of recent finished runs (and their artifacts' `sizes`, None where unknown); `running`
    now; `pool` the local workers (None on Kubernetes, where the observed parallelism is Kueue's quota)."""
    median = statistics.median(run_seconds) if run_seconds else None
    fit = size_fit(run_seconds, sizes) if sizes is not None else None
    return Basis(runs=len(run_seconds), median_run_seconds=median, parallel=pool or max(1, running),
                 fixed_seconds=fit[0] if fit else None, seconds_per_gib=fit[1] if fit else None)


def start_in_seconds(active: Sequence[Queued], known: Basis) -> dict[str, float]:
    """Seconds from now until each waiting verification is expected to start; empty without a history.
    Started ones are left out: they have started."""
    if known.median_run_seconds is None:
        return {}
    running = [item for item in active if item.run_seconds is not None]
    free_at = [max(0.0, (known.expected_run_seconds(item.size) or 0.0) - (item.run_seconds or 0.0))
               for item in running][:known.parallel]
    free_at += [0.0] * (known.parallel - len(free_at))
    heapq.heapify(free_at)
    waiting = sorted((item for item in active if item.run_seconds is None and item.state in (
        State.QUEUED, State.DISPATCHED)), key=_queue_order)
    estimates = {}
    for item in waiting:
        start = heapq.heappop(free_at)
        estimates[item.id] = start
        heapq.heappush(free_at, start + (known.expected_run_seconds(item.size) or 0.0))
    return estimates


def _queue_order(item: Queued) -> tuple[int, int]:
    """Dispatched before queued (they hold a Job already); among pending Jobs, Kueue's position."""
    return (0 if item.state == State.DISPATCHED else 1,
            item.queue_position if item.queue_position is not None else 1 << 30)
