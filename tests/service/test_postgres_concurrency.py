"""Against real Postgres through a live server: 50 concurrent submissions sharing one
Idempotency-Key create exactly one verification."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from service.auth import Role
from service.persistence.db import make_engine
from tests.service.conftest import add_token, settings_for, start_server

BODY = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "artifact_sha256": "c" * 64}


@pytest.fixture
def server(pg, tmp_path):
    yield from start_server(settings_for(pg, tmp_path, file_roots=(Path("/models"),)))


def test_fifty_concurrent_submissions_with_one_key_make_one_verification(server, pg):
    token = add_token(pg, Role.SUBMITTER)
    barrier = threading.Barrier(50)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def post() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            barrier.wait()
            response = client.post("/v1/verifications", json=BODY,
                                   headers=server.headers(token) | {"Idempotency-Key": "same-key"})
        with lock:
            results.append((response.status_code, response.json().get("id")))

    threads = [threading.Thread(target=post) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = Counter(status for status, _ in results)
    assert statuses == {202: 1, 200: 49}, statuses
    assert len({ident for _, ident in results}) == 1
    engine = make_engine(pg)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM verifications")).scalar() == 1
        assert connection.execute(text("SELECT count(*) FROM verification_events")).scalar() == 1
    engine.dispose()
