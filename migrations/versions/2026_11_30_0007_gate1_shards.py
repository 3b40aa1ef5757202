"""gate 1 split over the pods of an Indexed Job: the shards' parts, and the worker function to file one

A verification of a large model may run gate 1 in N shards, one completion index of a Kubernetes
Indexed Job each. Every shard files its part (`gate1_shards`, one row per verification, attempt and
shard); the verdict is merged and written once, by whoever stores the last part, inside the
transaction that locks the verification. A restricted worker files its part as a report of kind
`shard-<k>` through `convgate_worker_record_shard`, which the control plane applies like any other.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

KINDS_BEFORE = "kind IN ('start', 'heartbeat', 'verdict', 'end')"
KINDS_AFTER = "kind IN ('start', 'heartbeat', 'verdict', 'end') OR kind LIKE 'shard-%'"
SUBMIT_ARGUMENTS = "text, integer, text, text, text, jsonb"
RECORD_SHARD = ("convgate_worker_record_shard", "text, integer, text, text, integer, jsonb")


def _schema() -> str:
    bind = op.get_bind()
    return bind.dialect.identifier_preparer.quote(bind.execute(sa.text("SELECT current_schema()")).scalar_one())


def _submit(s: str, *, shards: bool) -> str:
    """revision 0006's `convgate_worker_submit`, with (shards) the `shard-<k>` kinds allowed, as large as a verdict."""
    kinds = ("(p_kind IN ('start', 'heartbeat', 'verdict', 'end') OR p_kind ~ '^shard-[0-9]{1,4}$')" if shards
             else "p_kind IN ('start', 'heartbeat', 'verdict', 'end')")
    limits = ("(CASE WHEN p_kind = 'verdict' OR p_kind LIKE 'shard-%' THEN 67108864 WHEN p_kind = 'heartbeat' "
              "THEN 8192 ELSE 65536 END)" if shards
              else "(CASE p_kind WHEN 'verdict' THEN 67108864 WHEN 'heartbeat' THEN 8192 ELSE 65536 END)")
    definer = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
    return f"""
CREATE OR REPLACE FUNCTION {s}.convgate_worker_submit(p_id text, p_attempt integer, p_secret text, p_worker text,
                                                      p_kind text, p_payload jsonb)
RETURNS boolean LANGUAGE plpgsql {definer} AS $$
DECLARE
    live boolean;
BEGIN
    SELECT v.state IN ('dispatched', 'running') INTO live
      FROM {s}.convgate_worker_authenticated(p_id, p_attempt, p_secret) v;
    IF live IS NOT TRUE OR NOT {kinds}
       OR coalesce(length(p_worker), 0) NOT BETWEEN 1 AND 200
       OR octet_length(p_payload::text) > {limits} THEN
        RETURN false;
    END IF;
    IF p_kind = 'heartbeat' THEN  -- the newest heartbeat replaces the last; a refused one stays refused
        IF EXISTS (SELECT 1 FROM {s}.worker_reports r WHERE r.verification_id = p_id AND r.attempt = p_attempt
                   AND r.worker = p_worker AND r.kind IN ('start', 'heartbeat') AND r.outcome = 'refused') THEN
            RETURN false;
        END IF;
        INSERT INTO {s}.worker_reports AS r (verification_id, attempt, kind, worker, payload, reported_at)
        VALUES (p_id, p_attempt, p_kind, p_worker, p_payload::json, now())
        ON CONFLICT ON CONSTRAINT uq_worker_reports_one_per_kind DO UPDATE
            SET payload = EXCLUDED.payload, reported_at = EXCLUDED.reported_at, applied_at = NULL, outcome = NULL;
        RETURN true;
    END IF;
    INSERT INTO {s}.worker_reports (verification_id, attempt, kind, worker, payload, reported_at)
    VALUES (p_id, p_attempt, p_kind, p_worker, p_payload::json, now())
    ON CONFLICT ON CONSTRAINT uq_worker_reports_one_per_kind DO NOTHING;
    RETURN FOUND;
END $$"""


def _record_shard(s: str) -> str:
    definer = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
    return f"""
CREATE FUNCTION {s}.convgate_worker_record_shard(p_id text, p_attempt integer, p_secret text, p_worker text,
                                                 p_shard integer, p_report jsonb)
RETURNS boolean LANGUAGE sql {definer} AS $$
    SELECT p_shard BETWEEN 0 AND 9999 AND {s}.convgate_worker_submit(p_id, p_attempt, p_secret, p_worker,
                                                                    'shard-' || p_shard, p_report)
$$"""


def upgrade() -> None:
    op.create_table(
        "gate1_shards",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verification_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("shards", sa.Integer(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["verification_id"], ["verifications.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("verification_id", "attempt", "shard", name="uq_gate1_shards_one_per_shard"),
    )
    with op.batch_alter_table("worker_reports", schema=None) as batch_op:
        batch_op.drop_constraint("ck_worker_reports_kind", type_="check")
        batch_op.create_check_constraint("ck_worker_reports_kind", KINDS_AFTER)
    if op.get_bind().dialect.name != "postgresql":
        return
    schema = _schema()
    op.execute(_submit(schema, shards=True))
    op.execute(_record_shard(schema))
    name, arguments = RECORD_SHARD
    op.execute(f"REVOKE ALL ON FUNCTION {schema}.{name}({arguments}) FROM PUBLIC")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        schema = _schema()
        name, arguments = RECORD_SHARD
        op.execute(f"DROP FUNCTION IF EXISTS {schema}.{name}({arguments})")
        op.execute(_submit(schema, shards=False))
    op.execute(sa.text("DELETE FROM worker_reports WHERE kind LIKE 'shard-%'"))
    with op.batch_alter_table("worker_reports", schema=None) as batch_op:
        batch_op.drop_constraint("ck_worker_reports_kind", type_="check")
        batch_op.create_check_constraint("ck_worker_reports_kind", KINDS_BEFORE)
    op.drop_table("gate1_shards")
