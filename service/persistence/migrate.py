"""Run Alembic migrations programmatically (CLI `convgate db upgrade`, tests, the Helm hook)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config

REPO_ROOT = Path(__file__).resolve().parents[2]


def alembic_config(database_url: str) -> Config:
    ini = Path(os.environ.get("CONVGATE_ALEMBIC_INI", REPO_ROOT / "alembic.ini"))
    config = Config(str(ini))
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)
