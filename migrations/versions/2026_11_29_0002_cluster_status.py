"""cluster status and queue position: what Kueue says about a verification's Job

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cluster_status", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("queue_position", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.drop_column("queue_position")
        batch_op.drop_column("cluster_status")
