"""One generic dispatch loop for every dispatcher: apply worker reports, reap, reconcile, cancel, claim,
launch. Each claimed attempt gets its own secret (issued in the claim's transaction) for its worker."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from edge.redact import install_log_redaction
from engine.errors import ConvgateError
from service.config import Settings
from service.dispatch.base import Dispatcher, LaunchError, WorkerExit
from service.dispatch.local import LocalPool
from service.lifecycle import IN_FLIGHT, Reason, State
from service.persistence import repository
from service.persistence.attempt_secrets import issue_attempt_secret
from service.persistence.db import transaction
from service.persistence.worker_reports import apply_worker_reports
from service.ticker import Ticker

log = logging.getLogger("convgate.dispatch")

def _kubernetes(settings: Settings) -> Dispatcher:
    from service.dispatch.kube.dispatcher import KubernetesDispatcher

    return KubernetesDispatcher(settings)


# Every dispatcher, by the name `CONVGATE_DISPATCHER` uses; no registration by import side effect.
DISPATCHERS: dict[str, Callable[[Settings], Dispatcher]] = {"local": LocalPool, "kubernetes": _kubernetes}


class DispatchLoop(Ticker):
    tick_name = "dispatch"
    thread_name = "convgate-dispatch"

    def __init__(self, dispatcher: Dispatcher, factory: sessionmaker[Session], settings: Settings) -> None:
        super().__init__(settings.poll_seconds, log)
        install_log_redaction()  # whichever process runs the loop: its log lines quote reasons and URIs
        self.dispatcher = dispatcher
        self.factory = factory
        self.settings = settings
        self._exits: list[WorkerExit] = []  # reaped, not yet recorded

    @classmethod
    def for_settings(cls, settings: Settings, factory: sessionmaker[Session]) -> DispatchLoop:
        try:
            implementation = DISPATCHERS[settings.dispatcher]
        except KeyError as exc:
            raise ValueError(f"unknown dispatcher {settings.dispatcher!r}; known: {sorted(DISPATCHERS)}") from exc
        return cls(implementation(settings), factory, settings)

    def tick(self) -> None:
        """One pass; safe to call repeatedly (tests drive it directly)."""
        # sync first: `reap()` and `active()` must describe the cluster as it is now. Taken before a
        # restarted dispatcher's first sync, `active()` is empty and every Job waiting in Kueue longer
        # than the lease would be ended as "heartbeat lost" and launched a second time; and a worker
        # exit must be reaped (with its reason) before the lease check sees the attempt as stale.
        with transaction(self.factory) as session:
            self.dispatcher.sync(session)
        # restricted workers' reports before the reap: a worker that filed its verdict and exited 0
        # must be seen with its verdict, not as an attempt that ended without one
        with transaction(self.factory) as session:
            apply_worker_reports(session)
        self._reap()
        with transaction(self.factory) as session:
            self._reconcile(session, self.dispatcher.active())
        self._launch()

    def _reap(self) -> None:
        """End each exited worker's own attempt (a fenced write: a newer attempt is untouched). An exit
        that could not be recorded (e.g. the database was locked) is kept for the next tick, not lost."""
        self._exits.extend(self.dispatcher.reap())
        while self._exits:
            worker_exit = self._exits[0]
            with transaction(self.factory) as session:
                state = repository.end_attempt_without_verdict(
                    session, worker_exit.verification_id, worker_exit.attempt, Reason.WORKER_EXITED,
                    f"worker ended without a verdict ({worker_exit.reason})")
            self._exits.pop(0)
            log.info("verification %s: worker of attempt %s %s -> %s", worker_exit.verification_id,
                     worker_exit.attempt, worker_exit.reason, state)

    def _reconcile(self, session: Session, active: set[str]) -> None:
        lease = timedelta(seconds=self.settings.lease_seconds)
        for verification in repository.active(session, limit=10_000):
            if verification.id not in active and verification.state in IN_FLIGHT and \
                    self.dispatcher.owns_dead(verification.worker):
                repository.end_attempt_without_verdict(session, verification.id, verification.attempt,
                                                       Reason.DISPATCHER_RESTARTED,
                                                       "its dispatcher restarted and the worker is gone")
        for verification in repository.stale_attempts(session, lease):
            if verification.id not in active:  # the write re-checks the lease: a heartbeat that landed wins
                repository.end_attempt_without_verdict(session, verification.id, verification.attempt,
                                                       Reason.HEARTBEAT_LOST, "heartbeat lost", lease=lease)
        for verification_id in sorted(active):
            current = repository.get_verification(session, verification_id)
            if current is not None and current.state == State.CANCELLED:
                self.dispatcher.cancel(verification_id)

    def _launch(self) -> None:
        capacity = self.dispatcher.capacity()
        if not capacity:
            return
        with transaction(self.factory) as session:  # the claim and its secret commit together
            claimed = [(v.id, v.attempt, issue_attempt_secret(session, v.id, v.attempt),
                        int((v.request or {}).get("shards", 1)))
                       for v in repository.claim_queued(session, capacity, self.dispatcher.identity)]
        for verification_id, attempt, secret, shards in claimed:
            try:
                self.dispatcher.launch(verification_id, attempt, attempt_secret=secret, shards=shards)
            except ConvgateError as exc:
                log.warning("could not start %s: %s", verification_id, exc)
                with transaction(self.factory) as session:
                    repository.undispatch(session, verification_id, attempt, str(exc),
                                          exc.cluster_status if isinstance(exc, LaunchError) else None)

    def close(self) -> None:
        self.dispatcher.shutdown()
