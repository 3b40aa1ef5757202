"""The queue as operators see it: counts by state, the oldest waiting verification and every active
one with its wait and run times, Kueue status and position, and when each waiting one is expected to
start (`service/queue_estimate.py`), with the estimator's error on a replay of the latest finished runs
(`service/queue_replay.py`). Read by `GET /v1/queue` and the operator page alike."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from service.config import Settings
from service.lifecycle import State
from service.persistence import repository, stats
from service.persistence.clock import as_utc, now
from service.persistence.models import Verification
from service.persistence.queue_history import history, sizes_of
from service.queue_estimate import Queued, basis, start_in_seconds
from service.queue_replay import HISTORY, replayed_error
from service.schemas import QueueEstimate, QueueItem, QueueOut


def snapshot(session: Session, settings: Settings) -> QueueOut:
    moment = now(session)
    dispatcher = settings.dispatcher
    pool = settings.concurrency if dispatcher == "local" else None  # on Kubernetes, Kueue's quota decides

    def item(v: Verification) -> QueueItem:
        created, started = as_utc(v.created_at), as_utc(v.started_at)
        age = (moment - created).total_seconds()
        return QueueItem(id=v.id, state=v.state, attempt=v.attempt, failed_attempts=v.failed_attempts or 0,
                         age_seconds=age, progress=v.progress, worker=v.worker, reason=v.reason,
                         cluster_status=v.cluster_status, queue_position=v.queue_position,
                         submitted_by=v.submitted_by, artifact_uri=v.artifact_uri, source_uri=v.source_uri,
                         wait_seconds=((started or moment) - created).total_seconds(),
                         run_seconds=None if started is None else (moment - started).total_seconds())

    oldest = repository.oldest_queued(session)
    active = [item(v) for v in repository.active(session)]
    past = history(session)
    learned = sorted((p for p in past if p.completed and p.finished is not None and p.started is not None),
                     key=lambda p: p.finished or 0.0)[-HISTORY:]
    known = basis([(p.finished or 0.0) - (p.started or 0.0) for p in learned],
                  sum(1 for a in active if a.state == State.RUNNING), pool, sizes=[p.size for p in learned])
    sizes = sizes_of(session, [a.id for a in active])
    starts = start_in_seconds([Queued(id=a.id, state=a.state, run_seconds=a.run_seconds,
                                      queue_position=a.queue_position, size=sizes.get(a.id)) for a in active], known)
    error = replayed_error(tuple(past), pool)

    def estimated(queued: QueueItem) -> QueueItem:
        seconds = starts.get(queued.id)
        if seconds is None:
            return queued
        return queued.model_copy(update={"estimated_start_seconds": seconds,
                                         "estimated_start_at": moment + timedelta(seconds=seconds)})

    return QueueOut(counts=stats.state_counts(session), oldest_waiting=estimated(item(oldest)) if oldest else None,
                    active=[estimated(a) for a in active], dispatcher=dispatcher,
                    estimate=QueueEstimate(runs=known.runs, median_run_seconds=known.median_run_seconds,
                                           parallel=known.parallel, fixed_seconds=known.fixed_seconds,
                                           seconds_per_gib=known.seconds_per_gib, replayed_runs=error.runs,
                                           median_abs_error_seconds=error.median_abs_seconds,
                                           p90_abs_error_seconds=error.p90_abs_seconds))
