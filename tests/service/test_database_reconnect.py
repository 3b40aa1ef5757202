"""Connections the database closed while they sat idle in the API's pools (a restart, a failover, an
administrator's pg_terminate_backend) are never handed to a request: each is found closed at checkout
and replaced, so no request answers 503 for a connection that died while nobody used it. A real
Postgres ends the real server's real backends here; nothing is faked."""

from __future__ import annotations

import os

import httpx
import psycopg
from sqlalchemy import make_url

from service.auth import Role
from tests.service.conftest import PG_ADMIN, add_token, settings_for, start_server

ROUTES = ("/v1/verifications?limit=5", "/v1/queue", "/v1/verifications/00000000-0000-0000-0000-000000000000")


def _end_every_session_of(url: str) -> int:
    """Terminate every backend connected to `url`'s database (the server's pools'), as a restart does, and
    wait until each has exited (pg_terminate_backend only signals it unless given a timeout): a connection
    taken while its backend is still going away is the race any check at checkout has, not what is tested."""
    name = make_url(url).database
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        ended = admin.execute("SELECT count(*) FROM (SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()) AS ended", (name,)).fetchone()
    return ended[0] if ended else 0


def _submission(digit: str, sha: str) -> dict[str, str]:
    return {"source_uri": "hf://org/src@" + digit * 40, "artifact_uri": "hf://org/m@" + digit * 40 + "/m.gguf",
            "artifact_sha256": sha * 64}


def test_connections_the_database_ended_while_idle_are_replaced_not_answered_with_503(pg, tmp_path):
    admin = add_token(pg, Role.ADMIN)
    for server in start_server(settings_for(pg, tmp_path)):
        with httpx.Client(base_url=server.url, headers=server.headers(admin), timeout=30) as client:
            submitted = client.post("/v1/verifications", json=_submission("0", "e"))
            assert submitted.status_code == 202, submitted.text
            for route in ROUTES:  # both pools (the event loop's and the threads') hold connections now
                assert client.get(route).status_code in (200, 404)
            assert _end_every_session_of(pg) >= 2
            answers = [client.get(route).status_code for route in ROUTES for _ in range(3)]
            answers.append(client.post("/v1/verifications", json=_submission("1", "f")).status_code)
        assert 503 not in answers, answers
        assert answers[-1] == 202


def test_a_connection_whose_descriptor_is_past_1024_is_taken_from_the_pool_not_refused(pg, tmp_path):
    """A server holding many sockets (slow clients, open streams) opens its database connections on
    descriptors past select()'s limit of 1024: the check at checkout must still see them as alive."""
    admin = add_token(pg, Role.ADMIN)
    taken = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the pools' connections come after these
    try:
        for server in start_server(settings_for(pg, tmp_path)):
            with httpx.Client(base_url=server.url, headers=server.headers(admin), timeout=30) as client:
                answers = [client.get(route).status_code for route in ROUTES for _ in range(2)]
            assert 503 not in answers, answers
    finally:
        for descriptor in taken:
            os.close(descriptor)
