"""access log and policy origin (placeholder)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op  # noqa: F401

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Filled in by the change that owns this revision."""


def downgrade() -> None:
    """Filled in by the change that owns this revision."""
