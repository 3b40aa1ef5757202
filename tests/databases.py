"""Dropping a test's throwaway Postgres database, whoever is still connected to it.

Why: `DROP DATABASE ... WITH (FORCE)` terminates the other sessions, and Postgres lets a role terminate only
sessions of roles it is a member of. A worker pod of a cluster torn down mid-run (the MultiKueue scenario's
worker cluster going away) can still hold a session as its restricted login, which the test role created but
is not a member of: the drop then failed the test's teardown. The test role created those logins (CREATEROLE),
so it may grant itself their membership first."""

from __future__ import annotations

import psycopg
from psycopg import sql


def drop_database(admin_url: str, name: str) -> None:
    """Drop `name`, first joining every role that has a session in it (where the admin role may)."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        connected = admin.execute("SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = %s "
                                  "AND usename IS NOT NULL AND usename <> current_user", (name,)).fetchall()
        for (role,) in connected:
            try:
                admin.execute(sql.SQL("GRANT {} TO current_user").format(sql.Identifier(role)))
            except psycopg.Error:  # not the admin's to grant (another owner's role): the drop says so below
                continue
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
