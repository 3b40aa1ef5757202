"""lifecycle fences: typed reasons beside the free-text messages

Every transition is a conditional UPDATE fenced by state, attempt and worker (service/lifecycle.py);
those columns exist already. What operators read becomes typed: `reason_code` (a lifecycle.Reason)
on the verification and on each event, beside the free-text `reason` / `message`.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLES = ("verifications", "verification_events")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("reason_code", sa.String(length=32), nullable=True))


def downgrade() -> None:
    # a plain ALTER TABLE on both databases: SQLite's batch mode would copy the table and lose the
    # append-only triggers of verification_events
    for table in reversed(TABLES):
        op.execute(f"ALTER TABLE {table} DROP COLUMN reason_code")
