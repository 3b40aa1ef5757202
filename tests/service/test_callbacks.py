"""Completion callbacks through the API, on SQLite and on Postgres: a callback URL passes the artifacts' URI
policy at submission; on a terminal state the service's background loop POSTs the verification summary,
signed with the submitter's HMAC secret, retried with backoff up to a bound, and every delivery attempt is
recorded, survives a restart (it is in the database) and is shown to the submitter."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.api.app import create_app, no_loops
from service.auth import Role
from service.persistence import repository
from service.persistence.clock import SYSTEM_CLOCK
from service.persistence.db import transaction
from service.persistence.models import AccessLogRecord
from tests.service.conftest import add_token, callback_loop_only, settings_for
from tests.service.test_api import complete

SHA = "e" * 64


class Receiver:
    """A pipeline's endpoint on loopback: answers with the scripted statuses in turn (then 200)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.received: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                receiver.received.append((dict(self.headers.items()), self.rfile.read(length)))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made: list[Receiver] = []

    def make(statuses: list[int]) -> Receiver:
        made.append(Receiver(statuses))
        return made[-1]

    yield make  # type: ignore[misc]
    for each in made:
        each.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


def app_for(url: str, tmp_path, origin: str, *, run_callbacks: bool, **overrides: Any) -> TestClient:
    settings = settings_for(url, tmp_path, file_roots=(tmp_path,), allow_private_addresses=True,
                            callback_http_origins=(origin,), callback_backoff_seconds=0.05, **overrides)
    client = TestClient(create_app(settings, loops=callback_loop_only if run_callbacks else no_loops))
    client.app_state = client.app.state  # type: ignore[attr-defined]
    return client


def tokens(url: str) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:6]
    return {who: add_token(url, Role.SUBMITTER, f"{who}-{suffix}") for who in ("one", "two")}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit(api: TestClient, token: str, tmp_path, **extra: Any):
    body = {"source_uri": (tmp_path / "m").as_uri(), "artifact_uri": (tmp_path / "m.gguf").as_uri(),
            "artifact_sha256": SHA, **extra}
    return api.post("/v1/verifications", json=body, headers=auth(token))


def new_secret(api: TestClient, token: str) -> str:
    response = api.post("/v1/callback-secret", headers=auth(token))
    assert response.status_code == 201, response.text
    return response.json()["secret"]


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def callbacks(api: TestClient, token: str, verification_id: str) -> dict[str, Any]:
    response = api.get(f"/v1/verifications/{verification_id}/callbacks", headers=auth(token))
    assert response.status_code == 200, response.text
    return response.json()


def test_a_pending_callback_is_delivered_signed_after_a_restart(db, tmp_path, receiver):
    hook = receiver([])
    who = tokens(db)
    with app_for(db, tmp_path, hook.origin, run_callbacks=False) as before:  # no loop: nothing is sent
        secret = new_secret(before, who["one"])
        created = submit(before, who["one"], tmp_path, callback_url=f"{hook.origin}/hook?token=abc")
        assert created.status_code == 202, created.text
        verification_id = created.json()["id"]
        complete(before, verification_id)
        assert before.app.state.loops == []
        assert hook.received == []
        assert callbacks(before, who["one"], verification_id)["state"] == "pending"
    with app_for(db, tmp_path, hook.origin, run_callbacks=True) as after:  # a restart: the loop finds it
        wait_for(lambda: callbacks(after, who["one"], verification_id)["state"] == "delivered")
        shown = callbacks(after, who["one"], verification_id)
    assert len(hook.received) == 1
    headers, payload = hook.received[0]
    expected = hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()
    assert headers["X-Convgate-Signature"] == f"sha256={expected}"
    summary = json.loads(payload)
    assert summary["verification"]["id"] == verification_id
    assert (summary["verification"]["state"], summary["verification"]["verdict"]) == ("completed", "GO")
    assert summary["delivery"] == headers["X-Convgate-Delivery"]
    assert summary["timestamp"] == int(headers["X-Convgate-Timestamp"])
    assert abs(time.time() - summary["timestamp"]) < 60
    assert headers["Content-Type"] == "application/json"
    assert shown["callback_url"] == f"{hook.origin}/hook?token=REDACTED"  # the secret stays out of sight
    assert [(d["attempt"], d["status_code"], d["error"]) for d in shown["deliveries"]] == [(1, 200, None)]


