"""The background loop that sends completion callbacks (see `service.callbacks`): it runs beside the
dispatch loop, in the app's lifespan, never in a request. Everything it needs is in the database, so a
restart loses nothing: a pending callback is found again, and one claimed by a process that died is
due again after its lease.

Fair and bounded. Each delivery has one total deadline, `callback_timeout_seconds`, for connecting,
sending and reading the status and headers together (`edge.deadline`): a receiver that trickles its answer
a byte at a time cannot stretch it, as it stretched the per-read timeout to 90 s. Deliveries go out on a
small pool of threads (`callback_workers`), at most one in flight per receiver (scheme, host and port), so a
slow or silent receiver holds one thread for one deadline at a time while every other receiver's callbacks
go out on the others; before, one thread sent every callback in turn, and one tarpit delayed every
tenant's by as long as it held the connection.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
from sqlalchemy.orm import Session, sessionmaker

from edge.deadline import deadline
from edge.redact import install_log_redaction, redact
from edge.transport import checked_client
from edge.uri_policy import UriRefusedError
from service import callbacks
from service.config import Settings
from service.fetching import uri_policy
from service.persistence import callbacks as store
from service.persistence import repository
from service.persistence.clock import now
from service.persistence.db import read_transaction, transaction
from service.persistence.models import CallbackDelivery
from service.ticker import Ticker
from service.verifications import to_out

log = logging.getLogger("convgate.callbacks")
SCAN = 1000  # due callbacks looked at per tick, oldest first, to find the oldest of each receiver not busy
LEASE_MARGIN_SECONDS = 30.0  # beyond the delivery's deadline, for claiming it and recording the attempt


def receiver_of(url: str) -> str:
    """Who a callback goes to: its scheme, host and port (the unit of "one in flight at a time")."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)  # a callback is http or https
    except ValueError:  # a malformed port or host: a receiver of its own
        return url
    return f"{parts.scheme}://{(parts.hostname or '').removesuffix('.')}:{port}".lower()


class CallbackLoop(Ticker):
    tick_name = "callback"
    thread_name = "convgate-callbacks"

    def __init__(self, factory: sessionmaker[Session], settings: Settings) -> None:
        super().__init__(settings.poll_seconds, log)
        install_log_redaction()  # httpx logs each callback URL it POSTs to, `?sig=` and `user:pass@` included
        self.factory = factory
        self.settings = settings
        # sending (within its deadline) and recording one delivery end well within its lease
        self.lease = timedelta(seconds=settings.callback_timeout_seconds + LEASE_MARGIN_SECONDS)
        self.client = checked_client(uri_policy(settings), verify=True, timeout_s=settings.callback_timeout_seconds,
                                     allowed_origins=callbacks.http_origins(settings))
        self.senders = ThreadPoolExecutor(settings.callback_workers, thread_name_prefix="convgate-callback")
        self._busy: set[str] = set()  # receivers with a delivery in flight
        self._lock = threading.Lock()

    def tick(self) -> int:
        """Hand the oldest due callback of each receiver not already being sent to a delivery thread, while
        threads are free; returns how many were handed over (each is claimed and sent in its thread)."""
        with read_transaction(self.factory) as session:
            due = store.due_with_urls(session, SCAN)
        handed = 0
        for verification_id, url in due:
            receiver = receiver_of(url)
            with self._lock:
                if len(self._busy) >= self.settings.callback_workers:
                    break
                if receiver in self._busy:
                    continue
                self._busy.add(receiver)
            self.senders.submit(self._deliver_to, receiver, verification_id)
            handed += 1
        return handed

    def _deliver_to(self, receiver: str, verification_id: str) -> None:
        try:
            self._deliver(verification_id)
        except Exception:  # a database error while claiming or recording: due again after the lease
            log.exception("callback of %s failed; it is retried", verification_id)
        finally:
            with self._lock:
                self._busy.discard(receiver)

    def _deliver(self, verification_id: str) -> None:
        with transaction(self.factory) as session:
            if not store.claim(session, verification_id, self.lease):
                return  # another replica took it
            verification = repository.get_verification(session, verification_id)
            assert verification is not None and verification.callback_url is not None
            url, attempt = verification.callback_url, store.attempts_made(session, verification_id) + 1
            secret = store.secret_for(session, verification.submitted_by)
            summary = to_out(session, verification).model_dump(mode="json")
        delivery = callbacks.delivery_id(verification_id)
        status_code, error = self._send(url, secret, summary, delivery)
        delivered = status_code is not None and 200 <= status_code < 300
        delay = None if delivered else callbacks.retry_delay(self.settings, attempt)
        outcome = (store.CallbackState.DELIVERED if delivered else
                   store.CallbackState.FAILED if delay is None else store.CallbackState.PENDING)
        with transaction(self.factory) as session:
            moment = now(session)
            store.record(session, CallbackDelivery(
                verification_id=verification_id, delivery_id=delivery, attempt=attempt, at=moment,
                status_code=status_code, error=error, next_retry_at=None if delay is None else moment + delay),
                outcome)
        log.info("callback of %s, attempt %d: %s", verification_id, attempt, status_code or error)

    def _send(self, url: str, secret: str | None, summary: dict[str, object],
              delivery: str) -> tuple[int | None, str | None]:
        """(status, None) for an answer, (None, why) when there was none; the response body is not read."""
        if secret is None:
            return None, "the submitter has no callback secret"
        body, headers = callbacks.signed_request(secret, summary, delivery, int(time.time()))
        try:
            with deadline(self.settings.callback_timeout_seconds), \
                    self.client.stream("POST", url, content=body, headers=headers) as response:
                return response.status_code, None
        except (httpx.HTTPError, UriRefusedError) as exc:
            return None, redact(f"{type(exc).__name__}: {exc}")[:500]

    def close(self) -> None:
        """After the ticking thread: deliveries in flight end within their deadline, then the client closes."""
        self.senders.shutdown(wait=True, cancel_futures=True)
        self.client.close()
