"""access log, policy origin and the policy-author role

`access_log` records who (token name and role) read which verification, report, events or list
query, when and by which path; it is append-only like the events (triggers refuse UPDATE and
DELETE). `verifications.policy_origin` says whether the thresholds came from a policy the operator
configured (`configured:<name>`) or were sent inline (`inline`); rows written before this revision
are `unrecorded`, which no auditor filter mistakes for configured. Tokens may have the role
`policy-author` (a submitter allowed to send inline policies).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ROLES_BEFORE = "role IN ('submitter', 'operator', 'auditor', 'admin')"
ROLES_AFTER = "role IN ('submitter', 'policy-author', 'operator', 'auditor', 'admin')"


def _append_only(table: str) -> None:
    """Same rule as the events table (revision 0001), on both databases."""
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                   "FOR EACH ROW EXECUTE FUNCTION convgate_append_only()")
        return
    for action in ("UPDATE", "DELETE"):
        op.execute(f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                   f"BEGIN SELECT RAISE(ABORT, 'convgate: {table} rows are immutable'); END")


def _role_check(expression: str) -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint("ck_api_tokens_role", type_="check")
        batch_op.create_check_constraint("ck_api_tokens_role", expression)


def upgrade() -> None:
    op.create_table(
        "access_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("principal", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("verification_id", sa.String(length=36), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("query", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("access_log", schema=None) as batch_op:
        batch_op.create_index("ix_access_log_verification", ["verification_id", "id"], unique=False)
        batch_op.create_index("ix_access_log_principal", ["principal", "id"], unique=False)
        batch_op.create_index("ix_access_log_at", ["at"], unique=False)
    _append_only("access_log")
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.add_column(sa.Column("policy_origin", sa.String(length=80), nullable=False,
                                      server_default="unrecorded"))
        batch_op.create_index("ix_verifications_policy_origin", ["policy_origin"], unique=False)
    _role_check(ROLES_AFTER)


def downgrade() -> None:
    op.execute("UPDATE api_tokens SET role = 'submitter' WHERE role = 'policy-author'")  # keeps the least
    _role_check(ROLES_BEFORE)
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.drop_index("ix_verifications_policy_origin")
        batch_op.drop_column("policy_origin")
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS access_log_append_only ON access_log")
    else:
        for action in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS access_log_no_{action}")
    op.drop_table("access_log")
