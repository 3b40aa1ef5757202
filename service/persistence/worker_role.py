"""The worker's database login on Postgres: a NOLOGIN group role that may EXECUTE the worker
functions of migration 0006 and nothing else, and a login role in it whose URL goes into the
worker's Secret (`convgate db grant-worker`).

Two credentials, on purpose. Creating roles needs CREATEROLE (on Postgres up to 15 nearly a
superuser), so it is done once by an administrator's URL and never held by the service. Granting
EXECUTE on the functions needs their owner, the service's own login (the migration's). Both steps
are idempotent; run the grant again after an upgrade that replaces a function."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from engine.errors import ConvgateError
from service.persistence.db import make_engine

# The functions a worker may call (the helpers they share are never granted).
WORKER_FUNCTIONS = (
    ("convgate_worker_start", "text, integer, text, text"),
    ("convgate_worker_heartbeat", "text, integer, text, text, jsonb"),
    ("convgate_worker_record_verdict", "text, integer, text, text, jsonb"),
    ("convgate_worker_end", "text, integer, text, text, text, boolean"),
    ("convgate_worker_outcome", "text, integer, text, text, text"),
    ("convgate_worker_record_shard", "text, integer, text, text, integer, jsonb"),  # revision 0007
)
ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class WorkerRoleError(ConvgateError, RuntimeError):
    """The worker role cannot be set up as asked, or holds more than it should."""

    code = "database.worker_role_unusable"


@dataclass(frozen=True, slots=True)
class WorkerLogin:
    login: str
    password: str
    url: str  # the service's URL with this login: what the worker Secret holds


def _role(name: str) -> str:
    if not ROLE_NAME.fullmatch(name):
        raise WorkerRoleError(f"role name {name!r} must match {ROLE_NAME.pattern}")
    return name


def create_worker_login(admin_url: str, service_url: str, group: str, login: str) -> WorkerLogin:
    """Create (or re-key) the group and the login as an administrator; returns the worker's URL."""
    group, login = _role(group), _role(login)
    password = secrets.token_urlsafe(32)  # [A-Za-z0-9_-] only: safe inside the quoted literal below
    engine = make_engine(admin_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"""DO $$ BEGIN
                IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{group}') THEN
                    CREATE ROLE {group} NOLOGIN NOINHERIT; END IF;
                IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{login}') THEN
                    CREATE ROLE {login} LOGIN INHERIT PASSWORD '{password}';
                ELSE ALTER ROLE {login} LOGIN PASSWORD '{password}'; END IF;
            END $$"""))
            connection.execute(text(f"GRANT {group} TO {login}"))
    finally:
        engine.dispose()
    url = make_url(service_url).set(username=login, password=password)
    return WorkerLogin(login, password, url.render_as_string(hide_password=False))


def grant_worker(service_url: str, group: str) -> None:
    """As the functions' owner: EXECUTE on the worker functions for `group`, then check that the group
    can reach the schema and holds no privilege on any table."""
    group = _role(group)
    engine = make_engine(service_url)
    try:
        with engine.begin() as connection:
            grant(connection, group)
            check_least_privilege(connection, group)
    finally:
        engine.dispose()


def grant(connection: Connection, group: str) -> None:
    schema = connection.execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    for name, arguments in WORKER_FUNCTIONS:
        connection.execute(text(f"GRANT EXECUTE ON FUNCTION {schema}.{name}({arguments}) TO {_role(group)}"))
    if not connection.execute(text("SELECT has_schema_privilege(:g, current_schema(), 'USAGE')"),
                              {"g": group}).scalar_one():
        connection.execute(text(f"GRANT USAGE ON SCHEMA {schema} TO {group}"))


def check_least_privilege(connection: Connection, group: str) -> None:
    """Raise if `group` may read or write any table or sequence of the schema, or call any other function
    that runs with its owner's rights."""
    tables = connection.execute(text("""
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
          AND (has_table_privilege(:g, c.oid, 'SELECT') OR has_table_privilege(:g, c.oid, 'INSERT')
               OR has_table_privilege(:g, c.oid, 'UPDATE') OR has_table_privilege(:g, c.oid, 'DELETE'))"""),
                                {"g": group}).scalars().all()
    allowed = {name for name, _ in WORKER_FUNCTIONS}
    definers = connection.execute(text("""
        SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema() AND p.prosecdef AND has_function_privilege(:g, p.oid, 'EXECUTE')"""),
                                  {"g": group}).scalars().all()
    extra = sorted(set(definers) - allowed)
    if tables or extra:
        raise WorkerRoleError(f"role {group} holds more than the worker functions: tables {sorted(tables)}, "
                              f"functions {extra}")
