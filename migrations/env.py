"""Alembic environment: the same migrations run on Postgres (production) and SQLite (embedded)."""

from __future__ import annotations

import os

from alembic import context

from service.persistence.db import make_engine
from service.persistence.models import Base

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("CONVGATE_DATABASE_URL")
    if not url:
        raise RuntimeError("set CONVGATE_DATABASE_URL (or pass database_url) to run migrations")
    return url


def run_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True, compare_type=True,
                      render_as_batch=database_url().startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        engine = make_engine(database_url())
        with engine.connect() as connection:
            _run(connection)
        engine.dispose()
    else:
        _run(connection)


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
