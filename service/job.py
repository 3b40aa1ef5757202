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

from service.config import Settings
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from service.verifications import uri_policy
from worker.engine import SourceUnavailableError, VerifyRequest, verify
from worker.errors import ConvgateError
from worker.fetch import ContentStore, FetchPolicy, local_path
from worker.policy import Policy

log = logging.getLogger("convgate.job")


class AttemptSupersededError(ConvgateError):
    """This attempt was cancelled or replaced by a newer one: stop working."""


class Heartbeat:
    """Reports liveness and the latest progress every `interval` seconds from a background thread."""

    def __init__(self, factory: sessionmaker[Session], verification_id: str, attempt: int, interval: float) -> None:
        self.factory, self.verification_id, self.attempt, self.interval = factory, verification_id, attempt, interval
        self.progress: dict[str, Any] | None = None
        self.superseded = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="convgate-heartbeat", daemon=True)

    def update(self, stage: str, done: int, total: int) -> None:
        """The engine's progress callback; raises once the attempt no longer owns the verification."""
        self.progress = {"stage": stage, "done": done, "total": total}
        if self.superseded.is_set():
            raise AttemptSupersededError("attempt superseded or cancelled")

    def _beat(self) -> None:
        with transaction(self.factory) as session:
            if not repository.heartbeat(session, self.verification_id, self.attempt, self.progress):
                self.superseded.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval if self.progress is not None else 0.2):
            try:
                self._beat()
            except Exception:
                log.exception("heartbeat failed")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _request(stored: dict[str, Any]) -> VerifyRequest:
    return VerifyRequest(
        source_uri=stored["source_uri"], artifact_uri=stored["artifact_uri"],
        expected_sha256=stored["artifact_sha256"], gates=frozenset(stored.get("gates") or (1, 2, 3)),
        texts=tuple(stored["texts"]) if stored.get("texts") else None, kind=stored.get("kind", "auto"),
        release_files=tuple(local_path(uri) for uri in stored.get("release_files", [])),
    )


def run_verification(settings: Settings, verification_id: str, worker_name: str) -> int:
    factory = session_factory(make_engine(settings.database_url))
    with transaction(factory) as session:
        verification = repository.start_attempt(session, verification_id, worker_name)
        if verification is None:
            log.info("verification %s has nothing to run", verification_id)
            return 0
        attempt, stored, policy = verification.attempt, dict(verification.request), Policy(**verification.policy)
    fetch_policy = FetchPolicy(allow_file=settings.allow_file_uris, allowed_hosts=settings.allowed_hosts,
                               hf_endpoint=settings.hf_endpoint, check_url=uri_policy(settings).fetch_hook)
    started = time.perf_counter()
    try:
        with Heartbeat(factory, verification_id, attempt, min(settings.lease_seconds / 4, 2.0)) as heart:
            report = verify(_request(stored), policy, ContentStore(settings.cache_dir), fetch_policy, heart.update)
    except SourceUnavailableError as exc:
        with transaction(factory) as session:
            repository.fail_permanently(session, verification_id, attempt, f"source unavailable: {exc}")
        return 0
    except Exception as exc:  # any crash: record it, let the dispatcher's retry policy decide
        log.exception("attempt %s of %s failed", attempt, verification_id)
        with transaction(factory) as session:
            repository.end_attempt_without_verdict(session, verification_id, attempt, f"{type(exc).__name__}: {exc}")
        return 1
    with transaction(factory) as session:
        written = repository.record_verdict(session, verification_id, attempt, json.loads(report.model_dump_json()))
    log.info("verification %s attempt %s: %s in %.1fs%s", verification_id, attempt, report.verdict,
             time.perf_counter() - started, "" if written else " (stale attempt: not recorded)")
    return 0