def test_a_receiver_failing_twice_then_succeeding_shows_three_deliveries(db, tmp_path, receiver):
    hook = receiver([500, 503])
    who = tokens(db)
    with app_for(db, tmp_path, hook.origin, run_callbacks=True) as api:
        new_secret(api, who["one"])
        verification_id = submit(api, who["one"], tmp_path, callback_url=f"{hook.origin}/hook").json()["id"]
        complete(api, verification_id, "NO-GO")
        wait_for(lambda: callbacks(api, who["one"], verification_id)["state"] == "delivered")
        shown = callbacks(api, who["one"], verification_id)
        assert api.get(f"/v1/verifications/{verification_id}/callbacks", headers=auth(who["two"])).status_code == 404
        with transaction(api.app.state.session_factory) as session:
            logged = session.scalars(select(AccessLogRecord.action)).all()
        assert "read_callbacks" in logged  # the read is named for what it read
    deliveries = shown["deliveries"]
    assert [(d["attempt"], d["status_code"]) for d in deliveries] == [(1, 500), (2, 503), (3, 200)]
    assert deliveries[0]["next_retry_at"] is not None and deliveries[1]["next_retry_at"] is not None
    assert deliveries[2]["next_retry_at"] is None
    assert deliveries[0]["next_retry_at"] < deliveries[1]["next_retry_at"]
    assert len({headers["X-Convgate-Delivery"] for headers, _ in hook.received}) == 1  # one delivery, retried
    assert len(hook.received) == 3


def test_attempts_are_bounded_and_a_dead_receiver_is_recorded(db, tmp_path, receiver):
    hook = receiver([500] * 10)
    who = tokens(db)
    with app_for(db, tmp_path, hook.origin, run_callbacks=True, callback_attempts=3) as api:
        new_secret(api, who["one"])
        gone = submit(api, who["one"], tmp_path, callback_url="http://127.0.0.1:9/unreachable",
                      artifact_sha256="f" * 64)
        assert gone.status_code == 422  # another origin than the allowed http one
        verification_id = submit(api, who["one"], tmp_path, callback_url=f"{hook.origin}/hook").json()["id"]
        api.post(f"/v1/verifications/{verification_id}/cancel", headers=auth(who["one"]))
        wait_for(lambda: callbacks(api, who["one"], verification_id)["state"] == "failed")
        [loop] = api.app.state.loops
        ticks = loop.ticks
        wait_for(lambda: loop.ticks >= ticks + 3)  # three more passes of the loop: nothing more is sent
        deliveries = callbacks(api, who["one"], verification_id)["deliveries"]
    assert [(d["attempt"], d["status_code"]) for d in deliveries] == [(1, 500), (2, 500), (3, 500)]
    assert deliveries[-1]["next_retry_at"] is None and len(hook.received) == 3
    assert json.loads(hook.received[0][1])["verification"]["state"] == "cancelled"


def test_a_connection_error_is_recorded_as_the_error(db, tmp_path, receiver):
    hook = receiver([])
    hook.close()  # nobody listens there any more
    who = tokens(db)
    with app_for(db, tmp_path, hook.origin, run_callbacks=True, callback_attempts=2) as api:
        new_secret(api, who["one"])
        verification_id = submit(api, who["one"], tmp_path, callback_url=f"{hook.origin}/hook").json()["id"]
        complete(api, verification_id)
        wait_for(lambda: callbacks(api, who["one"], verification_id)["state"] == "failed")
        deliveries = callbacks(api, who["one"], verification_id)["deliveries"]
    assert [d["status_code"] for d in deliveries] == [None, None]
    assert all(d["error"] and "Connect" in d["error"] for d in deliveries)


@pytest.mark.parametrize("url", [
    "https://127.0.0.1/hook",  # loopback, with private addresses refused
    "https://10.0.0.7/hook",
    "https://169.254.169.254/latest/meta-data",
    "http://203.0.113.9/hook",  # plain http to an origin the operator did not allow
    "file:///tmp/hook",
    "hf://org/repo@" + "0" * 40,
    "ftp://example.org/hook",
])
def test_a_callback_url_the_uri_policy_refuses_is_422(sqlite_url, tmp_path, url):
    settings = settings_for(sqlite_url, tmp_path, file_roots=(tmp_path,))
    who = tokens(sqlite_url)
    with TestClient(create_app(settings, loops=no_loops)) as api:
        new_secret(api, who["one"])
        response = submit(api, who["one"], tmp_path, callback_url=url)
        assert response.status_code == 422, response.text
        assert "callback_url" in response.text


def test_a_callback_needs_the_submitters_secret_first_and_the_secret_is_shown_once(db, tmp_path, receiver):
    hook = receiver([])
    who = tokens(db)
    with app_for(db, tmp_path, hook.origin, run_callbacks=False) as api:
        refused = submit(api, who["one"], tmp_path, callback_url=f"{hook.origin}/hook")
        assert refused.status_code == 422 and "callback-secret" in refused.text
        first, second = new_secret(api, who["one"]), new_secret(api, who["one"])  # a second call rotates it
        assert first != second and len(second) >= 40
        assert api.get("/v1/callback-secret", headers=auth(who["one"])).status_code == 405
        assert submit(api, who["one"], tmp_path, callback_url=f"{hook.origin}/hook").status_code == 202
        plain = submit(api, who["one"], tmp_path, artifact_sha256="1" * 64).json()
        shown = callbacks(api, who["one"], plain["id"])
        assert (shown["callback_url"], shown["state"], shown["deliveries"]) == (None, None, [])


