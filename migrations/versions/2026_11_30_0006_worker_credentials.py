"""per-attempt worker credentials: the attempt secret's digest, the worker outbox, the worker functions

A Kubernetes worker parses hostile files, so it gets a database login (role `convgate_worker`, see
`service/persistence/worker_role.py`) with no table privileges at all: it may only EXECUTE the
SECURITY DEFINER functions below. Each one authenticates the caller by the secret the dispatcher
issued for exactly this (verification, attempt) - only its sha256, bound to the id and attempt
number, is stored in `verifications.attempt_secret_sha256`, and every claim replaces it - and only
while that verification is dispatched or running. What it may then do is insert a report into
`worker_reports` (start, heartbeat, verdict, end); the control plane applies each report through
the repository, so the lifecycle's guards live in one place (the functions never touch a
verification's state).

This revision creates no roles: CREATE ROLE needs CREATEROLE, which on Postgres up to 15 lets a role
grant itself almost anything, and the migration runs as the application's owner, the same login the
API pods use. Creating the roles and granting EXECUTE is `convgate db grant-worker` (an admin
creates the roles; the owner grants). The owner needs no more than it already has: it owns the
tables and CREATEs functions in its own schema. The functions are owned by it (the table owner),
pin `search_path` to `pg_catalog, pg_temp` and name every table with its schema, and EXECUTE is
revoked from PUBLIC.

SQLite (the embedded default) gets the column and the table; its workers use the direct path.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# (name, argument types): the internal helpers first; only the last five are ever granted
FUNCTIONS = (
    ("convgate_worker_authenticated", "text, integer, text"),
    ("convgate_worker_submit", "text, integer, text, text, text, jsonb"),
    ("convgate_worker_start", "text, integer, text, text"),
    ("convgate_worker_heartbeat", "text, integer, text, text, jsonb"),
    ("convgate_worker_record_verdict", "text, integer, text, text, jsonb"),
    ("convgate_worker_end", "text, integer, text, text, text, boolean"),
    ("convgate_worker_outcome", "text, integer, text, text, text"),
)

# A report larger than this is refused by the function (a worker cannot fill the database).
PAYLOAD_LIMITS = "(CASE p_kind WHEN 'verdict' THEN 67108864 WHEN 'heartbeat' THEN 8192 ELSE 65536 END)"


def _definitions(s: str) -> list[str]:
    """The functions, for schema `s` (quoted). `convgate_worker_authenticated` is the one place the
    secret is checked; `convgate_worker_submit` the one place a report is written."""
    definer = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
    return [f"""
CREATE FUNCTION {s}.convgate_worker_authenticated(p_id text, p_attempt integer, p_secret text)
RETURNS SETOF {s}.verifications LANGUAGE sql STABLE {definer} AS $$
    SELECT v.* FROM {s}.verifications v
    WHERE v.id = p_id AND p_attempt > 0 AND length(p_secret) >= 32
      AND v.attempt_secret_sha256 = encode(sha256(convert_to(
              p_id || ':' || p_attempt::text || ':' || p_secret, 'UTF8')), 'hex')
$$""", f"""
CREATE FUNCTION {s}.convgate_worker_submit(p_id text, p_attempt integer, p_secret text, p_worker text,
                                           p_kind text, p_payload jsonb)
RETURNS boolean LANGUAGE plpgsql {definer} AS $$
DECLARE
    live boolean;
BEGIN
    SELECT v.state IN ('dispatched', 'running') INTO live
      FROM {s}.convgate_worker_authenticated(p_id, p_attempt, p_secret) v;
    IF live IS NOT TRUE OR p_kind NOT IN ('start', 'heartbeat', 'verdict', 'end')
       OR coalesce(length(p_worker), 0) NOT BETWEEN 1 AND 200
       OR octet_length(p_payload::text) > {PAYLOAD_LIMITS} THEN
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
END $$""", f"""
CREATE FUNCTION {s}.convgate_worker_start(p_id text, p_attempt integer, p_secret text, p_worker text)
RETURNS jsonb LANGUAGE plpgsql {definer} AS $$
DECLARE
    v {s}.verifications;
