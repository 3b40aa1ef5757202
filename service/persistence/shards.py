"""Gate 1 split over an Indexed Job's pods: store each shard's part, and write the verdict exactly once.

Every shard of the current attempt files its part here (directly, or through the control plane
applying a restricted worker's `shard-<k>` report). The verification's row is locked first (SELECT
... FOR UPDATE on Postgres; SQLite serialises writers), so of two shards finishing together exactly
one sees every part stored: that one merges the parts (`engine.verification.merge_shards`, the code a
single worker runs) and records the verdict through `repository.record_verdict`, fenced like any
verdict. A part filed again (a retried pod of the same index) changes nothing.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.errors import ConvgateError
from engine.gates.storage.parts import MergeError, StoragePart
from engine.policy import Policy
from engine.report import Report
from engine.verification import merge_shards
from service.lifecycle import State
from service.persistence import repository
from service.persistence.clock import now
from service.persistence.models import Gate1Shard, Verification


class ShardRefusedError(ConvgateError, ValueError):
    """A part that does not belong to the verification's current attempt or to its shard count."""

    code = "shard.refused"


class ShardsDoNotMergeError(ShardRefusedError):
    """Every part arrived and they do not make one gate-1 result: no retry of one index can mend that."""

    code = "shard.parts_do_not_merge"


def _locked(session: Session, verification_id: str) -> Verification | None:
    query = select(Verification).where(Verification.id == verification_id)
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        query = query.with_for_update()
    return session.scalars(query).first()


def _check(verification: Verification | None, attempt: int, worker: str, shard: int, shards: int) -> None:
    if verification is None or verification.state != State.RUNNING or verification.attempt != attempt:
        raise ShardRefusedError("not the running attempt")
    if verification.worker != worker:
        raise ShardRefusedError("not this attempt's worker")
    expected = int((verification.request or {}).get("shards", 1))
    if shards != expected or not 0 <= shard < shards:
        raise ShardRefusedError(f"shard {shard} of {shards} does not fit a verification of {expected} shards")


def _parse(payload: dict[str, Any], shard: int) -> tuple[StoragePart, Report | None]:
    """The part, and shard 0's report of the other gates; anything else is refused (workers are untrusted)."""
    try:
        part = StoragePart.model_validate(payload.get("part"))
        head = Report.model_validate(payload["report"]) if shard == 0 else None
    except (ValidationError, KeyError) as exc:
        raise ShardRefusedError(f"not a shard part: {exc}") from exc
    if part.shard != shard:
        raise ShardRefusedError(f"part of shard {part.shard} filed as shard {shard}")
    return part, head


def record_shard(session: Session, verification_id: str, attempt: int, worker: str, shard: int, shards: int,
                 payload: dict[str, Any]) -> bool:
    """Store one shard's part; the shard that completes the set merges and writes the verdict. True when
    the part is stored (or was already); raises `ShardRefusedError` for a stale or malformed one."""
    verification = _locked(session, verification_id)
    _check(verification, attempt, worker, shard, shards)
    assert verification is not None  # _check refused otherwise
    _parse(payload, shard)
    stored = session.scalars(select(Gate1Shard).where(Gate1Shard.verification_id == verification_id,
                                                      Gate1Shard.attempt == attempt)).all()
    if any(row.shard == shard for row in stored):
        return True
    session.add(Gate1Shard(verification_id=verification_id, attempt=attempt, shard=shard, shards=shards,
                           payload=payload, created_at=now(session)))
    session.flush()
    if len(stored) + 1 < shards:
        return True
    return _merge_and_record(session, verification, attempt, worker)


def _merge_and_record(session: Session, verification: Verification, attempt: int, worker: str) -> bool:
    rows = session.scalars(select(Gate1Shard).where(Gate1Shard.verification_id == verification.id,
                                                    Gate1Shard.attempt == attempt).order_by(Gate1Shard.shard)).all()
    parsed = [_parse(row.payload, row.shard) for row in rows]
    head = parsed[0][1]
    assert head is not None  # shard 0's report, checked by _parse
    try:
        report = merge_shards(head, [part for part, _ in parsed], Policy(**verification.policy))
    except MergeError as exc:
        raise ShardsDoNotMergeError(f"the parts do not merge: {exc}") from exc
    return repository.record_verdict(session, verification.id, attempt, report.model_dump(mode="json"),
                                     worker=worker)
