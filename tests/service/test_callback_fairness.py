"""Callbacks are fair and bounded (issue 34, item 2). A receiver that sent one byte every 5 s held the one
delivery thread for 90 s (httpx's timeout is per read, and each read got its byte in time), and another
tenant's callback went out 89 s late. Now each delivery has one total deadline, deliveries go out on a
small pool of threads, and a receiver has at most one delivery in flight.

The tarpit is a real socket server that accepts, then trickles a status line one byte at a time and never
finishes it; the other tenant's receiver answers at once. Deadlines are seconds here, so the test is quick."""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import trustme
from fastapi.testclient import TestClient
from sqlalchemy import update

from service import callbacks_loop
from service.api.app import create_app, no_loops
from service.callbacks_loop import CallbackLoop, receiver_of
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.models import Verification
from tests.integration.test_fetch import serve
from tests.service.conftest import callback_loop_only, settings_for
from tests.service.test_callbacks import Receiver, auth, callbacks, new_secret, submit, tokens, wait_for

DEADLINE = 5.0  # callback_timeout_seconds: the whole delivery
TRICKLE = 0.4  # the tarpit's pace: well inside any per-read timeout
ON_TIME = 2.5  # another tenant's callback is out this soon after it is due, whatever the tarpit does


class Tarpit:
    """Accepts every connection and answers one byte every TRICKLE seconds, forever (until closed); counts
    the connections it holds at once."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.origin = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held = 0
        self.most_held = 0
        self.accepted = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with self._lock:
            self.accepted += 1
            self.held += 1
            self.most_held = max(self.most_held, self.held)
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"z" * 100_000:
                if not self._wait(conn) or self._closed.is_set():
                    break
                conn.sendall(bytes([byte]))
        except OSError:  # the sender gave up and closed: what the deadline is for
            pass
        finally:
            with self._lock:
                self.held -= 1
            conn.close()

    @staticmethod
    def _wait(conn: socket.socket) -> bool:
        """TRICKLE seconds, reading (and dropping) the request meanwhile; False as soon as the sender closes."""
        deadline = time.monotonic() + TRICKLE
        while (left := deadline - time.monotonic()) > 0:
            if select.select([conn], [], [], left)[0] and not conn.recv(65536):
                return False
        return True

    def close(self) -> None:
        self._closed.set()
        self.server.close()


@pytest.fixture
def tarpit() -> Iterator[Tarpit]:
    pit = Tarpit()
    yield pit
    pit.close()


def _app(url: str, tmp_path, origins: tuple[str, ...], *, run_callbacks: bool = True, **overrides: Any) -> TestClient:
    settings = settings_for(url, tmp_path, file_roots=(tmp_path,), allow_private_addresses=True,
                            callback_http_origins=origins, callback_backoff_seconds=60,
                            callback_timeout_seconds=DEADLINE, **overrides)
    client = TestClient(create_app(settings, loops=callback_loop_only if run_callbacks else no_loops))
    client.app_state = client.app.state  # type: ignore[attr-defined]
    return client


def _cancel(api: TestClient, token: str, verification_id: str) -> float:
    """Cancel (the callback is due from now); when it became due."""
    assert api.post(f"/v1/verifications/{verification_id}/cancel", headers=auth(token)).status_code == 200
    return time.monotonic()


def test_a_tarpit_receiver_delays_no_other_tenants_callback(sqlite_url, tmp_path, tarpit):
    hook = Receiver([])
    try:
        who = tokens(sqlite_url)
        with _app(sqlite_url, tmp_path, (tarpit.origin, hook.origin)) as api:
            new_secret(api, who["one"])
            new_secret(api, who["two"])
            slow = [submit(api, who["one"], tmp_path, callback_url=f"{tarpit.origin}/hook",
                           artifact_sha256=c * 64).json()["id"] for c in "123"]
            fast = submit(api, who["two"], tmp_path, callback_url=f"{hook.origin}/hook").json()["id"]
            for verification_id in slow:
                _cancel(api, who["one"], verification_id)
            wait_for(lambda: tarpit.accepted >= 1)  # the tarpit holds a delivery
            due = _cancel(api, who["two"], fast)
            wait_for(lambda: len(hook.received) == 1)
            delivered_after = time.monotonic() - due
            # the tarpit's delivery ends at its deadline, as a timeout, to be retried after the backoff
            wait_for(lambda: callbacks(api, who["one"], slow[0])["deliveries"]
                     or callbacks(api, who["one"], slow[1])["deliveries"]
                     or callbacks(api, who["one"], slow[2])["deliveries"], timeout=DEADLINE + 10)
            first = next(d for v in slow for d in callbacks(api, who["one"], v)["deliveries"])
    finally:
        hook.close()
    print(f"\nanother tenant's callback out {delivered_after:.2f} s after it was due, the tarpit holding one")
    assert delivered_after < ON_TIME
    assert first["status_code"] is None and "Timeout" in first["error"], first
    assert tarpit.most_held == 1  # one delivery in flight per receiver, though three were due


def test_a_delivery_ends_at_its_total_deadline_however_the_bytes_trickle(sqlite_url, tmp_path, tarpit):
    who = tokens(sqlite_url)
    with _app(sqlite_url, tmp_path, (tarpit.origin,)) as api:
        new_secret(api, who["one"])
        verification_id = submit(api, who["one"], tmp_path, callback_url=f"{tarpit.origin}/hook").json()["id"]
        due = _cancel(api, who["one"], verification_id)
        wait_for(lambda: callbacks(api, who["one"], verification_id)["deliveries"], timeout=DEADLINE + 10)
        took = time.monotonic() - due
        (delivery,) = callbacks(api, who["one"], verification_id)["deliveries"]
    assert delivery["error"].startswith("ReadTimeout"), delivery
    assert took < DEADLINE + 2.0, f"{took:.1f} s"  # the deadline, plus a tick and the recording


def test_a_receiver_is_its_scheme_host_and_port():
    assert receiver_of("https://CI.example/a?sig=x") == receiver_of("https://ci.example.:443/b") == \
        "https://ci.example:443"
    assert receiver_of("http://ci.example/a") == "http://ci.example:80"
    assert receiver_of("http://ci.example:8080/a") != receiver_of("http://ci.example:8081/a")
    assert receiver_of("https://[::1]:99999/x") == "https://[::1]:99999/x"  # malformed: a receiver of its own
    assert receiver_of("http:///no-host") == "http://:80"


# --- the loop's parts -----------------------------------------------------------------------------------

class Handed:
    """A stand-in for the delivery threads: records what a tick hands over and sends nothing."""

    def __init__(self) -> None:
        self.handed: list[tuple[str, str]] = []

    def submit(self, function: Any, receiver: str, verification_id: str) -> None:
        self.handed.append((receiver, verification_id))

    def shutdown(self, **kwargs: Any) -> None:
        pass


def _loop(url: str, tmp_path, **overrides: Any) -> CallbackLoop:
    settings = settings_for(url, tmp_path, file_roots=(tmp_path,), allow_private_addresses=True, **overrides)
    return CallbackLoop(session_factory(make_engine(url)), settings)


def test_a_tick_hands_over_the_oldest_due_callback_of_each_free_receiver(sqlite_url, tmp_path, monkeypatch):
    origins = tuple(f"http://127.0.0.1:{port}" for port in (1, 2, 3))
    who = tokens(sqlite_url)
    with _app(sqlite_url, tmp_path, origins, run_callbacks=False) as api:
        new_secret(api, who["one"])
        ids = [submit(api, who["one"], tmp_path, callback_url=f"{origin}/hook", artifact_sha256=c * 64).json()["id"]
               for origin, c in zip((origins[0], *origins), "1234", strict=True)]
        for verification_id in ids:
            _cancel(api, who["one"], verification_id)
    engine = make_engine(sqlite_url)
    with transaction(session_factory(engine)) as session:  # due in the order submitted, the oldest first
        for age, verification_id in enumerate(reversed(ids), start=1):
            session.execute(update(Verification).where(Verification.id == verification_id)
                            .values(callback_due_at=datetime.now(UTC) - timedelta(minutes=age)))
    engine.dispose()
    first, second, third = (receiver_of(origin) for origin in origins)
    loop = _loop(sqlite_url, tmp_path, callback_workers=2)
    loop.senders.shutdown()
    loop.senders = Handed()  # type: ignore[assignment]
    try:
        # ids[1] waits behind ids[0] (same receiver); ids[3] waits for a free thread (two are taken)
        assert loop.tick() == 2
        assert loop.senders.handed == [(first, ids[0]), (second, ids[2])]
        assert loop.tick() == 0  # both still in flight
        loop._busy.clear()
        loop.senders.handed.clear()
        monkeypatch.setattr(callbacks_loop, "SCAN", 1)  # a tick looks at the SCAN oldest due callbacks only
        assert (loop.tick(), loop.senders.handed) == (1, [(first, ids[0])])
        assert loop.tick() == 0  # the one looked at is in flight; the rest are beyond the scan
        loop._busy.clear()
        assert loop.tick() == 1 and third not in loop._busy
    finally:
        loop.close()


def test_the_loop_keeps_to_its_settings(sqlite_url, tmp_path):
    loop = _loop(sqlite_url, tmp_path, callback_timeout_seconds=7.0, callback_workers=2)
    try:
        assert loop.lease == timedelta(seconds=7.0 + callbacks_loop.LEASE_MARGIN_SECONDS)
        assert loop.client.timeout == httpx.Timeout(7.0)
        running, most, lock, release = 0, 0, threading.Lock(), threading.Event()

        def hold() -> str:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            release.wait(5)
            with lock:
                running -= 1
            return threading.current_thread().name

        held = [loop.senders.submit(hold) for _ in range(4)]
        time.sleep(0.5)
        release.set()
        names = {future.result() for future in held}
    finally:
        loop.close()
    assert most == 2  # callback_workers deliveries at once, no more
    assert all(name.startswith("convgate-callback_") for name in names), names  # named in logs and dumps


def test_a_failed_tick_is_logged_and_the_loop_goes_on(tmp_path, caplog):
    missing = f"sqlite:///{tmp_path / 'never-migrated.db'}"  # no tables: every tick fails
    loop = _loop(missing, tmp_path)  # ticking every 0.1 s
    with caplog.at_level(logging.ERROR, logger="convgate.callbacks"):
        loop.start()
        try:
            wait_for(lambda: loop.ticks >= 3)
        finally:
            loop.stop()
    assert [r.getMessage() for r in caplog.records if r.name == "convgate.callbacks"][:3] == \
        ["callback tick failed; retrying"] * 3


def test_a_receivers_certificate_is_verified(sqlite_url, tmp_path):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(context)  # a CA nobody trusts
    loop = _loop(sqlite_url, tmp_path)
    try:
        for _, port in serve(context):
            status, error = loop._send(f"https://127.0.0.1:{port}/hook", "secret", {}, "delivery")
    finally:
        loop.close()
    assert status is None and error is not None and "CERTIFICATE_VERIFY_FAILED" in error, error


def _pending(url: str, tmp_path, origin: str) -> tuple[dict[str, str], str]:
    """One submitter's cancelled verification whose callback to `origin` is due; (tokens, its id)."""
    who = tokens(url)
    with _app(url, tmp_path, (origin,), run_callbacks=False) as api:
        new_secret(api, who["one"])
        verification_id = submit(api, who["one"], tmp_path, callback_url=f"{origin}/hook").json()["id"]
        _cancel(api, who["one"], verification_id)
    return who, verification_id