BEGIN
    PERFORM {s}.convgate_worker_submit(p_id, p_attempt, p_secret, p_worker, 'start', '{{}}'::jsonb);
    SELECT * INTO v FROM {s}.convgate_worker_authenticated(p_id, p_attempt, p_secret);
    IF v.id IS NULL OR v.state NOT IN ('dispatched', 'running') THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('request', v.request::jsonb, 'policy', v.policy::jsonb, 'start',
        (SELECT r.outcome FROM {s}.worker_reports r WHERE r.verification_id = p_id AND r.attempt = p_attempt
           AND r.kind = 'start' AND r.worker = p_worker));
END $$""", f"""
CREATE FUNCTION {s}.convgate_worker_heartbeat(p_id text, p_attempt integer, p_secret text, p_worker text,
                                              p_progress jsonb)
RETURNS boolean LANGUAGE sql {definer} AS $$
    SELECT {s}.convgate_worker_submit(p_id, p_attempt, p_secret, p_worker, 'heartbeat',
                                      jsonb_build_object('progress', p_progress))
$$""", f"""
CREATE FUNCTION {s}.convgate_worker_record_verdict(p_id text, p_attempt integer, p_secret text, p_worker text,
                                                   p_report jsonb)
RETURNS boolean LANGUAGE sql {definer} AS $$
    SELECT {s}.convgate_worker_submit(p_id, p_attempt, p_secret, p_worker, 'verdict',
                                      jsonb_build_object('report', p_report))
$$""", f"""
CREATE FUNCTION {s}.convgate_worker_end(p_id text, p_attempt integer, p_secret text, p_worker text,
                                        p_reason text, p_give_up boolean)
RETURNS boolean LANGUAGE sql {definer} AS $$
    SELECT {s}.convgate_worker_submit(p_id, p_attempt, p_secret, p_worker, 'end',
                                      jsonb_build_object('reason', left(p_reason, 4000), 'give_up', p_give_up))
$$""", f"""
CREATE FUNCTION {s}.convgate_worker_outcome(p_id text, p_attempt integer, p_secret text, p_worker text,
                                            p_kind text)
RETURNS text LANGUAGE sql STABLE {definer} AS $$
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM {s}.convgate_worker_authenticated(p_id, p_attempt, p_secret))
                THEN NULL
                ELSE coalesce((SELECT coalesce(r.outcome, 'pending') FROM {s}.worker_reports r
                               WHERE r.verification_id = p_id AND r.attempt = p_attempt AND r.kind = p_kind
                                 AND r.worker = p_worker), 'missing') END
$$"""]


def _schema() -> str:
    bind = op.get_bind()
    return bind.dialect.identifier_preparer.quote(bind.execute(sa.text("SELECT current_schema()")).scalar_one())


def upgrade() -> None:
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt_secret_sha256", sa.String(length=64), nullable=True))
    op.create_table(
        "worker_reports",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("verification_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.CheckConstraint("kind IN ('start', 'heartbeat', 'verdict', 'end')", name="ck_worker_reports_kind"),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(["verification_id"], ["verifications.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("verification_id", "attempt", "kind", "worker", name="uq_worker_reports_one_per_kind"),
    )
    with op.batch_alter_table("worker_reports", schema=None) as batch_op:
        batch_op.create_index("ix_worker_reports_pending", ["applied_at", "id"], unique=False)
    if op.get_bind().dialect.name != "postgresql":
        return
    schema = _schema()
    for definition in _definitions(schema):
        op.execute(definition)
    for name, arguments in FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {schema}.{name}({arguments}) FROM PUBLIC")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        schema = _schema()
        for name, arguments in reversed(FUNCTIONS):
            op.execute(f"DROP FUNCTION IF EXISTS {schema}.{name}({arguments})")
    with op.batch_alter_table("worker_reports", schema=None) as batch_op:
        batch_op.drop_index("ix_worker_reports_pending")
    op.drop_table("worker_reports")
    with op.batch_alter_table("verifications", schema=None) as batch_op:
        batch_op.drop_column("attempt_secret_sha256")
