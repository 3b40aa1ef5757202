"""How a worker talks to the database about its one attempt: the two implementations of
`AttemptChannel` (`attempt_contract.py`) and the choice between them.

- `DirectChannel` (the local pool, the embedded default): the worker process holds the service's
  own database URL and calls the repository, as the control plane does. Simple, and a local worker
  runs on the operator's machine with the operator's files anyway.
- `RestrictedChannel` (Kubernetes, `restricted_channel.py`): the worker holds a login that may only
  EXECUTE the functions of migration 0006, plus the secret of its own attempt.

Design (why an outbox): the restricted functions only *authenticate* (the secret of the current
claim, a live verification) and *insert a report* into `worker_reports`. The control plane's
dispatch loop then applies each report with `apply_worker_reports` (`worker_reports.py`) through
`SessionAttempt` below - the same code `DirectChannel` runs - so there is one mapping from "start,
heartbeat, verdict, end" to the repository, and the lifecycle's state and attempt fences are
checked once, by the repository, whichever way a worker reports. Writing the verdict, its gate
rows, tensor rows and digests directly in SQL would have been a second copy of `record_verdict`
and of every guard, which would drift. The price: a restricted worker's report takes effect on the
next dispatch tick, so the worker waits for its start to be accepted before it works, and for its
verdict to be applied before it exits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.lifecycle import Reason, State
from service.persistence import repository
from service.persistence.attempt_contract import ATTEMPT_SECRET_ENV, AttemptChannel, StartedAttempt
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.restricted_channel import RestrictedChannel

log = logging.getLogger("convgate.worker_channel")
class SessionAttempt:
    """The attempt operations inside a caller's transaction: the only place they meet the repository.
    `DirectChannel` calls it for a local worker; `apply_worker_reports` for a restricted worker."""

    def __init__(self, session: Session, verification_id: str, attempt: int, worker: str) -> None:
        self.session, self.verification_id, self.attempt, self.worker = session, verification_id, attempt, worker

    def start(self) -> StartedAttempt | None:
        """Take the attempt, or join it: the shards of one Indexed Job share the attempt and its worker
        name (the Job's), and a retried pod of one index joins the attempt the others are running."""
        verification = (repository.start_attempt(self.session, self.verification_id, self.worker, attempt=self.attempt)
                        or repository.join_sharded_attempt(self.session, self.verification_id, self.worker,
                                                           attempt=self.attempt))
        if verification is None:
            return None
        return StartedAttempt(request=dict(verification.request), policy=dict(verification.policy))

    def heartbeat(self, progress: dict[str, Any] | None) -> bool:
        return repository.heartbeat(self.session, self.verification_id, self.attempt, progress, worker=self.worker)

    def record_verdict(self, report: dict[str, Any]) -> bool:
        return repository.record_verdict(self.session, self.verification_id, self.attempt, report, worker=self.worker)

    def record_shard(self, shard: int, shards: int, payload: dict[str, Any]) -> bool:
        """A refused part (stale, malformed, or parts that do not merge) is False; parts that do not merge
        end the attempt, since no retry of one index can mend them."""
        from service.persistence.shards import ShardRefusedError, ShardsDoNotMergeError, record_shard

        try:
            with self.session.begin_nested():
                return record_shard(self.session, self.verification_id, self.attempt, self.worker, shard, shards,
                                    payload)
        except ShardRefusedError as exc:
            log.warning("verification %s attempt %s: shard %s refused: %s", self.verification_id, self.attempt,
                        shard, exc)
            if isinstance(exc, ShardsDoNotMergeError):
                self.end_without_verdict(f"gate-1 shards: {exc}")
            return False

    def end_without_verdict(self, reason: str, *, give_up: bool = False) -> bool:
        """True when this call ended the attempt."""
        if give_up:
            return repository.fail_permanently(self.session, self.verification_id, self.attempt, reason,
                                               worker=self.worker)
        before = repository.get_verification(self.session, self.verification_id)
        if before is None or before.state != State.RUNNING:
            return False
        after = repository.end_attempt_without_verdict(self.session, self.verification_id, self.attempt,
                                                       Reason.WORKER_ERROR, reason, worker=self.worker)
        return after != State.RUNNING


class DirectChannel:
    """The local pool's path: each call is one transaction on the service's own database URL."""

    def __init__(self, factory: sessionmaker[Session], verification_id: str, attempt: int, worker: str) -> None:
        self.factory, self.verification_id, self.attempt, self.worker = factory, verification_id, attempt, worker

    def close(self) -> None:
        bind = self.factory.kw.get("bind")
        if isinstance(bind, Engine):
            bind.dispose()

    def _in(self, session: Session) -> SessionAttempt:
        return SessionAttempt(session, self.verification_id, self.attempt, self.worker)

    def start(self) -> StartedAttempt | None:
        with transaction(self.factory) as session:
            return self._in(session).start()

    def heartbeat(self, progress: dict[str, Any] | None) -> bool:
        with transaction(self.factory) as session:
            return self._in(session).heartbeat(progress)

    def record_verdict(self, report: dict[str, Any]) -> bool:
        with transaction(self.factory) as session:
            return self._in(session).record_verdict(report)

    def record_shard(self, shard: int, shards: int, payload: dict[str, Any]) -> bool:
        with transaction(self.factory) as session:
            return self._in(session).record_shard(shard, shards, payload)

    def end_without_verdict(self, reason: str, *, give_up: bool = False) -> None:
        with transaction(self.factory) as session:
            self._in(session).end_without_verdict(reason, give_up=give_up)


def channel_for(database_url: str, verification_id: str, attempt: int, worker: str,
                environ: Mapping[str, str]) -> AttemptChannel:
    """The restricted channel when the dispatcher handed this worker an attempt secret (a Kubernetes
    Job), else the direct one (a local pool process)."""
    secret = environ.get(ATTEMPT_SECRET_ENV)
    if secret:
        return RestrictedChannel(database_url, verification_id, attempt, worker, secret)
    return DirectChannel(session_factory(make_engine(database_url)), verification_id, attempt, worker)
