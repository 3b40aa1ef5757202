"""verdict reuse and completion callbacks

`verifications.reuse_key` is the sha256 of everything a verdict depends on when every input is pinned
by content (an hf:// source at a commit, the artifact by sha256, no unpinned release files), the policy
hash and the workers that would run it; NULL when something is not pinned. `reused_from` names the
verification whose run produced a verdict that was returned without a Job.

`callback_url` is where the verification's summary is POSTed on a terminal state (the full URL, since
it is needed to deliver; the API shows it redacted); `callback_state` is NULL (no callback), pending,
delivered or failed, and `callback_due_at` when the next delivery attempt may run (also the lease of
a delivery in flight). `callback_secrets` holds each submitter's HMAC key (in plain text: the service
must sign with it). `callback_deliveries` records every attempt, append-only like the events.

Nothing here is granted to the restricted worker role of revision 0006: workers neither read nor write
these, and new tables get no privileges by default.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

DELIVERIES = "callback_deliveries"


def _append_only(table: str) -> None:
    """Same rule as the events (revision 0001), on both databases."""
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                   "FOR EACH ROW EXECUTE FUNCTION convgate_append_only()")
        return
    for action in ("UPDATE", "DELETE"):
        op.execute(f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                   f"BEGIN SELECT RAISE(ABORT, 'convgate: {table} rows are immutable'); END")


def upgrade() -> None:
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reuse_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("reused_from", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("callback_url", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("callback_state", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("callback_due_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_verifications_reuse_key", ["reuse_key"], unique=False)
        batch_op.create_index("ix_verifications_callback_state", ["callback_state"], unique=False)
    op.create_table(
        "callback_secrets",
        sa.Column("submitter", sa.String(length=128), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("submitter"),
    )
    op.create_table(
        DELIVERIES,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verification_id", sa.String(length=36), nullable=False),
        sa.Column("delivery_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("next_retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["verification_id"], ["verifications.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("verification_id", "attempt", name="uq_callback_deliveries_attempt"),
    )
    _append_only(DELIVERIES)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS {DELIVERIES}_append_only ON {DELIVERIES}")
    else:
        for action in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {DELIVERIES}_no_{action}")
    op.drop_table(DELIVERIES)
    op.drop_table("callback_secrets")
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.drop_index("ix_verifications_callback_state")
        batch_op.drop_index("ix_verifications_reuse_key")
        for column in ("callback_due_at", "callback_state", "callback_url", "reused_from", "reuse_key"):
            batch_op.drop_column(column)
