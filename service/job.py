"""The Job entrypoint (`convgate worker run --verification-id ID`): claim an attempt, run the pure
engine, store the verdict fenced by attempt. The same code runs in a local pool process and in a
Kubernetes Job; running it twice is harmless (the second run finds nothing to do, or its stale
attempt writes nothing)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from edge.inputs import fetch_and_verify
from edge.redact import install_log_redaction, redact
from edge.store import ContentStore
from service.config import Settings
from service.fetching import fetch_policy, input_uris
from service.lifecycle import Reason
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from worker.engine import SourceUnavailableError, VerifyRequest
from worker.errors import ConvgateError
from worker.policy import Policy

log = logging.getLogger("convgate.job")


class AttemptSupersededError(ConvgateError):
    """This attempt was cancelled or replaced by a newer one: stop working, write nothing."""


class LeaseLostError(AttemptSupersededError):
    """No heartbeat went through for a lease: the dispatcher may already count this worker as dead."""


class Heartbeat:
    """Reports liveness and the latest progress every `interval` seconds from a background thread.
    A failed heartbeat (e.g. SQLite's "database is locked") is retried at the next beat; once none has
    gone through for a `lease`, the worker stops itself instead of running on while the dispatcher
    declares it dead and starts another attempt."""

    def __init__(self, factory: sessionmaker[Session], verification_id: str, attempt: int, worker: str, *,
                 interval: float, lease: float) -> None:
        self.factory, self.verification_id, self.attempt, self.worker = factory, verification_id, attempt, worker
        self.interval, self.lease = interval, lease
        self.progress: dict[str, Any] | None = None
        self.superseded = threading.Event()
        self.lost = threading.Event()
        self._last_beat = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="convgate-heartbeat", daemon=True)

    def update(self, stage: str, done: int, total: int) -> None:
        """The engine's progress callback; raises once the attempt no longer owns the verification."""
        self.progress = {"stage": stage, "done": done, "total": total}
        if self.superseded.is_set():
            raise AttemptSupersededError("attempt superseded or cancelled")
        if self.lost.is_set():
            raise LeaseLostError(f"no heartbeat went through for a lease ({self.lease:g}s): stopping")

    def _beat(self) -> None:
        with transaction(self.factory) as session:
            if not repository.heartbeat(session, self.verification_id, self.attempt, self.progress,
                                        worker=self.worker):
                self.superseded.set()
        self._last_beat = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval if self.progress is not None else 0.2):
            try:
                self._beat()
            except Exception as exc:  # retried at the next beat, until the lease runs out
                log.warning("heartbeat of %s attempt %s failed: %s", self.verification_id, self.attempt, exc)
            if self.superseded.is_set():
                return
            if time.monotonic() - self._last_beat >= self.lease:
                self.lost.set()
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _request(stored: dict[str, Any]) -> VerifyRequest:
    return VerifyRequest(
        expected_sha256=stored["artifact_sha256"], gates=frozenset(stored.get("gates") or (1, 2, 3)),
        texts=tuple(stored["texts"]) if stored.get("texts") else None, kind=stored.get("kind", "auto"),
    )


def run_verification(settings: Settings, verification_id: str, worker_name: str, attempt: int) -> int:
    factory = session_factory(make_engine(settings.database_url))
    with transaction(factory) as session:
        verification = repository.start_attempt(session, verification_id, worker_name, attempt=attempt)
        if verification is None:  # not this attempt's turn (an older or newer one, cancelled, finished)
            log.info("verification %s has no attempt %s to run", verification_id, attempt)
            return 0
        stored, policy = dict(verification.request), Policy(**verification.policy)
    install_log_redaction()  # URIs in any log line (httpx logs each request's URL) show no secrets
    started = time.perf_counter()
    try:  # the edge fetches (policy-checked, retried), then the pure engine runs on local files
        with Heartbeat(factory, verification_id, attempt, worker_name, interval=min(settings.lease_seconds / 4, 2.0),
                       lease=settings.lease_seconds) as heart:
            report = fetch_and_verify(_request(stored), input_uris(stored), policy, fetch_policy(settings),
                                      ContentStore(settings.cache_dir), heart.update)
    except SourceUnavailableError as exc:
        with transaction(factory) as session:
            repository.fail_permanently(session, verification_id, attempt, redact(f"source unavailable: {exc}"),
                                        worker=worker_name)
        return 0
    except LeaseLostError as exc:
        with transaction(factory) as session:
            repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.HEARTBEAT_LOST,
                                                   str(exc), worker=worker_name)
        return 1
    except AttemptSupersededError:
        log.info("verification %s attempt %s was superseded or cancelled: stopped", verification_id, attempt)
        return 0
    except Exception as exc:  # a crash or a transient fetch failure: no verdict, the dispatcher retries
        log.exception("attempt %s of %s failed", attempt, verification_id)
        with transaction(factory) as session:
            repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.WORKER_ERROR,
                                                   redact(f"{type(exc).__name__}: {exc}"), worker=worker_name)
        return 1
    with transaction(factory) as session:
        written = repository.record_verdict(session, verification_id, attempt, json.loads(report.model_dump_json()),
                                            worker=worker_name)
    log.info("verification %s attempt %s: %s in %.1fs%s", verification_id, attempt, report.verdict,
             time.perf_counter() - started, "" if written else " (stale attempt: not recorded)")
    return 0
