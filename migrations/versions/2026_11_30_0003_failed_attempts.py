"""failed attempts counted apart from attempts; cluster status without a length limit

`attempt` numbers every start of a worker (it fences writes); `failed_attempts` counts only the
attempts that ended without a verdict by failing (crash, OOM, lost Job), which is what
`max_attempts` limits: a preempted or evicted worker is started again without spending one.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failed_attempts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.alter_column("cluster_status", type_=sa.Text(), existing_type=sa.String(length=64),
                              existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.alter_column("cluster_status", type_=sa.String(length=64), existing_type=sa.Text(),
                              existing_nullable=True)
        batch_op.drop_column("failed_attempts")
