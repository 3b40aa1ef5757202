"""attestations: one signed DSSE envelope per verdict, stored once and returned unchanged

A verdict's in-toto Statement is signed lazily, on the first request for it; the envelope is kept
here (one row per verification, unique) so every later request returns the identical bytes even
after the signing key rotates. Rows are append-only, like the verdicts they attest.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLE = "attestations"


def _append_only() -> None:
    """Same rule as the verdicts (revision 0001), on both databases."""
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
                   "FOR EACH ROW EXECUTE FUNCTION convgate_append_only()")
        return
    for action in ("UPDATE", "DELETE"):
        op.execute(f"CREATE TRIGGER {TABLE}_no_{action.lower()} BEFORE {action} ON {TABLE} "
                   f"BEGIN SELECT RAISE(ABORT, 'convgate: {TABLE} rows are immutable'); END")


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verification_id", sa.String(length=36), nullable=False),
        sa.Column("keyid", sa.String(length=64), nullable=False),
        sa.Column("envelope", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["verification_id"], ["verifications.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("verification_id", name="uq_attestations_verification"),
    )
    with op.batch_alter_table(TABLE, schema=None) as batch_op:
        batch_op.create_index("ix_attestations_keyid", ["keyid"], unique=False)
    _append_only()


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}")
    else:
        for action in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_{action}")
    op.drop_table(TABLE)