@pytest.mark.parametrize(("status", "state"), [(200, "delivered"), (299, "delivered"), (300, "pending"),
                                               (404, "pending")])
def test_only_a_2xx_answer_delivers_and_each_attempt_is_logged(sqlite_url, tmp_path, caplog, status, state):
    hook = Receiver([status])
    try:
        who, verification_id = _pending(sqlite_url, tmp_path, hook.origin)
        loop = _loop(sqlite_url, tmp_path, callback_http_origins=(hook.origin,), callback_backoff_seconds=60)
        try:
            with caplog.at_level(logging.INFO, logger="convgate.callbacks"):
                loop._deliver(verification_id)
                loop._deliver(verification_id)  # delivered, or not due before its backoff: nothing is sent
        finally:
            loop.close()
        with _app(sqlite_url, tmp_path, (hook.origin,), run_callbacks=False) as api:
            shown = callbacks(api, who["one"], verification_id)
    finally:
        hook.close()
    assert len(hook.received) == 1
    assert shown["state"] == state and [d["status_code"] for d in shown["deliveries"]] == [status]
    assert [r.getMessage() for r in caplog.records if r.name == "convgate.callbacks"] == [
        f"callback of {verification_id}, attempt 1: {status}"]


def test_a_delivery_that_fails_outside_the_exchange_is_logged_and_frees_its_receiver(sqlite_url, tmp_path, caplog):
    loop = _loop(sqlite_url, tmp_path)

    def broken(verification_id: str) -> None:
        raise RuntimeError("the database went away")

    loop._deliver = broken  # type: ignore[method-assign]
    loop._busy.add("http://r.example:80")
    try:
        with caplog.at_level(logging.ERROR, logger="convgate.callbacks"):
            loop._deliver_to("http://r.example:80", "v-1")
    finally:
        loop.close()
    assert loop._busy == set()
    (record,) = [r for r in caplog.records if r.name == "convgate.callbacks"]
    assert record.getMessage() == "callback of v-1 failed; it is retried" and record.exc_info is not None


def test_what_a_send_records_when_there_is_no_answer(sqlite_url, tmp_path):
    loop = _loop(sqlite_url, tmp_path)
    try:
        assert loop._send("https://h.example/hook", None, {}, "d") == (None, "the submitter has no callback secret")
        status, error = loop._send(f"https://{'a' * 600}.example/hook?sig=SECRET", "secret", {}, "d")
    finally:
        loop.close()
    assert status is None and error is not None and len(error) == 500 and "SECRET" not in error, error
    assert error.startswith("UriRefusedError: "), error
