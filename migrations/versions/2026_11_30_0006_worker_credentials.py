"""per-attempt worker credentials (placeholder)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op  # noqa: F401

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Filled in by the change that owns this revision."""


def downgrade() -> None:
    """Filled in by the change that owns this revision."""
