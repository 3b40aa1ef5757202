"""The background loop that sends completion callbacks (see `service.callbacks`): it runs beside the
dispatch loop, in the app's lifespan, never in a request. Everything it needs is in the database, so a
restart loses nothing: a pending callback is found again, and one claimed by a process that died is
due again after its lease."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import httpx
from sqlalchemy.orm import Session, sessionmaker

from edge.redact import install_log_redaction, redact
from edge.transport import checked_client
from edge.uri_policy import UriRefusedError
from service import callbacks
from service.config import Settings
from service.fetching import uri_policy
from service.persistence import callbacks as store
from service.persistence import repository
from service.persistence.clock import now
from service.persistence.db import transaction
from service.persistence.models import CallbackDelivery
from service.ticker import Ticker
from service.verifications import to_out

log = logging.getLogger("convgate.callbacks")
BATCH = 20


class CallbackLoop(Ticker):
    tick_name = "callback"
    thread_name = "convgate-callbacks"

    def __init__(self, factory: sessionmaker[Session], settings: Settings) -> None:
        super().__init__(settings.poll_seconds, log)
        install_log_redaction()  # httpx logs each callback URL it POSTs to, `?sig=` and `user:pass@` included
        self.factory = factory
        self.settings = settings
        # sending and recording one delivery must end well within its lease
        self.lease = timedelta(seconds=4 * settings.callback_timeout_seconds + 30)
        self.client = checked_client(uri_policy(settings), verify=True, timeout_s=settings.callback_timeout_seconds,
                                     allowed_origins=callbacks.http_origins(settings))

    def tick(self) -> int:
        """Attempt every due delivery once; returns how many were attempted (tests drive it directly)."""
        with transaction(self.factory) as session:
            due = store.due(session, BATCH)
        return sum(self._deliver(verification_id) for verification_id in due)

    def _deliver(self, verification_id: str) -> bool:
        with transaction(self.factory) as session:
            if not store.claim(session, verification_id, self.lease):
                return False  # another replica took it
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
        return True

    def _send(self, url: str, secret: str | None, summary: dict[str, object],
              delivery: str) -> tuple[int | None, str | None]:
        """(status, None) for an answer, (None, why) when there was none; the response body is not read."""
        if secret is None:
            return None, "the submitter has no callback secret"
        body, headers = callbacks.signed_request(secret, summary, delivery, int(time.time()))
        try:
            with self.client.stream("POST", url, content=body, headers=headers) as response:
                return response.status_code, None
        except (httpx.HTTPError, UriRefusedError) as exc:
            return None, redact(f"{type(exc).__name__}: {exc}")[:500]

    def close(self) -> None:
        self.client.close()
