"""initial schema: tokens, verifications, events, verdicts and their evidence

Verdicts, gate results, tensor rows, file digests and events are append-only: triggers refuse
UPDATE and DELETE on both Postgres and SQLite, so "one immutable verdict" is the database's rule.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 09:21:12.981201
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


APPEND_ONLY = ("verdicts", "gate_results", "tensor_rows", "file_digests", "verification_events")


def create_append_only_triggers() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("""
            CREATE FUNCTION convgate_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'convgate: % rows are immutable', TG_TABLE_NAME
                    USING ERRCODE = 'integrity_constraint_violation';
            END $$""")
        for table in APPEND_ONLY:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION convgate_append_only()"
            )
        return
    for table in APPEND_ONLY:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'convgate: {table} rows are immutable'); END"
            )


def drop_append_only_triggers() -> None:
    if op.get_context().dialect.name == "postgresql":
        for table in APPEND_ONLY:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        op.execute("DROP FUNCTION IF EXISTS convgate_append_only()")
        return
    for table in APPEND_ONLY:
        for action in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{action}")


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.CheckConstraint("role IN ('submitter', 'operator', 'auditor', 'admin')", name="ck_api_tokens_role"),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("token_sha256"),
    )
    op.create_table(
        "verifications",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("submitted_by", sa.String(length=128), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column("source_uri", sa.Text(), nullable=False),
        sa.Column("artifact_uri", sa.Text(), nullable=False),
        sa.Column("artifact_sha256", sa.String(length=64), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("policy_sha256", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.CheckConstraint(
            "state IN ('queued', 'dispatched', 'running', 'completed', 'failed', 'cancelled')",
            name="ck_verifications_state",
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("verdict_result", sa.String(length=8), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("submitted_by", "idempotency_key", name="uq_verifications_idempotency"),
    )
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_verifications_artifact_sha256"), ["artifact_sha256"], unique=False)
        batch_op.create_index("ix_verifications_created", ["created_at", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_verifications_source_uri"), ["source_uri"], unique=False)
        batch_op.create_index("ix_verifications_state_created", ["state", "created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_verifications_verdict_result"), ["verdict_result"], unique=False)

    op.create_table(
        "verdicts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verification_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(length=8), nullable=False),
        sa.CheckConstraint("verdict IN ('GO', 'NO-GO')", name="ck_verdicts_verdict"),
        sa.Column("blocker_codes", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["verification_id"],
            ["verifications.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("verification_id"),
    )
    op.create_table(
        "verification_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verification_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["verification_id"],
            ["verifications.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("verification_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_verification_events_verification_id"), ["verification_id"], unique=False)

    op.create_table(
        "file_digests",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verdict_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["verdict_id"],
            ["verdicts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("file_digests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_file_digests_sha256"), ["sha256"], unique=False)
        batch_op.create_index(batch_op.f("ix_file_digests_verdict_id"), ["verdict_id"], unique=False)

    op.create_table(
        "gate_results",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verdict_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("gate", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["verdict_id"],
            ["verdicts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("gate_results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gate_results_verdict_id"), ["verdict_id"], unique=False)

    op.create_table(
        "tensor_rows",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verdict_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("gguf_name", sa.String(length=128), nullable=False),
        sa.Column("gguf_type", sa.String(length=16), nullable=False),
        sa.Column("check_kind", sa.String(length=16), nullable=False),
        sa.Column("max_abs", sa.Float(), nullable=False),
        sa.Column("rel_l2", sa.Float(), nullable=False),
        sa.Column("result", sa.String(length=8), nullable=False),
        sa.ForeignKeyConstraint(
            ["verdict_id"],
            ["verdicts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tensor_rows", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tensor_rows_verdict_id"), ["verdict_id"], unique=False)

    create_append_only_triggers()


def downgrade() -> None:
    drop_append_only_triggers()
    with op.batch_alter_table("tensor_rows", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tensor_rows_verdict_id"))

    op.drop_table("tensor_rows")
    with op.batch_alter_table("gate_results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gate_results_verdict_id"))

    op.drop_table("gate_results")
    with op.batch_alter_table("file_digests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_file_digests_verdict_id"))
        batch_op.drop_index(batch_op.f("ix_file_digests_sha256"))

    op.drop_table("file_digests")
    with op.batch_alter_table("verification_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_verification_events_verification_id"))

    op.drop_table("verification_events")
    op.drop_table("verdicts")
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_verifications_verdict_result"))
        batch_op.drop_index("ix_verifications_state_created")
        batch_op.drop_index(batch_op.f("ix_verifications_source_uri"))
        batch_op.drop_index("ix_verifications_created")
        batch_op.drop_index(batch_op.f("ix_verifications_artifact_sha256"))

    op.drop_table("verifications")
    op.drop_table("api_tokens")
