"""A throwaway restricted worker login for one test: created and granted as `convgate db grant-worker`
does, then revoked and dropped, so each test's roles never outlive it (roles are cluster-wide)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import text

from service.persistence.db import make_engine
from service.persistence.worker_role import WORKER_FUNCTIONS, WorkerLogin, create_worker_login, grant_worker
from tests.service.conftest import PG_ADMIN


@contextmanager
def restricted_worker_login(owner_url: str, prefix: str) -> Iterator[tuple[WorkerLogin, str]]:
    """The worker's login and its group, in the database `owner_url` names."""
    suffix = uuid.uuid4().hex[:8]
    group, login = f"{prefix}{suffix}", f"{prefix}{suffix}_login"
    made = create_worker_login(owner_url.rsplit("/", 1)[0] + "/postgres", owner_url, group, login)
    grant_worker(owner_url, group)
    try:
        yield made, group
    finally:
        owner = make_engine(owner_url)
        with owner.begin() as connection:
            for name, arguments in WORKER_FUNCTIONS:
                connection.execute(text(f"REVOKE EXECUTE ON FUNCTION {name}({arguments}) FROM {group}"))
            connection.execute(text(f"REVOKE USAGE ON SCHEMA public FROM {group}"))
        owner.dispose()
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {login}")
            admin.execute(f"DROP ROLE IF EXISTS {group}")
