"""A test's throwaway database is dropped even while a session outlives its role: what a worker pod of a
torn-down cluster leaves behind (the MultiKueue scenario's restricted login is dropped at its teardown while
the pod's session lives on, and the database drop then failed)."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.databases import drop_database
from tests.service.conftest import PG_ADMIN


def test_a_database_held_by_a_dropped_roles_session_is_dropped(pg_url: str) -> None:
    name, role = f"convgate_drop_{uuid.uuid4().hex[:8]}", f"convgate_drop_login_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'x'").format(sql.Identifier(role)))
    held = psycopg.connect(make_conninfo(PG_ADMIN, user=role, password="x", dbname=name))
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))  # its session lives on
        drop_database(PG_ADMIN, name)
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone() == (0,)
    finally:
        held.close()
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
