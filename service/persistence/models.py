"""Tables. Constraints that matter live in the database: one verdict per verification (unique),
one idempotency key per submitter (unique), verdicts and their evidence immutable (triggers, in
the migration)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# 64-bit ids on Postgres; SQLite only autoincrements INTEGER PRIMARY KEY.
BIG_ID = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar = {dict[str, Any]: JSON, list[Any]: JSON}


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Verification(Base):
    __tablename__ = "verifications"
    __table_args__ = (
        UniqueConstraint("submitted_by", "idempotency_key", name="uq_verifications_idempotency"),
        Index("ix_verifications_created", "created_at", "id"),
        Index("ix_verifications_state_created", "state", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    submitted_by: Mapped[str] = mapped_column(String(128))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_sha256: Mapped[str] = mapped_column(String(64))
    source_uri: Mapped[str] = mapped_column(Text, index=True)
    artifact_uri: Mapped[str] = mapped_column(Text)
    artifact_sha256: Mapped[str] = mapped_column(String(64), index=True)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    policy_sha256: Mapped[str] = mapped_column(String(64))
    # "configured:<name>" or "inline" (revision 0005; older rows "unrecorded")
    policy_origin: Mapped[str] = mapped_column(String(80), server_default="unrecorded", index=True)
    state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # every worker start; fences writes
    failed_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # what max_attempts limits
    max_attempts: Mapped[int] = mapped_column(Integer)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text)
    reason_code: Mapped[str | None] = mapped_column(String(32))  # a lifecycle.Reason (revision 0004)
    worker: Mapped[str | None] = mapped_column(String(200))
    cluster_status: Mapped[str | None] = mapped_column(Text)
    queue_position: Mapped[int | None] = mapped_column(Integer)
    verdict_result: Mapped[str | None] = mapped_column(String(8), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # sha256 of the current claim's per-attempt worker secret (revision 0006); never the secret itself
    attempt_secret_sha256: Mapped[str | None] = mapped_column(String(64))
    # revision 0009: what a verdict depends on when every input is pinned (service/reuse.py), the run a
    # reused verdict came from, and the completion callback (the full URL; pending/delivered/failed)
    reuse_key: Mapped[str | None] = mapped_column(String(64), index=True)
    reused_from: Mapped[str | None] = mapped_column(String(36))
    callback_url: Mapped[str | None] = mapped_column(Text)
    callback_state: Mapped[str | None] = mapped_column(String(16), index=True)
    callback_due_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class VerificationEvent(Base):
    __tablename__ = "verification_events"

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verification_id: Mapped[str] = mapped_column(ForeignKey("verifications.id"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text)
    reason_code: Mapped[str | None] = mapped_column(String(32))  # a lifecycle.Reason (revision 0004)


class Verdict(Base):
    __tablename__ = "verdicts"

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verification_id: Mapped[str] = mapped_column(ForeignKey("verifications.id"), unique=True)
    attempt: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(8))
    blocker_codes: Mapped[list[Any]] = mapped_column(JSON)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class GateResultRow(Base):
    __tablename__ = "gate_results"

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verdict_id: Mapped[int] = mapped_column(ForeignKey("verdicts.id"), index=True)
    gate: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    seconds: Mapped[float] = mapped_column(Float)


class TensorRowRecord(Base):
    __tablename__ = "tensor_rows"

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verdict_id: Mapped[int] = mapped_column(ForeignKey("verdicts.id"), index=True)
    gguf_name: Mapped[str] = mapped_column(String(128))
    gguf_type: Mapped[str] = mapped_column(String(16))
    check_kind: Mapped[str] = mapped_column(String(16))
    max_abs: Mapped[float] = mapped_column(Float)
    rel_l2: Mapped[float] = mapped_column(Float)
    result: Mapped[str] = mapped_column(String(8))


class FileDigestRecord(Base):
    __tablename__ = "file_digests"

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verdict_id: Mapped[int] = mapped_column(ForeignKey("verdicts.id"), index=True)
    uri: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size: Mapped[int] = mapped_column(BigInteger)


class AccessLogRecord(Base):
    """Who read what (revision 0005): append-only, like the events."""

    __tablename__ = "access_log"
    __table_args__ = (
        Index("ix_access_log_verification", "verification_id", "id"),
        Index("ix_access_log_principal", "principal", "id"),
        Index("ix_access_log_at", "at"),
    )

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    principal: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(32))
    verification_id: Mapped[str | None] = mapped_column(String(36))
    path: Mapped[str] = mapped_column(Text)
    query: Mapped[dict[str, Any]] = mapped_column(JSON)


class WorkerReport(Base):
    """What a restricted worker reported through the SQL functions of revision 0006 (an outbox): the
    control plane applies each one through the repository, which alone decides what it may change."""

    __tablename__ = "worker_reports"
    __table_args__ = (
        UniqueConstraint("verification_id", "attempt", "kind", "worker", name="uq_worker_reports_one_per_kind"),
        Index("ix_worker_reports_pending", "applied_at", "id"),
    )

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verification_id: Mapped[str] = mapped_column(ForeignKey("verifications.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # start, heartbeat, verdict, end, shard-<k> (revision 0007)
    worker: Mapped[str] = mapped_column(String(200))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    reported_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    applied_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(String(16))  # accepted, refused, invalid


class Gate1Shard(Base):
    """One shard's part of gate 1 (revision 0007): what one pod of an Indexed Job found for its share of
    the tensors, and (shard 0) the report of every other gate. The verdict is merged from all of them."""

    __tablename__ = "gate1_shards"
    __table_args__ = (UniqueConstraint("verification_id", "attempt", "shard", name="uq_gate1_shards_one_per_shard"),)

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verification_id: Mapped[str] = mapped_column(ForeignKey("verifications.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    shard: Mapped[int] = mapped_column(Integer)
    shards: Mapped[int] = mapped_column(Integer)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Attestation(Base):
    """A verdict's signed DSSE envelope (revision 0008): written once, on first request, then returned as is."""

    __tablename__ = "attestations"
    __table_args__ = (UniqueConstraint("verification_id", name="uq_attestations_verification"),
                      Index("ix_attestations_keyid", "keyid"))

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verification_id: Mapped[str] = mapped_column(ForeignKey("verifications.id"))
    keyid: Mapped[str] = mapped_column(String(64))
    envelope: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CallbackSecret(Base):
    """A submitter's HMAC key for completion callbacks (revision 0009). Kept in plain text, unlike API
    tokens: the service signs with it. Shown once, when made; making another replaces it."""

    __tablename__ = "callback_secrets"

    submitter: Mapped[str] = mapped_column(String(128), primary_key=True)
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CallbackDelivery(Base):
    """One attempt to deliver a verification's completion callback (revision 0009): append-only."""

    __tablename__ = "callback_deliveries"
    __table_args__ = (UniqueConstraint("verification_id", "attempt", name="uq_callback_deliveries_attempt"),)

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    verification_id: Mapped[str] = mapped_column(ForeignKey("verifications.id"))
    delivery_id: Mapped[str] = mapped_column(String(36))
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    next_retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
