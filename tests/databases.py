"""Dropping a test's throwaway Postgres database, whoever is still connected to it.

Why one helper: `DROP DATABASE ... WITH (FORCE)` terminates the other sessions, and Postgres lets a role
terminate a session only of a role it is a member of, or with pg_signal_backend. A worker pod of a cluster
torn down mid-run (the MultiKueue scenario's worker cluster going away) can still hold a session as its
restricted login after that login was dropped, which no membership can reach: the test role gets
pg_signal_backend from `dev.py` (ensure_postgres), and every test drops its database here."""

from __future__ import annotations

import psycopg
from psycopg import sql


def drop_database(admin_url: str, name: str) -> None:
    """Drop `name`, ending every session still in it (the admin role holds pg_signal_backend)."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
