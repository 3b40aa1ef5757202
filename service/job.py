"""The Job entrypoint (`convgate worker run --verification-id ID --attempt N`): start that attempt, run
the pure engine, store the verdict fenced by attempt, all through the attempt's channel
(`service/persistence/worker_channel.py`): a Kubernetes worker holds only the restricted login and
its attempt's secret, a local pool process the service's own URL. Running it twice is harmless (the
second run finds nothing to do, or its stale attempt writes nothing)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from edge.inputs import fetch_and_verify, fetch_and_verify_shard
from edge.redact import install_log_redaction, redact
from edge.store import ContentStore
from engine.errors import ConvgateError
from engine.gates.runtime.labelled_retrieval import parse_labelled_set
from engine.gates.storage.parts import StoragePart
from engine.policy import Policy
from engine.report import Report
from engine.verification import SourceUnavailableError, VerifyRequest
from service.config import Settings
from service.fetching import fetch_policy, input_uris
from service.persistence.attempt_contract import AttemptChannel
from service.persistence.worker_channel import channel_for

log = logging.getLogger("convgate.job")


class AttemptSupersededError(ConvgateError):
    """This attempt was cancelled or replaced by a newer one: stop working, write nothing."""

    code = "attempt.superseded"


class LeaseLostError(AttemptSupersededError):
    """No heartbeat went through for a lease: the dispatcher may already count this worker as dead."""

    code = "attempt.lease_lost"


class Heartbeat:
    """Reports liveness and the latest progress every `interval` seconds from a background thread.
    A failed heartbeat (e.g. SQLite's "database is locked") is retried at the next beat; once none has
    gone through for a `lease`, the worker stops itself instead of running on while the dispatcher
    declares it dead and starts another attempt. `channel` is the attempt's channel: direct for the local
    pool, restricted for a Kubernetes worker."""

    def __init__(self, channel: AttemptChannel, verification_id: str, attempt: int, worker: str, *,
                 interval: float, lease: float) -> None:
        self.channel = channel
        self.verification_id, self.attempt, self.worker = verification_id, attempt, worker
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
        if not self.channel.heartbeat(self.progress):
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


def verify_request(stored: dict[str, Any]) -> VerifyRequest:
    """What a stored submission asks the engine for (the worker reads nothing else of the request)."""
    return VerifyRequest(
        expected_sha256=stored["artifact_sha256"], gates=frozenset(stored.get("gates") or (1, 2, 3)),
        texts=tuple(stored["texts"]) if stored.get("texts") else None, kind=stored.get("kind", "auto"),
        text_sets={name: tuple(members) for name, members in stored["text_sets"].items()}
        if stored.get("text_sets") else None,
        imatrix_sha256=stored.get("imatrix_sha256"),
        shard_sha256=tuple(stored.get("artifact_shard_sha256") or ()),
        source_signature_sha256=stored.get("source_signature_sha256"),
        artifact_signature_sha256=stored.get("artifact_signature_sha256"),
        trusted_signers=tuple(stored.get("trusted_signers") or ()),
        labelled_set=parse_labelled_set(stored["labelled_set"], "submitted") if stored.get("labelled_set") else None,
    )


def run_verification(settings: Settings, verification_id: str, worker_name: str, attempt: int, *,
                     shard: int = 0) -> int:
    """Run `attempt` through its channel: restricted (the attempt's secret is in the environment, a
    Kubernetes Job) or direct (a local pool process). Exit code 1 means the attempt failed unjudged.
    For a verification split into shards, `shard` is this worker's (an Indexed Job's completion index)."""
    install_log_redaction()  # before anything logs: URIs in any line (httpx logs each request's URL) show no secrets
    channel = channel_for(settings.database_url, verification_id, attempt, worker_name, os.environ)
    try:
        return _run_attempt(settings, channel, shard)
    finally:
        channel.close()


def _store(channel: AttemptChannel, report: Report, part: StoragePart | None, shard: int, shards: int) -> bool:
    """A shard files its part (the last one stored writes the merged verdict); a run that stopped before
    gate 1 is the whole NO-GO, written by shard 0 alone (every shard stopped the same way)."""
    if part is None:
        return channel.record_verdict(json.loads(report.model_dump_json())) if shard == 0 else True
    payload = {"part": json.loads(part.model_dump_json()),
               "report": json.loads(report.model_dump_json()) if shard == 0 else None}
    return channel.record_shard(shard, shards, payload)


def _run_attempt(settings: Settings, channel: AttemptChannel, shard: int = 0) -> int:
    verification_id, attempt, worker_name = channel.verification_id, channel.attempt, channel.worker
    started_attempt = channel.start()
    if started_attempt is None:  # not this attempt's turn (an older or newer one, cancelled, finished)
        log.info("verification %s has no attempt %s to run", verification_id, attempt)
        return 0
    stored, policy = started_attempt.request, Policy(**started_attempt.policy)
    shards = int(stored.get("shards", 1))
    if not 0 <= shard < shards:
        channel.end_without_verdict(f"worker for shard {shard} of a verification of {shards} shard(s)")
        return 1
    started = time.perf_counter()
    try:  # the edge fetches (policy-checked, retried), then the pure engine runs on local files
        with Heartbeat(channel, verification_id, attempt, worker_name, interval=min(settings.lease_seconds / 4, 2.0),
                       lease=settings.lease_seconds) as heart:
            if shards == 1:
                report, part = fetch_and_verify(verify_request(stored), input_uris(stored), policy,
                                                fetch_policy(settings), ContentStore(settings.cache_dir),
                                                heart.update), None
            else:
                report, part = fetch_and_verify_shard(verify_request(stored), input_uris(stored), policy,
                                                      fetch_policy(settings), ContentStore(settings.cache_dir),
                                                      heart.update, shard, shards)
    except SourceUnavailableError as exc:
        channel.end_without_verdict(redact(f"source unavailable: {exc}"), give_up=True)
        return 0
    except LeaseLostError as exc:
        channel.end_without_verdict(str(exc))
        return 1
    except AttemptSupersededError:
        log.info("verification %s attempt %s was superseded or cancelled: stopped", verification_id, attempt)
        return 0
    except Exception as exc:  # a crash or a transient fetch failure: no verdict, the dispatcher retries
        log.exception("attempt %s of %s failed", attempt, verification_id)
        if shards == 1:  # a shard's pod is retried alone by its Indexed Job; the others keep their parts
            channel.end_without_verdict(redact(f"{type(exc).__name__}: {exc}"))
        return 1
    written = _store(channel, report, part, shard, shards)
    log.info("verification %s attempt %s: %s in %.1fs%s", verification_id, attempt, report.verdict,
             time.perf_counter() - started, "" if written else " (stale attempt: not recorded)")
    return 0
