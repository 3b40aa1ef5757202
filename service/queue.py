"""The queue as operators see it: counts by state, the oldest waiting verification and every active
one with its wait and run times, Kueue status and position. Read by `GET /v1/queue` and the operator
page alike."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.persistence import repository, stats
from service.persistence.clock import as_utc, now
from service.persistence.models import Verification
from service.schemas import QueueItem, QueueOut


def snapshot(session: Session, dispatcher: str) -> QueueOut:
    moment = now(session)

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
    return QueueOut(counts=stats.state_counts(session), oldest_waiting=item(oldest) if oldest else None,
                    active=[item(v) for v in repository.active(session)], dispatcher=dispatcher)