def test_a_reused_verdict_calls_back_at_once(db, tmp_path, receiver):
    hook = receiver([])
    who = tokens(db)
    pinned = {"source_uri": "hf://org/m@" + "0" * 40, "artifact_uri": "hf://org/g@" + "1" * 40 + "/m.gguf"}
    with app_for(db, tmp_path, hook.origin, run_callbacks=True) as api:
        new_secret(api, who["two"])
        original = submit(api, who["two"], tmp_path, **pinned).json()["id"]  # reuse is within a submitter
        from engine.verification import environment

        report = {"verdict": "GO", "blockers": [], "gates": {}, "policy": {}, "artifact": None, "files": [],
                  "not_verified": [], "environment": environment(), "timings": {}}
        with transaction(api.app_state.session_factory) as session:
            attempt = repository.claim(session, original, "t").attempt
            repository.start_attempt(session, original, "t", attempt=attempt)
            assert repository.record_verdict(session, original, attempt, report, worker="t")
        reused = submit(api, who["two"], tmp_path, callback_url=f"{hook.origin}/hook", **pinned).json()
        assert reused["reused_from"] == original
        wait_for(lambda: callbacks(api, who["two"], reused["id"])["state"] == "delivered")
    assert json.loads(hook.received[0][1])["verification"]["reused_from"] == original


def test_retries_double_up_to_the_cap_and_stop_at_the_bound(tmp_path):
    from datetime import timedelta

    from service.callbacks import retry_delay
    from service.config import Settings

    settings = Settings(database_url="sqlite://", cache_dir=tmp_path, callback_backoff_seconds=10,
                        callback_max_backoff_seconds=35, callback_attempts=4)
    assert [retry_delay(settings, attempt) for attempt in (1, 2, 3, 4, 5)] == [
        timedelta(seconds=10), timedelta(seconds=20), timedelta(seconds=35), None, None]


def test_the_signature_covers_the_whole_body_and_the_delivery_id_is_stable():
    from service.callbacks import delivery_id, new_secret, signed_request

    body, headers = signed_request("k", {"state": "completed", "id": "v"}, "d-1", 1700000000)
    assert body == b'{"delivery":"d-1","timestamp":1700000000,"verification":{"id":"v","state":"completed"}}'
    assert headers["User-Agent"] == "convgate-callbacks"
    assert headers["X-Convgate-Signature"] == "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert (headers["X-Convgate-Delivery"], headers["X-Convgate-Timestamp"]) == ("d-1", "1700000000")
    assert headers["Content-Type"] == "application/json"
    _, later_headers = signed_request("k", {"id": "v", "state": "completed"}, "d-1", 1700000001)
    assert later_headers["X-Convgate-Signature"] != headers["X-Convgate-Signature"]  # the time is signed too
    assert signed_request("other", {"id": "v", "state": "completed"}, "d-1", 1700000000)[1][
        "X-Convgate-Signature"] != headers["X-Convgate-Signature"]
    assert delivery_id("a") == delivery_id("a") != delivery_id("b")
    assert str(uuid.UUID(delivery_id("a"))) == delivery_id("a")
    assert new_secret() != new_secret() and new_secret().startswith("cgcb_") and len(new_secret()) > 40


def test_due_deliveries_are_claimed_once_in_batches_and_recorded_on_their_own_row(db, tmp_path, receiver):
    from datetime import timedelta

    from service.persistence import callbacks as store
    from service.persistence.models import CallbackDelivery

    hook = receiver([])
    who = tokens(db)
    with app_for(db, tmp_path, hook.origin, run_callbacks=False) as api:
        new_secret(api, who["one"])
        ids = sorted(submit(api, who["one"], tmp_path, callback_url=f"{hook.origin}/h", artifact_sha256=c * 64)
                     .json()["id"] for c in "123")
        waiting = ids.pop()  # not terminal: not due
        for verification_id in ids:
            api.post(f"/v1/verifications/{verification_id}/cancel", headers=auth(who["one"]))
        factory = api.app_state.session_factory
    with transaction(factory) as session:
        assert store.due(session, 10) == ids and store.due(session, 1) == ids[:1]
        assert store.claim(session, ids[0], timedelta(minutes=5))
        assert not store.claim(session, ids[0], timedelta(minutes=5))  # taken: another replica gets nothing
        assert not store.claim(session, waiting, timedelta(minutes=5))
        assert store.due(session, 10) == ids[1:]
    first, second = ids
    moment = SYSTEM_CLOCK.now()
    with transaction(factory) as session:  # a failed attempt with a retry an hour away: not due until then
        store.record(session, CallbackDelivery(verification_id=first, delivery_id="d", attempt=1, at=moment,
                                               status_code=500, next_retry_at=moment + timedelta(hours=1)),
                     store.CallbackState.PENDING)
        assert store.due(session, 10) == [second]  # the other row is untouched
    with transaction(factory) as session:
        store.record(session, CallbackDelivery(verification_id=second, delivery_id="d", attempt=1, at=moment,
                                               status_code=200), store.CallbackState.DELIVERED)
        store.record(session, CallbackDelivery(verification_id=second, delivery_id="d", attempt=2, at=moment,
                                               status_code=500, next_retry_at=moment - timedelta(hours=1)),
                     store.CallbackState.PENDING)  # a late writer cannot reopen a delivered callback
    with transaction(factory) as session:
        states = {v: repository.get_verification(session, v).callback_state for v in ids}
        assert states == {first: "pending", second: "delivered"} and store.due(session, 10) == []
        assert store.claim(session, first, timedelta(minutes=5)) is False
        assert [d.attempt for d in store.deliveries(session, second)] == [1, 2]
        assert store.attempts_made(session, second) == 2 and store.attempts_made(session, first) == 1


def test_due_callbacks_come_oldest_first_then_by_id(db, tmp_path, receiver):
    """Callbacks due at the same moment (never attempted: no due time) come in a stable order, by id."""
    from datetime import timedelta

    from sqlalchemy import update

    from service.persistence import callbacks as store
    from service.persistence.models import Verification

    hook = receiver([])
    who = tokens(db)
    with app_for(db, tmp_path, hook.origin, run_callbacks=False) as api:
        new_secret(api, who["one"])
        ids = [submit(api, who["one"], tmp_path, callback_url=f"{hook.origin}/h", artifact_sha256=c * 64)
               .json()["id"] for c in "123456"]
        for verification_id in ids:
            api.post(f"/v1/verifications/{verification_id}/cancel", headers=auth(who["one"]))
        factory = api.app_state.session_factory
    with transaction(factory) as session:
        assert store.due(session, 10) == sorted(ids)
        session.execute(update(Verification).where(Verification.id == ids[0])
                        .values(callback_due_at=SYSTEM_CLOCK.now() - timedelta(minutes=1)))
    with transaction(factory) as session:  # SQL sorts no due time (NULL) first on SQLite, last on Postgres
        due = store.due(session, 10)
        rest = sorted(ids[1:])
        assert due in ([*rest, ids[0]], [ids[0], *rest])
        assert store.due_with_urls(session, 1)[0][1] == f"{hook.origin}/h"


def test_plain_http_origins_compare_without_case_or_a_trailing_slash(tmp_path):
    from service.callbacks import http_origins
    from service.config import Settings

    settings = Settings(database_url="sqlite://", cache_dir=tmp_path,
                        callback_http_origins=("HTTP://CI.Internal:8080/", "http://a:1"))
    assert http_origins(settings) == frozenset({"http://ci.internal:8080", "http://a:1"})


@pytest.mark.parametrize("database", ["sqlite_url", "pg"])
def test_two_first_callback_secrets_made_at_once_are_both_answered(database, request):
    """Two `POST /v1/callback-secret` of a submitter who has none, at once: on Postgres both read "none" and
    both inserted, and the second failed the primary key (a 500 in the 200-client burst). Each now answers;
    the secret kept is the last one written."""
    from service.callbacks import replace_secret
    from service.persistence.callbacks import secret_for
    from service.persistence.db import make_engine, session_factory

    url = request.getfixturevalue(database)
    engine = make_engine(url, busy_timeout_seconds=10)
    factory = session_factory(engine)
    second: dict[str, Any] = {}
    try:
        with transaction(factory) as first_session:
            first, _ = replace_secret(first_session, "alice")

            def at_once() -> None:
                try:
                    with transaction(factory) as session:
                        second["secret"], _ = replace_secret(session, "alice")
                except Exception as exc:  # the failure under test, reported to the test's thread
                    second["error"] = exc

            racer = threading.Thread(target=at_once)
            racer.start()
            racer.join(timeout=1.0)  # the second waits for the first's uncommitted row (or SQLite's lock)
        racer.join(timeout=30)
        assert "error" not in second, second["error"]
        with factory() as session:
            assert secret_for(session, "alice") == second["secret"] != first
    finally:
        engine.dispose()
